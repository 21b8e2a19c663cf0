"""`hetopt calibrate --measure`: time GEMMs, memory-bound kernels, attention and a transformer block
with PyTorch on the local device and write a profile the cost model loads (needs the `measure`
extra).

What is measured and what it sets:
- a large square GEMM → GEMM efficiency (achieved FLOP/s ÷ the catalog peak of --gpu);
- a small GEMM → the fixed time per GEMM kernel (KERN);
- a large elementwise add (reads 2, writes 1 tensor) → memory efficiency (bytes/s ÷ catalog HBM
  bandwidth);
- a transformer block forward and backward at a small size (launch-bound) → host time per layer pass
  (PASS)
  once the device work the model predicts for it is taken out;
- on a GPU, the memory the runtime holds before any tensor (CUDA context, library handles) →
  reserve_gib. Collectives need several devices; their weights (LINK, NET, STEP) and the framework
  terms MB and ITER are taken from the nearest calibrated profile, and the profile's `method` says
  so. The block is then measured and predicted again at twice the width and length; both errors are
  stored in `fit` (the first is near zero by construction, the second is the check).
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import replace

import numpy as np

from hetopt.cost.attention import attention_weight
from hetopt.cost.features import BWD, FWD, stage_work
from hetopt.cost.pricing import host_device, price_parts
from hetopt.cost.profiles import Profiles
from hetopt.cost.terms import ATTN, GEMM, KERN, MB, MEM, PASS, CostParams
from hetopt.errors import InputError, Problem
from hetopt.spec.gpus import CATALOG
from hetopt.spec.presets import ModelArch

SIZES = {
    # name: (gemm n, small gemm n, elementwise elements, block hidden, heads, seq, micro-batch,
    # repeats)
    "full": (8192, 128, 2**28, 1024, 16, 1024, 1, 20),
    "tiny": (256, 16, 2**20, 64, 4, 32, 2, 3),
}


def _torch():
    try:
        import torch
    except ImportError:
        raise InputError(
            "calibrate --measure",
            [
                Problem(
                    "torch",
                    "PyTorch is not installed; install the measuring extra: pip install -e "
                    "'.[measure]'",
                )
            ],
        ) from None
    return torch


def _timer(torch, device: str):
    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    def timeit(fn, repeats: int) -> float:
        fn()  # warm-up: allocations, kernel selection
        sync()
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        sync()
        return (time.perf_counter() - start) / repeats

    return timeit


def _block(torch, hidden: int, heads: int):
    """A GPT block: LayerNorm, QKV, scaled-dot-product attention, output projection, GeLU MLP."""
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
            self.up, self.down = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

        def forward(self, x):
            b, s, h = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, heads, h // heads).permute(2, 0, 3, 1, 4)
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
            return x + self.down(torch.nn.functional.gelu(self.up(self.ln2(x))))

    return Block()


def measure_profile(
    gpu: str, device: str = "cuda", tiny: bool = False, progress=None
) -> CostParams:
    torch = _torch()
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(
            "calibrate --measure",
            [Problem("--device", "no CUDA device here; use --device cpu", device, True)],
        )
    say = progress.print if progress is not None else (lambda *a, **k: None)
    spec = CATALOG[gpu]
    n, n_small, elems, hidden, heads, seq, mb, repeats = SIZES["tiny" if tiny else "full"]
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    timeit = _timer(torch, device)
    reserve_gib = None
    if device.startswith("cuda"):
        # What the runtime takes before any tensor: CUDA context, cuBLAS handles (on an otherwise
        # idle GPU).
        torch.cuda.init()
        torch.empty(1, device=device) @ torch.empty(1, device=device)
        free, total = torch.cuda.mem_get_info(torch.device(device))
        reserve_gib = (total - free - torch.cuda.memory_reserved(torch.device(device))) / 2**30
        say(f"runtime reserve: {reserve_gib:.2f} GiB before any tensor")

    a = torch.randn(n, n, device=device, dtype=dtype)
    t_gemm = timeit(lambda: a @ a, repeats)
    gemm_eff = min(1.0, 2 * n**3 / t_gemm / spec.peak_flops)
    say(f"GEMM {n}³: {2 * n**3 / t_gemm / 1e12:.2f} TFLOP/s = {gemm_eff:.1%} of {gpu} peak")
    s = torch.randn(n_small, n_small, device=device, dtype=dtype)
    t_small = timeit(lambda: s @ s, repeats * 10)
    say(f"GEMM {n_small}³: {t_small * 1e6:.1f} µs per kernel")
    x, y = (
        torch.randn(elems, device=device, dtype=dtype),
        torch.randn(elems, device=device, dtype=dtype),
    )
    t_add = timeit(lambda: x + y, repeats)
    mem_eff = min(1.0, 3 * elems * x.element_size() / t_add / (spec.hbm_gbps * 1e9 / 8))
    say(f"elementwise add of {elems:,} elements: {mem_eff:.1%} of {gpu} HBM bandwidth")

    base = Profiles().for_gpu(spec)
    weights = list(base.weights)
    weights[GEMM], weights[KERN], weights[MEM] = 1 / gemm_eff, t_small, 1 / mem_eff
    # flash attention follows the GEMM (ρ)
    weights[ATTN], _ = attention_weight(spec.family, weights[GEMM])

    block = _block(torch, hidden, heads).to(device=device, dtype=dtype)
    inp = torch.randn(mb, seq, hidden, device=device, dtype=dtype, requires_grad=True)

    def fwd_bwd() -> None:
        block(inp).sum().backward()

    t_block = timeit(fwd_bwd, repeats)
    model = ModelArch("measured-block", 1, hidden, heads, heads, 4 * hidden, False, 1, seq)
    work = stage_work(model, spec, mb, seq, 1, False, "flash", "none", 1, False, False).copy()
    work[:, MB] = 0.0  # one block, not a pipeline stage's micro-batch
    device_s = float(host_device(work[FWD] + work[BWD], np.array(weights))[1])
    # A launch-bound pass takes host + launch_serial × device time (evaluate.overlap_host_device);
    # forward and backward are two layer passes.
    weights[PASS] = max(0.0, (t_block - base.launch_serial * device_s) / 2)
    say(
        f"block h={hidden} fwd+bwd: {t_block * 1e3:.2f} ms; host time per layer pass "
        f"{weights[PASS] * 1e6:.0f} µs"
    )

    if reserve_gib is not None:
        base = replace(base, reserve_gib=reserve_gib)
    params = replace(
        base,
        gpu=gpu,
        weights=tuple(float(w) for w in weights),
        date=dt.date.today().isoformat(),
        source=f"measured with PyTorch {torch.__version__} on {_device_name(torch, device)}",
        method="GEMM, KERN, MEM and PASS measured (hetopt.calibrate.measure); LINK, NET, STEP, MB, "
        f"ITER, dp_overlap and launch_serial from {base.gpu} ({base.method[:60]}...)",
    )
    # The check: a block twice as wide and twice as long, measured and predicted with the new
    # profile.
    fit = {}
    for name, h, sl in (("block_fwd_bwd", hidden, seq), ("block_2x_fwd_bwd", 2 * hidden, 2 * seq)):
        blk = _block(torch, h, heads).to(device=device, dtype=dtype)
        inp = torch.randn(mb, sl, h, device=device, dtype=dtype, requires_grad=True)
        measured = timeit(lambda blk=blk, inp=inp: blk(inp).sum().backward(), repeats)
        arch = ModelArch("measured-block", 1, h, heads, heads, 4 * h, False, 1, sl)
        feats = stage_work(arch, spec, mb, sl, 1, False, "flash", "none", 1, False, False).copy()
        feats[:, MB] = 0.0
        predicted = float(price_parts(feats, params.w, params.launch_serial)[:2].sum())
        fit[name] = {
            "measured_ms": measured * 1e3,
            "predicted_ms": predicted * 1e3,
            "error": (predicted - measured) / measured,
        }
        say(
            f"{name} h={h} s={sl}: measured {measured * 1e3:.2f} ms, predicted "
            f"{predicted * 1e3:.2f} ms"
        )
    params = replace(params, fit=fit)
    return params


def _device_name(torch, device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return "CPU"
