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
"VP=k" → interleaved with vp = k (k > 1); Megatron-LM 2021 ("GPipe-style PP") → gpipe; otherwise
1F1B. "Interleaved 1F1B" without k is not expressible. Recompute: True / yes / full → full;
selective → selective (torchtitan's per-op SAC is priced as Megatron's selective recompute); False /
empty → none. Sequence parallelism: on with TP > 1 in Megatron-Core (NeMo, Megatron-Bridge) and
torchtitan (its TP plan shards norms over the sequence); off in Megatron-LM 2021 and
Megatron-DeepSpeed (it predates sequence parallelism). ZeRO from ``sharding``: FSDP FULL_SHARD,
FSDP2 (torchtitan's default reshard-after-forward) and Megatron-FSDP → 3; FSDP SHARD_GRAD_OP → 2;
ZeRO-1 → 1; DDP → 0; empty → 1 for NeMo (its distributed optimizer is on by default), 1 for
Megatron-DeepSpeed rows whose notes name ZeRO-1, else 0. A plan the evaluator rejects is not
expressed, with the evaluator's message as the reason. Attention: flash for llm-foundry, torchtitan,
NeMo/Megatron-Bridge and Meta; standard for Megatron-LM 2021 and Megatron-DeepSpeed on V100 (no
FlashAttention on Volta). Precision: bf16 or fp16 as the row says; any fp8 (Transformer Engine,
torchao Float8, amp_fp8) is not expressible: hetopt prices 16-bit GEMMs. torch.compile and AsyncTP
in 16 bits are expressible; hetopt does not model their fusion / overlap (said per row).

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

import csv
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from hetopt.cost.pricing import evaluate
from hetopt.cost.profiles import Profiles
from hetopt.cost.stacks import FRAMEWORKS, Stack, fit_efficiency
from hetopt.errors import InputError, Problem
from hetopt.layout import Layout, expand_layout
from hetopt.plan import Plan
from hetopt.spec.instance import Instance, instance_from_spec
from hetopt.spec.load import validate_document
from hetopt.spec.schema import InstanceFile

GPT2_VOCAB = 50257
LOSO_TARGET = 0.15
"""Issue 10 acceptance: leave-one-source-out MAPE ≤ 15% for every GPU type with ≥ 10 end-to-end
rows."""
LOSO_MIN_ROWS = 10

# Reason categories (the text before the first colon of a reason).
PARTIAL = "partial row"
FP8 = "fp8 precision"
CP = "context parallelism cp>1"
NO_MEASURE = "no usable measurement"
LAYOUT = "layout does not match the GPUs"
GPU = "GPU type not in the catalog"
SCHEDULE = "schedule not stated"
EVALUATOR = "evaluator rejects the plan"

H100_96GB_500W = {
    "peak_tflops": 989.0,
    "memory_gib": 96.0,
    "hbm_gbps": 3350 * 8,
    "intra_node_gbps": 450 * 8,
    "family": "hopper",
    "tdp_w": 500.0,
}
"""torchtitan's 2024 H100s (96 GB HBM2e at 500 W, its benchmark's own words): H100-SXM's datasheet
peak, bandwidths and NVLink 4 (assumed: no datasheet for this variant), the stated memory and
power."""
MI250X_GCD = {
    "peak_tflops": 191.5,
    "memory_gib": 64.0,
    "hbm_gbps": 1638.4 * 8,
    "intra_node_gbps": 400 * 8 / 2,
}
"""One MI250X GCD: half the package's datasheet figures (383 TFLOP/s, 128 GB, 3276.8 GB/s);
per-direction xGMI as the catalog's package entry (an approximation: a GCD reaches its peers over
fewer links)."""


INTRA_FABRIC = {"H100-96GB-500W": {"intra_fabric": "nvlink4"}}
"""Custom types default to PCIe inside a node (cost.fabrics); these have NVLink."""


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

_SOURCE_RULES = [
    (r"mosaicml/llm-foundry", "mosaicml/llm-foundry"),
    (r"pytorch/torchtitan", "pytorch/torchtitan"),
    (r"NVIDIA-NeMo/Megatron-Bridge", "NVIDIA-NeMo/Megatron-Bridge"),
    (r"NVIDIA/NeMo", "NVIDIA/NeMo"),
    (r"bigscience\S* experiments/gpt2\.md", "bigscience gpt2.md"),
    (r"bigscience\S* experiments/tr8-104B\.md", "bigscience tr8-104B.md"),
    (r"Llama 3 Herd", "Llama 3 paper (arXiv 2407.21783)"),
    (r"100K or 100 Days|apoorvkh/academic-pretraining", "$100K or 100 Days (arXiv 2410.23261)"),
    (r"Dash et al", "Dash et al. Frontier (arXiv 2312.12705)"),
]


def source_key(text: str) -> str:
    """The repository or paper a row comes from: known sources by rule, else `owner/repo` or the
    text before the first '(' / ','."""
    for pattern, key in _SOURCE_RULES:
        if re.search(pattern, text):
            return key
    m = re.match(r"\s*([\w.\-]+/[\w.\-]+)", text)
    if m:
        return m.group(1).split("@")[0]
    return re.split(r"[(,]", text, maxsplit=1)[0].strip() or "unknown"


# -- parsing helpers
# -------------------------------------------------------------------------------------


def _int(row: dict, key: str) -> int | None:
    text = (row.get(key) or "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return int(value) if value.is_integer() else None


def _float(row: dict, key: str) -> float | None:
    text = (row.get(key) or "").strip()
    try:
        return float(text) if text else None
    except ValueError:
        return None


def map_gpu(row: dict) -> tuple[str, list[str], dict]:
    """(hetopt GPU type or '', notes, custom GPU declarations for cluster.gpus)."""
    name = (row.get("gpu") or "").strip()
    variant = (row.get("gpu_variant") or "").strip()
    gpn = _int(row, "gpus_per_node")
    low = f"{name} {variant}".lower()
    if name.upper() == "H100-SXM":
        if "96gb" in low.replace(" ", ""):
            return (
                "H100-96GB-500W",
                [
                    f"GPU '{variant}': custom type H100-96GB-500W of the hopper family at 500 W "
                    "(H100-SXM's peak, HBM bandwidth and NVLink 4; its efficiency derived from the "
                    "family by the power rule, cost.gemm_fit.derived_eta)"
                ],
                {"H100-96GB-500W": H100_96GB_500W},
            )
        return "H100-SXM", [], {}
    if name.upper() == "H100":
        if gpn == 8 and "pcie" not in low:
            return (
                "H100-SXM",
                [
                    "H100 form factor unstated on 8-GPU NVLink nodes → H100-SXM (only the SXM "
                    "part comes in 8-GPU NVLink nodes)"
                ],
                {},
            )
        return "", [], {}
    if name.upper().startswith("V100"):
        if "16gb" in low.replace(" ", ""):
            return "V100-16GB", [], {}
        return (
            "V100-32GB",
            ["V100 SXM2 32GB → V100-32GB"] if "32gb" in low.replace(" ", "") else [],
            {},
        )
    if name.upper() == "H200":
        return "H200", [], {}
    if name.upper().startswith("A100"):
        if "80gb" in low.replace(" ", "") or "sxm" in low:
            return "A100-80GB", ["A100 80GB (SXM) → A100-80GB"], {}
        return "", [], {}
    if name.upper() == "MI250X":
        return (
            "MI250X-GCD",
            [
                "one MI250X GCD is a GPU: custom type MI250X-GCD = half the catalog's MI250X "
                "package (191.5 TFLOP/s, 64 GiB, 1638.4 GB/s)"
            ],
            {"MI250X-GCD": MI250X_GCD},
        )
    if name == "RTX-3090":
        return "RTX-3090", [], {}
    return "", [], {}


def nic_gbps(row: dict, gpu: str, nodes: int, gpn: int) -> tuple[float | None, str]:
    """NIC bandwidth out of one node (Gbit/s) from `inter_node_fabric`, and what was assumed."""
    fabric = (row.get("inter_node_fabric") or "").strip()
    low = fabric.lower()
    m = re.search(r"(\d+(?:\.\d+)?)\s*gb(?:ps|/s|it/s)?\s+per\s+(node|gpu)", low)
    if m:
        value = float(m.group(1)) * (gpn if m.group(2) == "gpu" else 1)
        return value, f"NIC {value:g} Gbit/s per node from '{fabric}'"
    if "ndr" in low:
        return (
            400.0 * gpn,
            f"NIC {gpn}×400 Gbit/s per node ('{fabric}': DGX H100, one NDR port per GPU)",
        )
    if "omni-path" in low:
        return (
            400.0,
            "NIC 4×100 Gbit/s = 400 per node (Jean Zay Omni-Path; bigscience bandwidth README)",
        )
    if "slingshot" in low:
        return 800.0, "NIC 4×200 Gbit/s = 800 per node (Frontier, HPE Slingshot-11)"
    if not fabric and gpu.startswith("H100") and gpn == 8:
        note = (
            "inter-node fabric unstated: 8×400 Gbit/s per node assumed (HGX H100 reference, one "
            "400G NIC per GPU)"
        )
        return 3200.0, note + ("; single node, unused" if nodes == 1 else "")
    if nodes == 1:
        return 100.0, "single node: NIC unused (100 Gbit/s placeholder)"
    return None, fabric


NIC_FABRICS = (
    ("omni-path", "omnipath"),
    ("roce", "roce"),
    ("ndr", "infiniband"),
    ("infiniband", "infiniband"),
    ("rdma", "infiniband"),
)
"""Words of `inter_node_fabric` → hetopt fabric (cost.fabrics); generic 'RDMA' counts as
InfiniBand."""


def nic_fabric(row: dict) -> tuple[str | None, str]:
    """The fabric of the nodes' NICs from `inter_node_fabric` (None: hetopt's default by speed), and
    a note."""
    text = (row.get("inter_node_fabric") or "").strip()
    for word, fabric in NIC_FABRICS:
        if word in text.lower():
            return fabric, f"NIC fabric {fabric} ('{text}')"
    return None, ""


def _family(model: str) -> str:
    low = model.lower()
    if low.startswith("mpt"):
        return "mpt"
    if "llama" in low or "nemotron" in low:
        return "llama"
    return "gpt"


def model_section(row: dict) -> tuple[dict | None, list[str], list[str]]:
    """(instance `model:` section, notes, reasons)."""
    name = (row.get("model") or "").strip()
    dims = {k: _int(row, k) for k in ("n_layers", "hidden", "n_heads", "seq_len")}
    missing = [k for k, v in dims.items() if v is None]
    if missing:
        return None, [], [f"{PARTIAL}: {', '.join(missing)} not stated"]
    h = dims["hidden"]
    notes = []
    family = _family(name)
    ffn = _int(row, "ffn_hidden")
    if ffn is None:
        if family == "llama":
            return None, [], [f"{PARTIAL}: ffn_hidden not stated for a LLaMA-like model"]
        ffn = 4 * h
        notes.append("ffn_hidden unstated: 4·hidden (GPT)")
    vocab = _int(row, "vocab")
    if vocab is None:
        if family == "gpt" and "gpt-2" in name.lower():
            vocab = GPT2_VOCAB
            notes.append("vocab unstated: GPT-2 tokenizer's 50257")
        else:
            return None, [], [f"{PARTIAL}: vocab not stated"]
    section = {
        "layers": dims["n_layers"],
        "hidden": h,
        "heads": dims["n_heads"],
        "kv_heads": _int(row, "n_kv_heads") or dims["n_heads"],
        "ffn_hidden": ffn,
        "vocab": vocab,
        "max_seq_len": dims["seq_len"],
    }
    if family == "mpt":
        section.update(
            gated_mlp=False,
            norm="layernorm",
            linear_bias=False,
            position_embedding="rotary",
            tied_embeddings=True,
        )
        notes.append(
            "MPT: ALiBi priced as 'rotary' (no position parameters), no biases, tied embeddings"
        )
    elif family == "llama":
        section.update(
            gated_mlp=ffn != 4 * h,
            norm="rmsnorm",
            linear_bias=False,
            position_embedding="rotary",
            tied_embeddings=False,
        )
    else:
        section.update(
            gated_mlp=False,
            norm="layernorm",
            linear_bias=True,
            position_embedding="learned",
            tied_embeddings=True,
        )
    return section, notes, []


def _framework_kind(framework: str) -> str:
    low = framework.lower()
    if "megatron-deepspeed" in low:
        return "megds"
    if "megatron-lm" in low:
        return "megatron2021"
    if "nemo" in low or "megatron-bridge" in low or "megatron-core" in low:
        return "nemo"
    if "torchtitan" in low:
        return "torchtitan"
    if "llm-foundry" in low:
        return "llm-foundry"
    if "meta" in low:
        return "meta"
    return "other"


def framework_of(kind: str) -> str:
    """The training stack of a row's framework kind (cost/stacks.py)."""
    return "fsdp" if kind in ("llm-foundry", "torchtitan") else "megatron"


def zero_of(row: dict, kind: str) -> tuple[int, str]:
    sharding = (row.get("sharding") or "").strip()
    low = sharding.lower()
    if "shard_grad_op" in low:
        return 2, "FSDP SHARD_GRAD_OP → zero=2"
    if "full_shard" in low:
        return 3, "FSDP FULL_SHARD → zero=3"
    if "fsdp2" in low:
        return 3, "FSDP2 (reshard after forward, torchtitan's default) → zero=3"
    if "fsdp" in low:
        return 3, f"'{sharding}' (Megatron FSDP) → zero=3"
    if "zero-1" in low:
        return 1, "ZeRO-1 → zero=1"
    if "ddp" in low:
        return 0, "DDP → zero=0"
    if kind == "nemo":
        return 1, "sharding unstated: NeMo's distributed optimizer (default) → zero=1"
    if kind == "megds" and "zero-1" in (row.get("notes") or "").lower():
        return 1, "Megatron-DeepSpeed with ZeRO-1 per the notes → zero=1"
    return 0, "sharding unstated → zero=0"


def recompute_of(text: str) -> str:
    low = text.strip().lower()
    if "selective" in low:
        return "selective"
    if low.startswith(("true", "yes", "full")):
        return "full"
    return "none"


def measured_time(
    row: dict, global_batch: int | None, seq_len: int | None, gpus: int | None
) -> tuple[float | None, str]:
    """(measured iteration seconds, how) or (None, reason)."""
    t = _float(row, "iteration_time_s")
    if t:
        return t, "iteration_time_s"
    tps = _float(row, "tokens_per_s_per_gpu")
    if tps:
        if not (global_batch and seq_len and gpus):
            return None, f"{PARTIAL}: tokens/s/GPU given but not global batch, seq_len and GPUs"
        return global_batch * seq_len / (tps * gpus), "tokens_per_s_per_gpu"
    tflops = _float(row, "achieved_tflops_per_gpu")
    if tflops:
        formula = (row.get("flops_formula") or "").strip()
        n_params = _float(row, "n_params")
        if formula.startswith("model_size_B*4*2*seq*GBS/(time*gpus*1e3)"):
            if not (n_params and global_batch and seq_len and gpus):
                return (
                    None,
                    f"{PARTIAL}: achieved TFLOPs given but not n_params, global batch, seq_len "
                    "and GPUs",
                )
            t = n_params / 1e9 * 4 * 2 * seq_len * global_batch / (tflops * gpus * 1e3)
            return t, f"achieved_tflops_per_gpu with its formula '{formula}'"
        return (
            None,
            f"{NO_MEASURE}: achieved TFLOPs/GPU with an unrecognised flops_formula {formula!r}",
        )
    return (
        None,
        f"{NO_MEASURE}: none of iteration_time_s, tokens_per_s_per_gpu, achieved_tflops_per_gpu",
    )


# -- rows → runs
# -----------------------------------------------------------------------------------------


def run_from_row(row: dict, line: int, path: str = "runs.csv") -> Run:
    """One CSV row → a Run with its instance and layout, or with the reasons it cannot be
    expressed."""
    gpu, gpu_notes, custom = map_gpu(row)
    framework = (row.get("framework") or "").strip()
    kind = _framework_kind(framework)
    run = Run(
        path=str(path),
        line=line,
        gpu_row=(row.get("gpu") or "").strip(),
        gpu=gpu,
        source=source_key(row.get("source") or ""),
        source_text=(row.get("source") or "").strip(),
        framework=framework,
        model=(row.get("model") or "").strip(),
        precision=(row.get("precision") or "").strip(),
        notes=list(gpu_notes),
    )
    reasons = run.reasons
    if not gpu:
        reasons.append(f"{GPU}: '{run.gpu_row}' ({(row.get('gpu_variant') or '').strip()})")
    if "fp8" in run.precision.lower():
        reasons.append(f"{FP8}: '{run.precision}' (hetopt prices 16-bit GEMMs)")
    cp = _int(row, "cp") or 1
    if cp > 1:
        reasons.append(f"{CP}: cp={cp}")
    model, model_notes, model_reasons = model_section(row)
    run.notes += model_notes
    reasons += model_reasons
    tp, pp, dp, mb = (_int(row, k) for k in ("tp", "pp", "dp", "micro_batch"))
    missing = [k for k, v in (("tp", tp), ("pp", pp), ("dp", dp), ("micro_batch", mb)) if v is None]
    if missing:
        reasons.append(f"{PARTIAL}: {', '.join(missing)} not stated")
    gpus, nodes, gpn = (_int(row, k) for k in ("num_gpus", "num_nodes", "gpus_per_node"))
    if gpus is None or nodes is None or gpn is None:
        reasons.append(f"{PARTIAL}: num_gpus / num_nodes / gpus_per_node not stated")
    elif nodes * gpn != gpus:
        reasons.append(f"{LAYOUT}: num_nodes·gpus_per_node = {nodes * gpn} ≠ num_gpus {gpus}")
    if not missing and gpus and tp * pp * dp * cp != gpus:
        reasons.append(f"{LAYOUT}: tp·pp·dp·cp = {tp * pp * dp * cp} ≠ {gpus} GPUs")
    seq = _int(row, "seq_len")
    gb = _int(row, "global_batch_seqs")
    if gb is None and mb and dp and (_int(row, "grad_accum") or 1) == 1:
        gb = mb * dp
        run.notes.append(
            f"global batch unstated: micro_batch × dp = {gb} (per-rank batch, no accumulation)"
        )
    elif gb is None:
        reasons.append(f"{PARTIAL}: global batch not stated")
    t, how = measured_time(row, gb, seq, gpus)
    if t is None:
        reasons.append(how)
    else:
        run.measured_s, run.measured_from = t, how
    if reasons:
        reasons.sort(key=_priority)
        return run

    sched_text = (row.get("virtual_pp_or_schedule") or "").strip()
    m = re.search(r"vp\s*=\s*(\d+)", sched_text.lower())
    vp = int(m.group(1)) if m else 1
    if "interleaved" in sched_text.lower() and not m:
        reasons.append(f"{SCHEDULE}: '{sched_text}' without the number of virtual stages")
        return run
    if vp > 1:
        schedule = "interleaved"
    elif "gpipe" in framework.lower():
        schedule = "gpipe"
        run.notes.append("Megatron-LM 2021 'GPipe-style PP' → schedule gpipe")
    else:
        schedule = "1f1b"
    zero, zero_note = zero_of(row, kind)
    run.notes.append(zero_note)
    sp = tp > 1 and kind in ("nemo", "torchtitan", "meta")
    attention = "standard" if kind in ("megatron2021", "megds") else "flash"
    run.notes.append(
        f"attention {attention}"
        + (" (no FlashAttention on Volta)" if attention == "standard" else "")
    )
    run.notes.append(f"framework {framework_of(kind)}")
    if "compile" in framework.lower():
        run.notes.append("torch.compile fusion not modelled")
    if "async" in framework.lower():
        run.notes.append("AsyncTP overlap not modelled (TP collectives priced exposed)")
    recompute = recompute_of(row.get("activation_recompute") or "")
    run.layout = Layout(
        tp=tp, pp=pp, dp=dp, mb=mb, vp=vp, recompute=recompute, sp=sp, zero=zero, schedule=schedule
    )
    nic, nic_note = nic_gbps(row, gpu, nodes, gpn)
    if nic is None:
        reasons.append(f"{PARTIAL}: inter-node fabric '{nic_note}' not understood")
        return run
    run.notes.append(nic_note)
    precision = "fp16" if "fp16" in run.precision.lower() else "bf16"
    nic_kind, fabric_note = nic_fabric(row)
    fabric = {"nic_fabric": nic_kind} if nic_kind and nodes > 1 else {}
    if fabric:
        run.notes.append(fabric_note)
    data = {
        "name": f"run-line{line}",
        "model": model,
        "training": {
            "seq_len": seq,
            "global_batch": gb,
            "precision": precision,
            "attention": attention,
            "framework": framework_of(kind),
        },
        "cluster": {
            "gpus": custom,
            "nodes": [
                {
                    "name": "node",
                    "count": nodes,
                    "gpu": gpu,
                    "gpus_per_node": gpn,
                    "nic_gbps": nic,
                    **INTRA_FABRIC.get(gpu, {}),
                    **fabric,
                }
            ],
        },
    }
    where = f"{path}:{line}"
    try:
        spec = validate_document(data, where, InstanceFile, "instance")
        run.instance = instance_from_spec(spec, where, Path("."))
    except InputError as exc:
        reasons.append(f"{PARTIAL}: the row does not make a valid instance ({_short(exc)})")
    return run


_ORDER = (FP8, CP, PARTIAL, NO_MEASURE, GPU, LAYOUT, SCHEDULE, EVALUATOR)


def _priority(reason: str) -> int:
    """Reasons in a fixed order, so that a row is counted under its most fundamental one: fp8 and cp
    first (no configuration detail would make them expressible), the evaluator's verdict last."""
    category = reason.split(":", 1)[0]
    return _ORDER.index(category) if category in _ORDER else len(_ORDER)


def _short(exc: Exception, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def read_runs(path: str | Path) -> list[Run]:
    """Every row of a runs CSV as a Run (expressed or with reasons); nothing is dropped."""
    path = Path(path)
    if not path.is_file():
        raise InputError(str(path), [Problem("", "end-to-end runs file does not exist")])
    with path.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    return [run_from_row(row, n, str(path)) for n, row in enumerate(rows, start=2)]


def predict_runs(runs: list[Run], profiles: Profiles | None = None) -> list[Run]:
    """Expand and evaluate every runnable row in place; a plan the evaluator rejects becomes a
    reason."""
    profiles = profiles or Profiles()
    for run in runs:
        if run.reasons or run.instance is None or run.layout is None:
            continue
        try:
            if run.plan is None:
                run.plan = expand_layout(run.instance, run.layout, source=run.label)
            ev = evaluate(run.instance, run.plan, profiles, source=run.label)
        except (InputError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
            run.reasons.append(f"{EVALUATOR}: {_short(exc)}")
            continue
        run.predicted_s, run.breakdown, run.fits = ev.iteration_time_s, ev.breakdown, ev.fits
    return runs


def repredict(runs: list[Run], profiles: Profiles) -> np.ndarray:
    """Predicted seconds of expressed `runs` under other `profiles` (copies; the runs keep theirs);
    nan where the evaluator rejects a row under them."""
    copies = [replace(r, predicted_s=None, breakdown={}, fits=None) for r in runs]
    predict_runs(copies, profiles)
    return np.array([math.nan if c.predicted_s is None else c.predicted_s for c in copies])


def load_runs(paths: list[str | Path], profiles: Profiles | None = None) -> list[Run]:
    runs = [r for p in paths for r in read_runs(p)]
    return predict_runs(runs, profiles)


def zero_proxy(runs: list[Run], profiles: Profiles | None = None) -> list[Run]:
    """Diagnostic only: rows rejected by the evaluator for ZeRO-2/3 alone, evaluated as zero=1 (the
    same compute, pipeline and TP terms; data-parallel traffic 2/3 of FSDP's all-gather +
    reduce-scatter, memory higher). Copies; the rows stay not expressed in every headline figure."""
    profiles = profiles or Profiles()
    out = []
    for run in runs:
        if (
            len(run.reasons) == 1
            and run.reason_category == EVALUATOR
            and run.layout is not None
            and run.layout.zero >= 2
        ):
            proxy = replace(
                run,
                reasons=[],
                notes=[*run.notes, f"PROXY: zero={run.layout.zero} evaluated as zero=1"],
                layout=replace(run.layout, zero=1),
                plan=None,
            )
            predict_runs([proxy], profiles)
            if proxy.expressed:
                out.append(proxy)
    return out


# -- statistics
# ------------------------------------------------------------------------------------------


def stats(predicted, measured) -> dict:
    """rows, MAPE, median ratio predicted/measured (bias), max |error|, Spearman (≥ 3 rows)."""
    p, m = np.asarray(predicted, dtype=float), np.asarray(measured, dtype=float)
    if p.size == 0:
        return {"rows": 0}
    ratio = p / m
    out = {
        "rows": int(p.size),
        "mape": float(np.mean(np.abs(ratio - 1))),
        "median_ratio": float(np.median(ratio)),
        "max_error": float(np.max(np.abs(ratio - 1))),
    }
    out["spearman"] = None
    if p.size >= 3 and np.ptp(p) > 0 and np.ptp(m) > 0:
        from scipy.stats import spearmanr

        rho = float(spearmanr(p, m).statistic)
        out["spearman"] = None if math.isnan(rho) else rho
    return out


def grouped(
    runs: list[Run], key: Callable[[Run], str], predicted: dict[int, float] | None = None
) -> dict:
    """stats per group of expressed runs; `predicted` overrides predictions by id(run) (LOSO)."""
    groups: dict[str, list[Run]] = {}
    for r in runs:
        if r.expressed:
            groups.setdefault(key(r), []).append(r)
    out = {}
    for name, rs in sorted(groups.items()):
        p = [predicted[id(r)] if predicted else r.predicted_s for r in rs]
        out[name] = stats(p, [r.measured_s for r in rs])
    return out


Fit = Callable[[list[Run]], Profiles]
"""Fits cost parameters on expressed end-to-end runs and returns the Profiles that price held-out
rows."""


def loso(runs: list[Run], fit: Fit | None = None) -> dict:
    """Leave-one-source-out: per source, parameters fitted on the other sources' expressed rows
    predict this source's rows. Without `fit` nothing is fitted on end-to-end rows: held-out = plain
    predictions."""
    expressed = [r for r in runs if r.expressed]
    held: dict[int, float] = {}
    if fit is None:
        held = {id(r): r.predicted_s for r in expressed}
    else:
        for source in sorted({r.source for r in expressed}):
            profiles = fit([r for r in expressed if r.source != source])
            mine = [r for r in expressed if r.source == source]
            for r, t in zip(mine, repredict(mine, profiles), strict=True):
                held[id(r)] = t
    per_gpu = grouped(runs, lambda r: r.gpu, held)
    for s in per_gpu.values():
        applies = s["rows"] >= LOSO_MIN_ROWS
        s["acceptance"] = {
            "target_mape": LOSO_TARGET,
            "applies": applies,
            "passes": (s["mape"] <= LOSO_TARGET) if applies else None,
        }
    return {
        "fitted_on_end_to_end": fit is not None,
        "per_gpu": per_gpu,
        "per_source": grouped(runs, lambda r: r.source, held),
        "predicted": held,
    }


def fit_stacks(runs: list[Run]) -> dict[str, Stack]:
    """Every stack of FRAMEWORKS: megatron at 1 (the profiles' own stack); each other stack's
    compute efficiency fitted (least mean relative error) on the expressed `runs` of that stack, or
    1 when there are none (`fit.rows` 0 says so)."""
    stacks = {
        fw: Stack(
            fw,
            1.0,
            "the stack the GPU profiles were fitted on (Megatron-DeepSpeed, Megatron layer "
            "times, cuBLAS GEMMs): 1 by construction",
            {"rows": 0},
        )
        for fw in FRAMEWORKS
    }
    for fw in FRAMEWORKS[1:]:
        rows = [r for r in runs if r.expressed and r.instance.spec.training.framework == fw]
        if not rows:
            stacks[fw] = Stack(
                fw,
                1.0,
                "no end-to-end rows of this stack to fit on: priced as megatron",
                {"rows": 0},
            )
            continue

        def predict(eff: float, fw=fw, rows=rows) -> np.ndarray:
            return repredict(rows, Profiles(stacks={fw: Stack(fw, eff)}))

        eff, fit = fit_efficiency(predict, np.array([r.measured_s for r in rows]))
        sources = sorted({r.source for r in rows})
        fit["sources"] = {src: sum(r.source == src for r in rows) for src in sources}
        fit["data"] = sorted({Path(r.path).name for r in rows})
        stacks[fw] = Stack(
            fw,
            eff,
            f"fitted on {len(rows)} end-to-end rows ({', '.join(sources)}): least mean relative "
            "error of the iteration time, GPU and fabric profiles as shipped",
            fit,
        )
    return stacks


def stack_fit(runs: list[Run]) -> Profiles:
    """The `Fit` hetopt uses: profiles as shipped, stack efficiencies fitted on `runs`
    (`fit_stacks`)."""
    return Profiles(stacks=fit_stacks(runs))


NO_FIT_NOTE = (
    "hetopt fits no parameter on end-to-end rows (its profiles come from GEMM/layer/collective "
    "measurements fitted elsewhere), so each held-out source is predicted by the same model as the "
    "others: leave-one-source-out error equals the plain error."
)


def not_expressed_counts(runs: list[Run]) -> dict[str, int]:
    """Rows not expressed, by their first reason's category."""
    return dict(Counter(r.reason_category for r in runs if not r.expressed).most_common())


def fit_report(
    paths: list[str | Path], fit: Fit | None = None, profiles: Profiles | None = None
) -> dict:
    """Accuracy on end-to-end runs for `hetopt calibrate` to print (JSON-serialisable): counts, per
    GPU type and per source (plain and leave-one-source-out), the acceptance check per GPU type,
    rows not expressed by reason, and the lowest MAPE the repeated measurements allow
    (`repeat_floor`)."""
    runs = load_runs(paths, profiles)
    cv = loso(runs, fit)
    expressed = [r for r in runs if r.expressed]
    return {
        "data": [str(p) for p in paths],
        "rows": len(runs),
        "expressed": len(expressed),
        "not_expressed": not_expressed_counts(runs),
        "fitted_on_end_to_end": cv["fitted_on_end_to_end"],
        "note": "" if fit else NO_FIT_NOTE,
        "per_gpu": grouped(runs, lambda r: r.gpu),
        "per_source": grouped(runs, lambda r: r.source),
        "loso_per_gpu": cv["per_gpu"],
        "loso_per_source": cv["per_source"],
        "repeat_floor": repeat_floor(runs),
        "acceptance": acceptance(runs, cv),
    }


def acceptance(runs: list[Run], cv: dict) -> dict[str, dict]:
    """The issue's check for every GPU type with ≥ 10 rows in the data (expressed or not): LOSO MAPE
    ≤ 15% when ≥ 10 rows are expressed; otherwise not evaluable yet (`passes` None), with the
    counts."""
    counts = Counter(r.gpu for r in runs if r.gpu)
    out = {}
    for gpu, n in sorted(counts.items()):
        if n < LOSO_MIN_ROWS:
            continue
        held = cv["per_gpu"].get(gpu, {"rows": 0})
        ok = held["rows"] >= LOSO_MIN_ROWS
        out[gpu] = {
            "rows": n,
            "expressed": held["rows"],
            "loso_mape": held.get("mape"),
            "target_mape": LOSO_TARGET,
            "passes": (held["mape"] <= LOSO_TARGET) if ok else None,
        }
    return out


def repeat_floor(runs: list[Run]) -> dict[str, dict]:
    """Per GPU type, the smallest MAPE any model could reach on the expressed rows, given that rows
    with the very same instance and layout were measured at different times (BigScience notes 30–55
    TFLOPs day to day on Jean Zay): one prediction per configuration, the best one for its repeats
    (the median of measured times weighted by 1/measured minimises Σ|p − m|/m). Rows measured once
    add zero."""
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        if r.expressed:
            key = (r.gpu, r.model, r.config, r.instance.seq_len, r.instance.global_batch)
            groups.setdefault(key, []).append(r)
    total: dict[str, list[float]] = {}
    for (gpu, *_), rs in groups.items():
        m = np.array(sorted(r.measured_s for r in rs))
        w = 1 / m
        best = m[np.searchsorted(np.cumsum(w), w.sum() / 2)]
        total.setdefault(gpu, []).extend(np.abs(best / m - 1))
    return {
        gpu: {
            "rows": len(e),
            "floor_mape": float(np.mean(e)),
            "repeated_rows": sum(
                len(rs) for k, rs in groups.items() if k[0] == gpu and len(rs) > 1
            ),
        }
        for gpu, e in sorted(total.items())
    }
