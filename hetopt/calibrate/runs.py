"""End-to-end training runs: published configurations and throughputs → hetopt instances, plans and
measured iteration times; predicted vs measured, per GPU type and per source; leave-one-source-out.

Input: a CSV with the columns of ``data/calibration/public/training_throughput_non_a100.csv`` (one
row per published run, each with its source). Every row becomes a :class:`Run`: either *expressed*
(an instance, a layout expanded to a plan, a measured iteration time, a prediction) or *not
expressed* with the reasons why. No row is dropped silently: ``len(expressed) + len(not expressed)
== rows``.

Measured iteration time, in this order:
- ``iteration_time_s`` when the row gives it;
- else from ``tokens_per_s_per_gpu``: tokens per iteration = global_batch_seqs · seq_len, divided by
  (tokens/s/GPU × GPUs);
- else from ``achieved_tflops_per_gpu`` with the row's own ``flops_formula`` — only the BigScience
  formula
  ``model_size_B*4*2*seq*GBS/(time*gpus*1e3)`` is recognised (time = N_B·4·2·s·GBS /
  (TFLOPs·GPUs·1e3)); any other formula, or none, makes the row not expressible (the formula's FLOPs
  per token are not ours).

GPU names → catalog (`hetopt gpus`):
- ``H100`` with the form factor unstated, on 8-GPU NVLink nodes (MosaicML's llm-foundry tables) →
  H100-SXM
  (only the SXM part comes in 8-GPU NVLink/NVSwitch nodes); ``H100-SXM`` → H100-SXM. torchtitan's
  2024 runs used H100 SXM *96 GB HBM2e at 500 W*: a custom type ``H100-96GB-500W`` of the hopper
  family (H100-SXM's peak, bandwidths and NVLink 4; 96 GB; 500 W), whose efficiency the family's
  power rule derives; said per row.
- ``V100`` SXM2 32GB → V100-32GB; ``H200`` → H200; ``A100-SXM`` / A100 80GB → A100-80GB.
- ``MI250X``: the catalog's MI250X is the whole package (two GCDs: 383 TFLOP/s, 128 GB). The rows
  count one
  GCD as a GPU, so such a row would declare a custom GPU ``MI250X-GCD`` with half of every package
  figure (191.5 TFLOP/s, 64 GiB, 1638.4 GB/s, half the package's xGMI bandwidth). The MI250X rows in
  the data are partial (no TP/PP/batch), so none is expressed today.

Model from the row's dims (n_layers, hidden, ffn_hidden, n_heads, n_kv_heads, vocab);
``max_seq_len`` = seq_len. Families by the model name:
- MPT (llm-foundry): GPT-style two-matrix MLP (ffn = 4h), LayerNorm, no linear biases, tied
  embeddings,
  ALiBi. The schema's ``position_embedding`` knows learned | rotary; ALiBi, like rotary, has no
  position parameters, so MPT is given ``rotary`` (its bias add in the scores is not priced; neither
  is RoPE's).
- LLaMA-like (Llama, Nemotron): RMSNorm, no biases, rotary, untied; gated (SwiGLU) MLP when
  ffn_hidden ≠ 4·hidden.
- otherwise GPT (BigScience GPT-2-style, GPT-3): LayerNorm, biases, learned positions, tied
  embeddings.
  An empty vocab on a GPT-2-style row is the GPT-2 tokenizer's 50257; an empty ffn_hidden on a GPT
  row is 4·hidden (tr8-104B: "ffn_hidden not restated"). Both said per row.

Cluster: num_nodes nodes × gpus_per_node, one island, NIC bandwidth per node from
``inter_node_fabric``: "N Gbps per node" → N; "N Gb/s per GPU" → N × gpus_per_node (torchtitan,
Meta, WhiteFiber: 400 Gbit/s per GPU → 3200 per 8-GPU node); "IB NDR" on DGX H100 → 8 × 400 Gbit/s;
Intel Omni-Path on Jean Zay → 4 × 100 Gbit/s = 400 per node (bigscience experiments/bandwidth
README: "supposed to be 400Gbps max"); HPE Slingshot-11 → 4 × 200 Gbit/s. Unstated on H100 8-GPU
nodes (llm-foundry) → 8 × 400 Gbit/s, the HGX H100 reference design (one 400G NIC per GPU); said per
row. A single-node run never uses the NIC.

Layout from the row: tp, pp, dp (cp > 1 is not expressed yet, though the layout shorthand has a cp
key: the public rows with CP all train in fp8 or lack their sequence length); mb = micro_batch;
global batch = global_batch_seqs, or micro_batch × dp when the row leaves it empty and states no
gradient accumulation (torchtitan's "local batch" per data-parallel rank; said per row);
micro-batches per replica = global batch / (mb · dp) — the printed grad_accum column is not used
(one BigScience row notes it disagrees with GBS, and the measured time belongs to GBS). Schedule:
"VP=k" → interleaved with vp = k (k > 1); otherwise 1F1B, Megatron-LM 2021's "GPipe-style PP" too
(its non-interleaved schedule is 1F1B, and only 1F1B holds those runs in their 32 GB).
"Interleaved 1F1B" without k is not expressible. Recompute: True / yes / full → full;
selective → selective (torchtitan's per-op SAC is priced as Megatron's selective recompute); False /
empty → none. Sequence parallelism: on with TP > 1 in Megatron-Core (NeMo, Megatron-Bridge) and
torchtitan (its TP plan shards norms over the sequence); off in Megatron-LM 2021 and
Megatron-DeepSpeed (it predates sequence parallelism). ZeRO from ``sharding``: FSDP FULL_SHARD,
FSDP2 (torchtitan's default reshard-after-forward) and Megatron-FSDP → 3; FSDP SHARD_GRAD_OP → 2;
ZeRO-1 → 1; DDP → 0; empty → 1 for NeMo (its distributed optimizer is on by default), 1 for
Megatron-DeepSpeed rows whose notes name ZeRO-1, else 0. A plan the evaluator rejects is not
expressed, with the evaluator's message as the reason. Attention: flash for llm-foundry, torchtitan,
NeMo/Megatron-Bridge and Meta; standard for Megatron-LM 2021 and Megatron-DeepSpeed on V100 (no
FlashAttention on Volta). Precision: fp8, fp16 or bf16 as the row says; every fp8 (Transformer
Engine, torchao Float8, amp_fp8, current or delayed scaling, tensorwise or rowwise) is priced as
`training.precision: fp8`. torch.compile and AsyncTP are expressible; hetopt does not model their
fusion / overlap (said per row).

Framework (`training.framework`, cost/stacks.py): fsdp for llm-foundry (Composer on PyTorch FSDP)
and torchtitan; megatron for the Megatron family (Megatron-LM, Megatron-DeepSpeed, NeMo,
Megatron-Bridge) and every other row.

Leave-one-source-out (`loso`, `fit_report`): sources are the repository or paper of the ``source``
column (`source_key`). Parameters fitted on end-to-end rows (an optional `fit` callback: expressed
training rows → Profiles) are fitted without the held-out source and then predict it. The one
parameter hetopt fits on end-to-end rows is the compute efficiency of each non-Megatron stack
(`stack_fit`); every GPU and fabric parameter comes from GEMM/layer/collective measurements fitted
elsewhere. A stack with no rows outside the held-out source is priced at 1 (as Megatron) in that
fold: nothing of the held-out source leaks in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from hetopt.calibrate.columns import RUNS_CSV
from hetopt.calibrate.rows import (
    CP,
    EVALUATOR,
    GPU,
    INTRA_FABRIC,
    LAYOUT,
    NO_MEASURE,
    PARTIAL,
    SCHEDULE,
    framework_kind,
    framework_of,
    int_of,
    map_gpu,
    measured_time,
    model_section,
    nic_fabric,
    nic_gbps,
    recompute_of,
    source_key,
    zero_of,
)
from hetopt.csvfile import read_csv
from hetopt.errors import InputError
from hetopt.layout import Layout
from hetopt.plan import Plan
from hetopt.spec.instance import Instance, instance_from_spec
from hetopt.spec.load import validate_document
from hetopt.spec.schema import InstanceFile

LOSO_TARGET = 0.15
"""Issue 10 acceptance: leave-one-source-out MAPE ≤ 15% for every GPU type with ≥ 10 end-to-end
rows."""
LOSO_MIN_ROWS = 10


@dataclass
class Run:
    """One CSV row: expressed (instance + layout + measured time) or not, with reasons."""

    path: str
    line: int
    """Line in the CSV (the header is line 1)."""
    gpu_row: str
    gpu: str
    """Catalog (or declared) GPU type; empty when unmapped."""
    source: str
    """Grouping key: repository or paper (`source_key`)."""
    source_text: str
    framework: str
    model: str
    precision: str
    measured_s: float | None = None
    measured_from: str = ""
    notes: list[str] = field(default_factory=list)
    """Assumptions made for this row."""
    reasons: list[str] = field(default_factory=list)
    """Why the row cannot be expressed ("category: detail"); empty when expressed."""
    instance: Instance | None = None
    layout: Layout | None = None
    plan: Plan | None = None
    predicted_s: float | None = None
    breakdown: dict = field(default_factory=dict)
    fits: bool | None = None

    @property
    def expressed(self) -> bool:
        return not self.reasons and self.predicted_s is not None

    @property
    def reason_category(self) -> str:
        return self.reasons[0].split(":", 1)[0] if self.reasons else ""

    @property
    def label(self) -> str:
        return f"{self.path.rsplit('/', 1)[-1]}:{self.line}"

    @property
    def config(self) -> str:
        if self.layout is None:
            return ""
        lay = self.layout
        text = f"tp={lay.tp},pp={lay.pp},dp={lay.dp},mb={lay.mb}"
        if lay.vp > 1:
            text += f",vp={lay.vp}"
        text += f",rc={lay.recompute},zero={lay.zero}"
        if lay.schedule == "gpipe":
            text += ",gpipe"
        if self.instance is not None:
            text += f",gb={self.instance.global_batch},s={self.instance.seq_len}"
        return text

    @property
    def error(self) -> float | None:
        if self.predicted_s is None or not self.measured_s:
            return None
        return self.predicted_s / self.measured_s - 1


# -- sources
# ---------------------------------------------------------------------------------------------


# -- parsing helpers
# -------------------------------------------------------------------------------------


# -- rows → runs
# -----------------------------------------------------------------------------------------


def run_from_row(row: dict, line: int, path: str = "runs.csv") -> Run:
    """One CSV row → a Run with its instance and layout, or with the reasons it cannot be
    expressed."""
    gpu, gpu_notes, custom = map_gpu(row)
    run = Run(
        path=str(path),
        line=line,
        gpu_row=(row.get("gpu") or "").strip(),
        gpu=gpu,
        source=source_key(row.get("source") or ""),
        source_text=(row.get("source") or "").strip(),
        framework=(row.get("framework") or "").strip(),
        model=(row.get("model") or "").strip(),
        precision=(row.get("precision") or "").strip(),
        notes=list(gpu_notes),
    )
    shape = _row_shape(row, run)
    if run.reasons:
        run.reasons.sort(key=_priority)
        return run
    kind = framework_kind(run.framework)
    if kind == "torchtitan" and shape.pp and shape.pp > 1 and shape.mb != 1:
        # torchtitan's batch is per data-parallel rank; with pipeline parallelism it runs it in
        # micro-batches of pipeline_parallel_microbatch_size, 1 by default
        run.notes.append(
            f"torchtitan with PP: local batch {shape.mb} in micro-batches of 1 (its "
            "pipeline_parallel_microbatch_size default)"
        )
        shape.mb = 1
    run.layout = _row_layout(row, run, kind, shape)
    if run.layout is None:
        return run
    data = _row_instance(row, run, kind, shape, custom)
    if data is not None:
        where = f"{path}:{line}"
        try:
            spec = validate_document(data, where, InstanceFile, "instance")
            run.instance = instance_from_spec(spec, where, Path("."))
        except InputError as exc:
            run.reasons.append(f"{PARTIAL}: the row does not make a valid instance ({_short(exc)})")
    return run


@dataclass
class _Shape:
    """What a row states of its model, layout, GPUs and batch (each None where it does not)."""

    model: dict | None
    tp: int | None
    pp: int | None
    dp: int | None
    mb: int | None
    gpus: int | None
    nodes: int | None
    gpn: int | None
    seq: int | None
    gb: int | None


def _row_shape(row: dict, run: Run) -> _Shape:
    """The row's model, layout, GPU counts, batch and measured time, with a reason in `run` for
    each that is missing, inconsistent or outside what hetopt prices."""
    reasons = run.reasons
    if not run.gpu:
        reasons.append(f"{GPU}: '{run.gpu_row}' ({(row.get('gpu_variant') or '').strip()})")
    cp = int_of(row, "cp") or 1
    if cp > 1:
        reasons.append(f"{CP}: cp={cp}")
    model, model_notes, model_reasons = model_section(row)
    run.notes += model_notes
    reasons += model_reasons
    tp, pp, dp, mb = (int_of(row, k) for k in ("tp", "pp", "dp", "micro_batch"))
    missing = [k for k, v in (("tp", tp), ("pp", pp), ("dp", dp), ("micro_batch", mb)) if v is None]
    if missing:
        reasons.append(f"{PARTIAL}: {', '.join(missing)} not stated")
    gpus, nodes, gpn = (int_of(row, k) for k in ("num_gpus", "num_nodes", "gpus_per_node"))
    if gpus is None or nodes is None or gpn is None:
        reasons.append(f"{PARTIAL}: num_gpus / num_nodes / gpus_per_node not stated")
    elif nodes * gpn != gpus:
        reasons.append(f"{LAYOUT}: num_nodes·gpus_per_node = {nodes * gpn} ≠ num_gpus {gpus}")
    if not missing and gpus and tp * pp * dp * cp != gpus:
        reasons.append(f"{LAYOUT}: tp·pp·dp·cp = {tp * pp * dp * cp} ≠ {gpus} GPUs")
    seq = int_of(row, "seq_len")
    gb = _global_batch(row, run, mb, dp)
    t, how = measured_time(row, gb, seq, gpus)
    if t is None:
        reasons.append(how)
    else:
        run.measured_s, run.measured_from = t, how
    return _Shape(model, tp, pp, dp, mb, gpus, nodes, gpn, seq, gb)


def _global_batch(row: dict, run: Run, mb: int | None, dp: int | None) -> int | None:
    """The global batch in sequences: stated, or micro_batch × dp where no accumulation is
    stated (a note says so); a reason where neither."""
    gb = int_of(row, "global_batch_seqs")
    if gb is None and mb and dp and (int_of(row, "grad_accum") or 1) == 1:
        gb = mb * dp
        run.notes.append(
            f"global batch unstated: micro_batch × dp = {gb} (per-rank batch, no accumulation)"
        )
    elif gb is None:
        run.reasons.append(f"{PARTIAL}: global batch not stated")
    return gb


def _row_layout(row: dict, run: Run, kind: str, shape: _Shape) -> Layout | None:
    """The row's layout: schedule (interleaved with its virtual stages, GPipe for Megatron-LM
    2021, else 1F1B), ZeRO stage, sequence parallelism and recompute, with the notes that say
    where each came from; None (a reason in `run`) where the schedule is not stated."""
    sched_text = (row.get("virtual_pp_or_schedule") or "").strip()
    m = re.search(r"vp\s*=\s*(\d+)", sched_text.lower())
    vp = int(m.group(1)) if m else 1
    if "interleaved" in sched_text.lower() and not m:
        run.reasons.append(f"{SCHEDULE}: '{sched_text}' without the number of virtual stages")
        return None
    schedule = "interleaved" if vp > 1 else "1f1b"
    if "gpipe" in run.framework.lower():
        # the row says "GPipe-style PP"; Megatron-LM's non-interleaved schedule has been 1F1B
        # (PipeDream-Flush) since 2020, and only it holds these models in 32 GB: GPipe would hold
        # 72-312 GiB of activations, 1F1B 21-29 GiB ("very snug" for the 39B, as the source says)
        run.notes.append("Megatron-LM 2021 'GPipe-style PP' → schedule 1f1b (its memory fits)")
    zero, zero_note = zero_of(row, kind)
    run.notes.append(zero_note)
    attention = _attention(kind)
    run.notes.append(
        f"attention {attention}"
        + (" (no FlashAttention on Volta)" if attention == "standard" else "")
    )
    run.notes.append(f"framework {framework_of(kind)}")
    if "compile" in run.framework.lower():
        run.notes.append("torch.compile fusion not modelled")
    if "async" in run.framework.lower():
        run.notes.append("AsyncTP overlap not modelled (TP collectives priced exposed)")
    recompute = recompute_of(row.get("activation_recompute") or "")
    sp = shape.tp > 1 and kind in ("nemo", "torchtitan", "meta")
    return Layout(
        tp=shape.tp,
        pp=shape.pp,
        dp=shape.dp,
        mb=shape.mb,
        vp=vp,
        recompute=recompute,
        sp=sp,
        zero=zero,
        schedule=schedule,
    )


def _attention(kind: str) -> str:
    """Standard attention for the stacks of before FlashAttention (and Volta), else flash."""
    return "standard" if kind in ("megatron2021", "megds") else "flash"


def _row_instance(row: dict, run: Run, kind: str, shape: _Shape, custom: dict) -> dict | None:
    """The instance document of a row: its model, training settings and one node group with its
    NIC; None (a reason in `run`) where the inter-node fabric is not understood."""
    nic, nic_note = nic_gbps(row, run.gpu, shape.nodes, shape.gpn)
    if nic is None:
        run.reasons.append(f"{PARTIAL}: inter-node fabric '{nic_note}' not understood")
        return None
    run.notes.append(nic_note)
    text = run.precision.lower()
    precision = "fp8" if "fp8" in text else "fp16" if "fp16" in text else "bf16"
    nic_kind, fabric_note = nic_fabric(row)
    fabric = {"nic_fabric": nic_kind} if nic_kind and shape.nodes > 1 else {}
    if fabric:
        run.notes.append(fabric_note)
    node = {
        "name": "node",
        "count": shape.nodes,
        "gpu": run.gpu,
        "gpus_per_node": shape.gpn,
        "nic_gbps": nic,
        **INTRA_FABRIC.get(run.gpu, {}),
        **fabric,
    }
    training = {
        "seq_len": shape.seq,
        "global_batch": shape.gb,
        "precision": precision,
        "attention": _attention(kind),
        "framework": framework_of(kind),
    }
    return {
        "name": f"run-line{run.line}",
        "model": shape.model,
        "training": training,
        "cluster": {"gpus": custom, "nodes": [node]},
    }


_ORDER = (CP, PARTIAL, NO_MEASURE, GPU, LAYOUT, SCHEDULE, EVALUATOR)


def _priority(reason: str) -> int:
    """Reasons in a fixed order, so that a row is counted under its most fundamental one: cp
    first (no configuration detail would make them expressible), the evaluator's verdict last."""
    category = reason.split(":", 1)[0]
    return _ORDER.index(category) if category in _ORDER else len(_ORDER)


def _short(exc: Exception, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def read_runs(path: str | Path) -> list[Run]:
    """Every row of a runs CSV as a Run (expressed or with reasons); nothing is dropped."""
    rows = read_csv(path, RUNS_CSV)
    return [run_from_row(row, n, str(path)) for n, row in enumerate(rows, start=2)]


# -- statistics
# ------------------------------------------------------------------------------------------
