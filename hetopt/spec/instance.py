"""A validated, resolved instance: the model architecture, training settings, GPU types and
cluster."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, replace
from functools import cached_property
from importlib import resources
from pathlib import Path

from hetopt.errors import InputError, Problem, did_you_mean, format_path
from hetopt.spec.checks import NO_VALUE, check_instance
from hetopt.spec.cluster import Cluster
from hetopt.spec.formats import FORMAT, FORMATS, Format
from hetopt.spec.gpus import CATALOG, GPUType, custom_gpu
from hetopt.spec.load import line_for, parse_instance_file, read_document
from hetopt.spec.presets import PRESETS, ModelArch, apply_preset
from hetopt.spec.scenarios import (
    BandwidthScenario,
    Link,
    generated_scenarios,
    horizon_of,
    link_key,
    longest_trace_s,
    nominal_gbps,
    scenarios_of,
)
from hetopt.spec.schema import InstanceFile, ModelSection

DEMO_INSTANCE = "demo-a100-v100-llama7b"


@dataclass(frozen=True)
class Instance:
    spec: InstanceFile
    """The file as validated, keys as the user wrote them."""
    model: ModelArch
    """The architecture after applying the preset and the explicit overrides."""
    seq_len: int
    gpu_types: dict[str, GPUType]
    """Every GPU type the cluster uses (catalog or custom)."""
    path: Path | None = None
    network: tuple[tuple[Link, float], ...] = ()
    """Island links at other Gbit/s than the file's (`on_network`: a bandwidth scenario); () — the
    file's own."""
    rent: str = "used"
    """Which nodes a plan pays for (hetopt.cost.dollars): `used` — those it places ranks on; `all`
    — every node the file lists (`with_rent`)."""
    stack_memory: object | None = None
    """A memory layout for the training stack other than the shipped one (cost/stacks.py's
    StackMemory, as a fit tries them); None — the shipped layout of `training.framework`."""

    @property
    def name(self) -> str:
        return self.spec.name

    @cached_property
    def precision(self) -> str:
        """The training format (spec/formats.py), its default resolved: the one its GPU types are
        priced in (instance_from_spec)."""
        return next(iter(self.gpu_types.values())).format or "bf16"

    @cached_property
    def format(self) -> Format:
        """What the training format stores and computes at."""
        return FORMAT[self.precision]

    @property
    def global_batch(self) -> int:
        return self.spec.training.global_batch

    def micro_batches(self, micro_batch: int, replicas: int = 1) -> int | None:
        """The micro-batches each of `replicas` data-parallel pipelines takes per iteration, where
        micro-batches of `micro_batch` sequences split the global batch evenly among them; None
        where they do not (the one rule every planner and layout keeps)."""
        per_step = micro_batch * replicas
        return None if self.global_batch % per_step else self.global_batch // per_step

    @cached_property
    def cluster(self) -> Cluster:
        """The device graph, its island links at `network`'s bandwidths where it sets them."""
        return Cluster.from_spec(self.spec.cluster, self.gpu_types, dict(self.network))

    def on_network(self, gbps: dict[Link, float]) -> Instance:
        """The same instance with island links at other bandwidths (the rest as they were).

        Parameters: gbps — (island a, island b) → Gbit/s, either order of the pair.
        Returns: an Instance whose cluster carries those bandwidths; its file, and so the
        fingerprint a plan records, is unchanged (a plan stays a plan of the same hardware)."""
        levels = {**dict(self.network), **{link_key(k): float(v) for k, v in gbps.items()}}
        return replace(self, network=tuple(sorted(levels.items())))

    # -- its bandwidth scenarios (hetopt.spec.scenarios)
    # -----------------------------------------------

    @property
    def horizon_s(self) -> float:
        """The scenario horizon H: `search.horizon_s`, else DEFAULT_HORIZON_S."""
        return horizon_of(self.spec)

    @property
    def nominal_gbps(self) -> dict[Link, float]:
        """Each island link's Gbit/s as the file declares it."""
        return nominal_gbps(self.spec)

    def scenarios(self, horizon_s: float | None = None) -> list[BandwidthScenario]:
        """Every scenario (one `stable` when the file has none), generated up to `horizon_s`
        (default H); measured traces are read relative to the instance file's folder."""
        horizon = self.horizon_s if horizon_s is None else horizon_s
        return scenarios_of(self.spec, horizon, self.path.parent if self.path else Path("."))

    @property
    def longest_trace_s(self) -> float:
        """The longest replay the generated traces allow (`scenarios.longest_trace_s`)."""
        return longest_trace_s(self.spec)

    @property
    def generated_scenarios(self) -> set[str]:
        """Names of the scenarios a generator makes as long as asked."""
        return generated_scenarios(self.spec)

    def fingerprint(self) -> dict[str, str]:
        """What a plan depends on, each part hashed: the model as resolved, the training settings
        and the cluster (nodes, GPU types, network). Scenarios and the search space are left out: a
        plan stays a plan of the same cluster under other scenarios. Returns: {part: 12 hex digits
        of its SHA-256}."""
        # custom GPU types included
        parts = {
            "model": asdict(self.model),
            "training": {**self.spec.training.model_dump(mode="json"), "seq_len": self.seq_len},
            "cluster": self.spec.cluster.model_dump(mode="json"),
        }
        return {
            part: hashlib.sha256(
                json.dumps(value, sort_keys=True, default=str).encode()
            ).hexdigest()[:12]
            for part, value in parts.items()
        }


RENTS = ("used", "all")


def with_rent(inst: Instance, rent: str | None) -> Instance:
    """The instance whose plans pay for the nodes `rent` says (RENTS; None: `used`).

    Raises: InputError (exit 2) for another value."""
    if rent is None or rent == inst.rent:
        return inst
    if rent not in RENTS:
        raise InputError(
            "--rent",
            [
                Problem(
                    "--rent", "give used (the nodes a plan uses) or all (every node)", rent, True
                )
            ],
        )
    return replace(inst, rent=rent)


def with_memory_headroom(inst: Instance, headroom: str | None) -> Instance:
    """The instance with `headroom` of every GPU's memory kept free: what the planner, the evaluator
    and the verifier may allocate is the usable memory less it (plans otherwise go up to the limit).

    Parameters: headroom — GiB ("2", "2GiB") or a share of each GPU's usable memory ("5%"); None:
    none.
    Returns: the instance (the same one without headroom). Raises: InputError (exit 2) for a value
    that is not a number ≥ 0, a share of 100% or more, or GiB that leave some GPU type nothing."""
    if headroom is None:
        return inst
    text = headroom.strip().removesuffix("GiB").strip()
    share = text.endswith("%")
    try:
        value = float(text.removesuffix("%"))
    except ValueError:
        value = math.nan

    def refuse(message: str) -> InputError:
        return InputError(
            "--memory-headroom", [Problem("--memory-headroom", message, headroom, True)]
        )

    if not (math.isfinite(value) and value >= 0) or (share and value >= 100):
        raise refuse(
            "give GiB (e.g. 2 or 2GiB) or a share of each GPU's memory below 100% (e.g. 5%)"
        )
    types = {}
    for name, gpu in inst.gpu_types.items():
        free = gpu.usable_memory_gib * value / 100 if share else value
        if free >= gpu.usable_memory_gib:
            raise refuse(f"leaves nothing of {name}'s {gpu.usable_memory_gib:g} GiB; give less")
        types[name] = replace(gpu, usable_memory_gib=gpu.usable_memory_gib - free)
    return replace(inst, gpu_types=types)


def resolve_model(section: ModelSection, seq_len: int | None) -> ModelArch:
    """Apply explicit fields over the preset; fill defaults (ffn = 4h, GPT-style) for custom
    models."""
    preset = PRESETS[section.preset] if section.preset is not None else None
    values = apply_preset(preset, section.model_dump(exclude={"preset"}))
    if preset is not None:
        changed = any(values[k] != getattr(preset, k) for k in values if k != "name")
        values["name"] = f"{preset.name} (modified)" if changed else preset.name
        return ModelArch(**values)
    defaults = {
        "name": "custom",
        "ffn_hidden": 4 * values["hidden"],
        "gated_mlp": False,
        "max_seq_len": seq_len,
        "source": "instance file",
    }
    return ModelArch(**{**defaults, **values})


def instance_from_spec(
    spec: InstanceFile,
    source: str,
    base_dir: Path,
    lines: dict | None = None,
    path: Path | None = None,
) -> Instance:
    findings = check_instance(spec, base_dir)
    if findings:
        lines = lines or {}
        raise InputError(
            source,
            [
                Problem(
                    format_path(loc),
                    message,
                    value=None if value is NO_VALUE else value,
                    has_value=value is not NO_VALUE,
                    line=line_for(loc, lines),
                )
                for loc, message, value in findings
            ],
        )
    model = resolve_model(spec.model, spec.training.seq_len)
    seq_len = spec.training.seq_len or model.max_seq_len
    used = {g.gpu for g in spec.cluster.nodes}
    gpu_types = {name: CATALOG[name] for name in used if name in CATALOG}
    for name, g in spec.cluster.gpus.items():
        gpu_types[name] = custom_gpu(
            name,
            g.peak_tflops,
            g.memory_gib,
            g.hbm_gbps,
            g.intra_node_gbps,
            source=f"declared in {source} (cluster.gpus.{name})",
            family=g.family,
            tdp_w=g.tdp_w,
            peaks={
                "fp32": g.peak_tflops_fp32,
                "tf32": g.peak_tflops_tf32,
                "fp8": g.peak_tflops_fp8,
            },
        )
    fmt = training_format(spec, gpu_types, source, lines or {})
    gpu_types = {name: g.for_format(fmt) for name, g in gpu_types.items()}
    return Instance(spec=spec, model=model, seq_len=seq_len, gpu_types=gpu_types, path=path)


def training_format(spec: InstanceFile, gpu_types: dict[str, GPUType], source: str, lines: dict):
    """`training.precision`, or its default: bf16, or fp16 where a GPU of the cluster has no BF16.
    A format some GPU of the cluster lacks is bad input naming the GPU and the formats it has."""
    fmt = spec.training.precision
    reduce = spec.training.grad_reduce_dtype
    if fmt in ("fp32", "tf32") and reduce in ("bf16", "fp16"):
        raise InputError(
            source,
            [
                Problem(
                    "training.grad_reduce_dtype",
                    f"a {fmt} run keeps fp32 gradients and reduces them in fp32; give fp32 or "
                    "leave it out",
                    reduce,
                    True,
                    line=line_for(("training", "grad_reduce_dtype"), lines),
                )
            ],
        )
    if fmt is None:
        return "bf16" if all(g.has("bf16") for g in gpu_types.values()) else "fp16"
    lacking = sorted(name for name, g in gpu_types.items() if not g.has(fmt))
    if not lacking:
        return fmt
    name = lacking[0]
    gpu = gpu_types[name]
    has = ", ".join(f for f in FORMATS if gpu.has(f))
    declared = name in spec.cluster.gpus
    if fmt == "fp8" and "fp8" in gpu.peaks:  # its FP8 peak is there, BF16 (for the rest) is not
        why, fix = "no BF16 for what fp8 keeps in bf16", f"choose one of {has}"
    else:
        why = f"no {fmt.upper()}"
        fix = (
            f"declare cluster.gpus.{name}.peak_tflops_{fmt}"
            if declared and fmt in ("fp32", "tf32", "fp8")
            else f"choose one of {has}, or leave these GPUs out"
        )
    others = f" (so do {', '.join(lacking[1:])})" if len(lacking) > 1 else ""
    raise InputError(
        source,
        [
            Problem(
                "training.precision",
                f"{name} has {why}{others}: it trains in {has}; {fix}",
                fmt,
                True,
                line=line_for(("training", "precision"), lines),
            )
        ],
    )


def load_instance(where: str | Path) -> Instance:
    """Load an instance from a file path, or by the name of a bundled instance."""
    path = resolve_instance_path(where)
    data, lines = read_document(path)
    spec = parse_instance_file(data, str(where), lines)
    return instance_from_spec(spec, str(where), path.parent, lines, path)


def bundled_instances() -> dict[str, Path]:
    """Bundled instance files by name (the file stem)."""
    found = {}
    root = resources.files("hetopt.bundled")  # instances/, shipped inside hetopt
    for entry in root.iterdir():
        if entry.name.endswith((".yaml", ".yml", ".json")):
            found[Path(entry.name).stem] = Path(str(entry))
    return dict(sorted(found.items()))


def resolve_instance_path(where: str | Path | None) -> Path:
    """A path as given, or a bundled instance by name; no argument means the demo instance."""
    if where is None or str(where) == "demo":
        return bundled_instances()[DEMO_INSTANCE]
    path = Path(where)
    if path.exists():
        return path
    bundled = bundled_instances()
    if str(where) in bundled:
        return bundled[str(where)]
    hint = did_you_mean(path.stem, bundled)
    raise InputError(
        str(where),
        [
            Problem(
                "",
                f"file does not exist (looked for {path.resolve()}) and no bundled instance has "
                f"that name{hint}; give the path of a YAML or JSON instance file, or a name from "
                "`hetopt instances`",
            )
        ],
    )


def describe(path: Path) -> str:
    """One line about a bundled instance: its `description`, else its first header comment."""
    text = path.read_text(encoding="utf-8")
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("description:"):
            return stripped.split(":", 1)[1].strip().strip("'\"")
    for line in text.splitlines():
        if line.startswith("#"):
            return line.lstrip("#").strip()
    return ""
