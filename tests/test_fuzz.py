"""Fuzz: valid instances and plan files mutated at random never give a traceback (issue 13).

Each example mutates a valid document (a key removed or misspelt, a value replaced by one a user or
a broken script could write) and runs the command line in this process, as `hetopt.cli.main` runs
it: the exit code must be 0, 1 or 2 — never 3, hetopt's own fault — and a refusal (2) must name the
file. In process, not in a subprocess each (0.7 s of start-up apiece), so CI runs 2,000 mutations in
seconds."""

from __future__ import annotations

import copy
import json
import math
import resource
import tempfile
from pathlib import Path

import pytest
import yaml
from conftest import REPO, document_nodes, run_in_process
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

INSTANCES = [
    REPO / "instances" / "demo-a100-v100-llama7b.yaml",
    REPO / "tests" / "small" / "s3-two-islands.yaml",
    REPO / "instances" / "two-dc-wan-diurnal.yaml",
    REPO / "tests" / "small" / "s9-interleaved.yaml",
]
PLAN_INSTANCE = "demo-a100-v100-llama7b"
NASTY = [
    0,
    -1,
    1,
    3,
    2**31,
    10**12,
    1.5,
    -0.0,
    1e308,
    math.nan,
    math.inf,
    -math.inf,
    "",
    "x",
    "A100-80GB",
    "none",
    "interleaved",
    None,
    True,
    [],
    {},
    [0],
    {"a": 1},
    [1, 2, 3],
]
"""Values a hand edit or a broken generator writes: zero, negative, huge, fractional, not a number,
wrong types, empty containers, and names valid elsewhere in the format."""
MUTATIONS = int(__import__("os").environ.get("FUZZ_N", 2000))
"""The issue's floor for one CI run (each of the two tests below runs half)."""


def _mutate(doc, data) -> object:
    """Apply 1–3 random edits to a copy of `doc`, each drawn from hypothesis's `data`."""
    doc = copy.deepcopy(doc)
    for _ in range(data.draw(st.integers(1, 3))):
        paths = [p for p, _ in document_nodes(doc) if p]
        if not paths:
            break
        path = paths[data.draw(st.integers(0, len(paths) - 1))]
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        last = path[-1]
        op = data.draw(st.sampled_from(["replace", "delete", "rename"]))
        if op == "replace":
            parent[last] = copy.deepcopy(data.draw(st.sampled_from(NASTY)))  # NASTY stays as it is
        elif op == "delete":
            del parent[last]
        elif isinstance(parent, dict):
            parent[str(last)[:-1] + "z"] = parent.pop(last)
    return doc


def _check(code: int, message: str, path: Path) -> None:
    assert code in (0, 1, 2), (code, message)
    assert "Traceback" not in message, message
    if code == 2:
        assert f"error: {path}" in message, message


@pytest.fixture(autouse=True)
def _memory_cap():
    """Address space capped at what the process has plus 4 GiB while fuzzing: an input that makes
    hetopt allocate without end is a MemoryError, hence exit 3 and a failing example, not the OOM
    killer ending the whole CI run (a plan with 10**12 replicas once did, in the placement
    check)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as fh:
        size = int(fh.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (size + 4 * 2**30, hard))
    yield
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


FUZZ = settings(
    max_examples=MUTATIONS // 2,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@FUZZ
@given(st.data())
def test_a_mutated_instance_is_valid_or_refused_with_its_file_named(data):
    source = INSTANCES[data.draw(st.integers(0, len(INSTANCES) - 1))]
    doc = _mutate(yaml.safe_load(source.read_text()), data)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mutated.yaml"
        path.write_text(yaml.safe_dump(doc))  # nan and inf as YAML writes them (.nan, .inf)
        code, message = run_in_process(["validate", str(path)])
        _check(code, message, path)


def _plan() -> dict:
    from hetopt.layout import expand_layout, parse_layout
    from hetopt.plan import PlannedFor, plan_json
    from hetopt.spec.instance import load_instance

    inst = load_instance(PLAN_INSTANCE)  # the plan records its instance, as `solve --out` writes it
    plan = expand_layout(inst, parse_layout("tp=2,pp=2,dp=8"))
    return plan_json(
        plan.model_copy(update={"instance": PlannedFor(name=inst.name, **inst.fingerprint())})
    )


PLAN = _plan()


@FUZZ
@given(st.data())
def test_a_mutated_plan_file_is_evaluated_or_refused_with_its_file_named(data):
    doc = _mutate(PLAN, data)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan.json"
        path.write_text(json.dumps(doc, allow_nan=True))
        code, message = run_in_process(["evaluate", PLAN_INSTANCE, "--plan", str(path)])
        _check(code, message, path)
