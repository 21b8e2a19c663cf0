"""The search space's own rules (hetopt/search/space.py) and honest labels for plans outside it."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

from conftest import run_hetopt

from hetopt.search.space import SearchOptions, SearchStats, enumerate_groups, outside_space
from hetopt.spec.instance import load_instance

SMALL = Path(__file__).parent / "small"
NARROW = "search: {tp: [1], micro_batch: [1], recompute: [full], max_stages: 1, max_classes: 1, max_templates: 1}"


def test_every_skeleton_plan_lies_inside_its_space():
    inst = load_instance(SMALL / "s4-three-types.yaml")
    opts = SearchOptions.from_instance(inst)
    groups = list(enumerate_groups(inst, opts, SearchStats()))
    rng = random.Random(5)
    for group in rng.sample(groups, 40):
        for sk in itertools.islice(group.skeletons(), 3):
            layers = [1] * sk.depth
            layers[0] += inst.model.layers - sum(layers)
            assert outside_space(inst, sk.plan(layers), opts) == []


def _narrow(tmp_path) -> Path:
    text = (SMALL / "s2-a100-v100.yaml").read_text()
    path = tmp_path / "s2-narrow.yaml"
    path.write_text("\n".join(line for line in text.splitlines() if not line.startswith("search:")) + "\n" + NARROW
                    + "\n")
    return path


def test_a_kept_warm_start_outside_the_space_says_so(tmp_path):
    """Regression (issue 11): a heuristic plan kept as the answer was labelled plain 'optimal'."""
    path = _narrow(tmp_path)
    result = run_hetopt("solve", str(path), "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    warm = out["warm_start"]
    assert warm["kept"] is True
    assert any("templates" in why for why in warm["outside_space"])  # amp-like's plan: 2 templates
    table = run_hetopt("solve", str(path))
    assert "outside the searched space" in table.stdout.replace("\n", " ")


def test_bench_marks_a_kept_warm_start_outside_the_space(tmp_path):
    from hetopt.bench import markdown, run_bench

    inst = load_instance(_narrow(tmp_path))
    text = markdown(run_bench([inst], ["hetopt"], time_limit_s=20, iterations=1))
    assert "warm-start plan outside the searched space" in text
