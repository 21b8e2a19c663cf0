"""The fields of an end-to-end runs CSV row, read as hetopt needs them: the GPU type, the NIC and
its fabric, the model, the framework and its ZeRO stage, the recompute mode and the measured time;
and the reasons a row cannot be expressed (the text before a reason's first colon)."""

from __future__ import annotations

import re

GPT2_VOCAB = 50257


# Reason categories (the text before the first colon of a reason).
PARTIAL = "partial row"


CP = "context parallelism cp>1"


NO_MEASURE = "no usable measurement"


LAYOUT = "layout does not match the GPUs"


GPU = "GPU type not in the catalog"


SCHEDULE = "schedule not stated"


EVALUATOR = "evaluator rejects the plan"


H100_96GB_500W = {
    "peak_tflops": 989.0,
    "peak_tflops_fp32": 67.0,
    "peak_tflops_tf32": 494.7,
    "peak_tflops_fp8": 1979.0,
    "memory_gib": 96.0,
    "hbm_gbps": 3350 * 8,
    "intra_node_gbps": 450 * 8,
    "family": "hopper",
    "tdp_w": 500.0,
}
"""torchtitan's 2024 H100s (96 GB HBM2e at 500 W, its benchmark's own words): H100-SXM's datasheet
peaks (every format), bandwidths and NVLink 4 (assumed: no datasheet for this variant), the stated
memory and power."""


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
"""Custom types default to PCIe inside a node (spec.fabrics); these have NVLink."""


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


def int_of(row: dict, key: str) -> int | None:
    text = (row.get(key) or "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return int(value) if value.is_integer() else None


def float_of(row: dict, key: str) -> float | None:
    text = (row.get(key) or "").strip()
    try:
        return float(text) if text else None
    except ValueError:
        return None


def map_gpu(row: dict) -> tuple[str, list[str], dict]:
    """(hetopt GPU type or '', notes, custom GPU declarations for cluster.gpus)."""
    name = (row.get("gpu") or "").strip()
    variant = (row.get("gpu_variant") or "").strip()
    gpn = int_of(row, "gpus_per_node")
    low = f"{name} {variant}".lower()
    if name.upper() == "H100-SXM":
        if "96gb" in low.replace(" ", ""):
            return (
                "H100-96GB-500W",
                [
                    f"GPU '{variant}': custom type H100-96GB-500W of the hopper family at 500 W "
                    "(H100-SXM's peak, HBM bandwidth and NVLink 4; its efficiency derived from the "
                    "family by the power rule, cost.derive.derived_eta)"
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
"""Words of `inter_node_fabric` → hetopt fabric (spec.fabrics); generic 'RDMA' counts as
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
    dims = {k: int_of(row, k) for k in ("n_layers", "hidden", "n_heads", "seq_len")}
    missing = [k for k, v in dims.items() if v is None]
    if missing:
        return None, [], [f"{PARTIAL}: {', '.join(missing)} not stated"]
    h = dims["hidden"]
    notes = []
    family = _family(name)
    ffn = int_of(row, "ffn_hidden")
    if ffn is None:
        if family == "llama":
            return None, [], [f"{PARTIAL}: ffn_hidden not stated for a LLaMA-like model"]
        ffn = 4 * h
        notes.append("ffn_hidden unstated: 4·hidden (GPT)")
    vocab = int_of(row, "vocab")
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
        "kv_heads": int_of(row, "n_kv_heads") or dims["n_heads"],
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


def framework_kind(framework: str) -> str:
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
    t = float_of(row, "iteration_time_s")
    if t:
        return t, "iteration_time_s"
    tps = float_of(row, "tokens_per_s_per_gpu")
    if tps:
        if not (global_batch and seq_len and gpus):
            return None, f"{PARTIAL}: tokens/s/GPU given but not global batch, seq_len and GPUs"
        return global_batch * seq_len / (tps * gpus), "tokens_per_s_per_gpu"
    tflops = float_of(row, "achieved_tflops_per_gpu")
    if tflops:
        formula = (row.get("flops_formula") or "").strip()
        n_params = float_of(row, "n_params")
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
