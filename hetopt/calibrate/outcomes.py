"""Memory against real outcomes: runs that finished or ended out of memory, each priced by the
evaluator's fits / does-not-fit verdict (`hetopt calibrate --outcomes`).

Input: a CSV with the columns of ``data/calibration/public/hagemann_llama13b_runs.csv`` (one row per
run of a layout sweep, each with its ``status``: ``ok`` or ``OOM Error``). Every row becomes an
:class:`Outcome` with its instance and plan, or with the reason it cannot be expressed; no row is
dropped.

Assumptions, stated per sweep (Hagemann et al. 2023, arXiv:2311.05610, Aleph Alpha's training
code): AdamW with ZeRO-1 over the data-parallel ranks, bf16 mixed precision; 1F1B pipeline; the
model from the row (LLaMA: SwiGLU where ffn ≠ 4h, RMSNorm, rotary, untied, no biases); attention
as the ``attention_kernel`` column names it (`kernels_of`), RMSNorm eager unless it names the RMS
kernel;
``every_layer`` checkpointing is full recompute; sequence parallelism as the row says. Nodes of
``gpus_per_node`` GPUs with one 200 Gbit/s HDR NIC per GPU (a DGX A100). Global batch: 2²² tokens
per step, 2,048 sequences at 2,048 tokens and 512 at 8,192: the power of two under the row's
implied figure (2,193–2,232 and 543–560; the sheets' MFU counts ~7% more FLOPs per token than
hetopt does).

Headroom for a confidence (`headroom_table`): `--memory-headroom H` refuses a plan whose peak is
above its GPU's memory less H. For each H, the runs the evaluator then says fit; the confidence is
the share of them that really finished. The table gives the least H that reaches each confidence,
and what it costs: the runs that finished but are then refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from hetopt.calibrate.columns import OUTCOMES_CSV
from hetopt.cost.pricing import evaluate
from hetopt.csvfile import read_csv
from hetopt.errors import InputError, Problem
from hetopt.layout import Layout, expand_layout
from hetopt.plan import Plan
from hetopt.spec.instance import Instance, instance_from_spec
from hetopt.spec.load import validate_document
from hetopt.spec.schema import InstanceFile

GPU_NAMES = {"A100-SXM4-80GB": "A100-80GB", "A100-SXM4-40GB": "A100-40GB"}
NIC_GBPS_PER_GPU = 200.0
"""One HDR InfiniBand NIC of 200 Gbit/s per GPU, as in a DGX A100."""
CONFIDENCES = (0.5, 0.8, 0.9, 0.95, 0.99)
FRAMEWORK = "scaling"
"""The sweep ran on Aleph Alpha's training code (Scaling): cost/stacks.py's `scaling` stack."""


@dataclass
class Outcome:
    """One run: its layout, whether it ended out of memory, and the evaluator's verdict."""

    line: int
    group: str
    """Sweep and sequence length: the unit of grouped cross-validation."""
    kernel: str
    oom: bool
    step_s: float | None
    instance: Instance | None = None
    plan: Plan | None = None
    fits: bool | None = None
    peak_gib: float = math.nan
    """The highest stage's peak memory less its GPU's memory: > 0 where it does not fit."""
    over_gib: float = math.nan
    predicted_s: float | None = None
    reasons: list[str] = field(default_factory=list)

    @property
    def expressed(self) -> bool:
        return self.fits is not None


def _int(row: dict, key: str) -> int:
    """A count the reader checked already (calibrate/columns.OUTCOMES_CSV)."""
    return int(row[key])


def kernels_of(kernel: str) -> dict:
    """`training.attention` and `training.norm_kernel` of the sweep's `attention_kernel` column:
    FlashAttention 2 or v1, Megatron's fused softmax (``fused``), eager PyTorch (``torch``); the
    RMSNorm is fused where the column names its kernel (``+ RMS kernel``), else eager."""
    name = kernel.lower()
    if "flash" in name:
        attention = "flash1" if "v1" in name else "flash"
    else:
        attention = "torch" if "torch" in name else "standard"
    return {"attention": attention, "norm_kernel": "fused" if "rms" in name else "torch"}


TOKENS_PER_STEP = 2**22
"""4,194,304 tokens per step: 2,048 sequences of 2,048 tokens, 512 of 8,192."""


def _global_batch(seq_len: int) -> int:
    return max(1, TOKENS_PER_STEP // seq_len)


def outcome_from_row(row: dict, line: int, path: str = "outcomes.csv") -> Outcome:
    """One row, its cells checked by `read_outcomes` → an Outcome priced by the evaluator, or with
    the reason it cannot be."""
    where = f"{path}:{line}"
    status = (row.get("status") or "").strip()
    if status.lower() != "ok" and "oom" not in status.lower():
        problem = Problem("status", "must be ok, or name an out-of-memory end (OOM)", status, True)
        raise InputError(where, [problem])
    out = Outcome(
        line=line,
        group=f"{(row.get('sweep') or '').strip()} s={(row.get('seq_len') or '').strip()}",
        kernel=(row.get("attention_kernel") or "").strip(),
        oom=status.lower() != "ok",
        step_s=float(row["step_time_s"]) if row.get("step_time_s") else None,
    )
    gpu = GPU_NAMES.get((row.get("gpu") or "").strip())
    if gpu is None:
        out.reasons.append(f"GPU '{row.get('gpu')}' is not one hetopt maps")
        return out
    seq, gpus, gpn = (_int(row, k) for k in ("seq_len", "gpus", "gpus_per_node"))
    hidden, ffn = _int(row, "hidden"), _int(row, "ffn_hidden")
    if gpus % gpn:
        problem = Problem("gpus", f"must be a multiple of gpus_per_node ({gpn})", str(gpus), True)
        raise InputError(where, [problem])
    doc = {
        "name": f"outcome-line{line}",
        "model": {
            "layers": _int(row, "layers"),
            "hidden": hidden,
            "heads": _int(row, "heads"),
            "ffn_hidden": ffn,
            "vocab": _int(row, "vocab"),
            "max_seq_len": seq,
            "gated_mlp": ffn != 4 * hidden,
            "norm": "rmsnorm",
            "linear_bias": False,
            "position_embedding": "rotary",
            "tied_embeddings": False,
        },
        "training": {
            "seq_len": seq,
            "global_batch": _global_batch(seq),
            "precision": (row.get("precision") or "bf16").strip() or "bf16",
            "framework": FRAMEWORK,
            **kernels_of(out.kernel),
        },
        "cluster": {
            "nodes": [
                {
                    "name": "node",
                    "count": gpus // gpn,
                    "gpu": gpu,
                    "gpus_per_node": gpn,
                    "nic_gbps": NIC_GBPS_PER_GPU * gpn,
                }
            ]
        },
    }
    layout = Layout(
        tp=_int(row, "tp"),
        pp=_int(row, "pp"),
        dp=_int(row, "dp"),
        mb=_int(row, "micro_batch"),
        recompute="full" if "every" in (row.get("activation_checkpointing") or "") else "none",
        sp=(row.get("sequence_parallel") or "").strip().lower() == "true",
        zero=1,
    )
    try:
        spec = validate_document(doc, where, InstanceFile, "instance")
        out.instance = instance_from_spec(spec, where, Path("."))
        out.plan = expand_layout(out.instance, layout, source=where)
        ev = evaluate(out.instance, out.plan, source=where)
    except (InputError, ValueError) as exc:
        out.reasons.append(" ".join(str(exc).split())[:300])
        return out
    out.fits, out.predicted_s = ev.fits, ev.iteration_time_s
    out.peak_gib = max(ev.peak_memory_gib)
    out.over_gib = max(
        p - lim for p, lim in zip(ev.peak_memory_gib, ev.memory_limit_gib, strict=True)
    )
    return out


def read_outcomes(path: str | Path) -> list[Outcome]:
    """Every row of an outcomes CSV as an Outcome (priced, or with its reason)."""
    rows = read_csv(path, OUTCOMES_CSV)
    return [outcome_from_row(row, n, str(path)) for n, row in enumerate(rows, start=2)]


def headroom_table(outcomes: list[Outcome], confidences=CONFIDENCES) -> list[dict]:
    """For each confidence c: the least headroom H (GiB) such that, of the runs the evaluator says
    fit with H kept free (over_gib ≤ −H), a share ≥ c really finished; with the runs that finished
    yet are then refused. None where no H reaches c."""
    priced = [o for o in outcomes if o.expressed]
    # candidate headrooms: 0 and each run's slack, the points where a verdict changes
    slack = sorted({0.0} | {-o.over_gib for o in priced if o.over_gib < 0})
    rows = []
    for c in confidences:
        found = None
        for h in slack:
            said_fit = [o for o in priced if o.over_gib <= -h]
            if not said_fit:
                break
            share = sum(not o.oom for o in said_fit) / len(said_fit)
            if share >= c:
                refused = sum(not o.oom and o.over_gib > -h for o in priced)
                found = {
                    "confidence": c,
                    "headroom_gib": h,
                    "fit_share": share,
                    "said_fit": len(said_fit),
                    "finished_refused": refused,
                }
                break
        rows.append(found or {"confidence": c, "headroom_gib": None})
    return rows


def outcome_report(outcomes: list[Outcome]) -> dict:
    """Agreement of the fits verdict with the outcomes, missed out-of-memory runs (predicted to
    fit), false ones (finished, predicted not to), per group; step-time error on the runs that
    finished; and the headroom per confidence."""
    priced = [o for o in outcomes if o.expressed]

    def figures(sub: list[Outcome]) -> dict:
        agree = sum(o.fits != o.oom for o in sub)
        timed = [o for o in sub if not o.oom and o.step_s and o.predicted_s]
        errors = [o.predicted_s / o.step_s - 1 for o in timed]
        return {
            "runs": len(sub),
            "agreement": agree / len(sub) if sub else None,
            "missed_oom": sum(o.fits and o.oom for o in sub),
            "false_oom": sum(not o.fits and not o.oom for o in sub),
            "oom": sum(o.oom for o in sub),
            "step_mape": sum(abs(e) for e in errors) / len(errors) if errors else None,
            "step_bias": sum(errors) / len(errors) if errors else None,
            "timed": len(timed),
        }

    groups = sorted({o.group for o in priced})
    return {
        "rows": len(outcomes),
        "expressed": len(priced),
        "not_expressed": [{"line": o.line, "reason": o.reasons[0]} for o in outcomes if o.reasons],
        **figures(priced),
        "groups": {g: figures([o for o in priced if o.group == g]) for g in groups},
        "headroom": headroom_table(priced),
    }
