"""Measure one GPU with PyTorch and write calibration data in the formats `hetopt calibrate` reads.

    python benchmarks/measure_device.py --gpu H200 --out DIR [--tiny]

Needs only PyTorch (so it runs on a bare GPU machine without hetopt's solvers). Writes:
- `DIR/gemm.csv`: achieved bf16 TFLOP/s of torch.mm by shape (m, n, k): squares and the per-GPU GEMM
  shapes
  of transformer layers (QKV, output projection, MLP up/down at TP 1–8), the columns of
  data/calibration/public/gemm_achieved.csv;
- `DIR/layer_times.csv`: forward and backward milliseconds of one transformer layer (GPT block with
  flash
  or standard attention, LLaMA block with RMSNorm, SwiGLU and grouped-query attention), no recompute
  and full recompute, the columns of the Korthikanti layer-times file plus `attention`, `gated_mlp`,
  `kv_heads`, `ffn_hidden` and the activation bytes the forward kept (`stored_bytes`, from the
  allocator);
- `DIR/device.json`: the device's name, the memory it reports, what a program can allocate, the CUDA
  context's share, and achieved HBM bandwidth of an elementwise add and a copy.
Timing: CUDA events around `repeats` calls after warm-up calls; the statistic is the mean.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

DTYPE = torch.bfloat16


def timer(device: str):
    cuda = device.startswith("cuda")

    def mean_s(fn, repeats: int, warmup: int = 3) -> float:
        for _ in range(warmup):
            fn()
        if cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(repeats):
                fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3 / repeats
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        return (time.perf_counter() - t0) / repeats

    return mean_s


def gemm_shapes(tiny: bool) -> list[tuple[int, int, int, str]]:
    if tiny:
        return [(64, 64, 64, "square"), (128, 96, 64, "qkv tp1")]
    shapes = [(n, n, n, "square") for n in (256, 512, 1024, 2048, 4096, 8192, 16384)]
    for h in (1024, 2048, 4096, 8192, 12288):
        for tokens in (2048, 8192):
            for tp in (1, 2, 4, 8):
                if h // tp < 256:
                    continue
                shapes += [
                    (tokens, 3 * h // tp, h, f"qkv h={h} tp={tp}"),
                    (tokens, h, h // tp, f"proj h={h} tp={tp}"),
                    (tokens, 4 * h // tp, h, f"mlp-up h={h} tp={tp}"),
                    (tokens, h, 4 * h // tp, f"mlp-down h={h} tp={tp}"),
                ]
    return shapes


def measure_gemms(device: str, tiny: bool, gpu: str, software: str) -> list[dict]:
    mean_s = timer(device)
    rows = []
    for m, n, k, label in gemm_shapes(tiny):
        a = torch.randn(m, k, device=device, dtype=DTYPE)
        b = torch.randn(k, n, device=device, dtype=DTYPE)
        flops = 2.0 * m * n * k
        repeats = max(3, min(200, int(2e12 / flops) if not tiny else 3))
        t = mean_s(lambda a=a, b=b: torch.mm(a, b), repeats)
        rows.append(
            {
                "gpu": gpu,
                "gpu_variant": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
                "m": m,
                "n": n,
                "k": k,
                "batch": 1,
                "shape_label": label,
                "dtype": "bf16",
                "achieved_tflops": round(flops / t / 1e12, 2),
                "peak_tflops_claimed_by_source": "",
                "statistic": f"mean of {repeats} after 3 warm-up (CUDA events)",
                "tool_or_library": "torch.mm",
                "software": software,
                "source": "hetopt benchmarks/measure_device.py",
                "confidence": "EXACT",
                "notes": "",
            }
        )
        del a, b
    return rows


class RMSNorm(nn.Module):
    def __init__(self, h: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h))

    def forward(self, x):
        return (
            x
            * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(x.dtype)
            * self.weight
        )


class Block(nn.Module):
    """One transformer layer: GPT (LayerNorm, GeLU MLP) or LLaMA (RMSNorm, SwiGLU,
    grouped-query)."""

    def __init__(
        self, h: int, heads: int, kv_heads: int, ffn: int, gated: bool, attention: str
    ) -> None:
        super().__init__()
        self.h, self.heads, self.kv, self.gated, self.attention = (
            h,
            heads,
            kv_heads,
            gated,
            attention,
        )
        d = h // heads
        norm = RMSNorm if gated else nn.LayerNorm
        self.n1, self.n2 = norm(h), norm(h)
        self.qkv = nn.Linear(h, h + 2 * kv_heads * d, bias=not gated)
        self.proj = nn.Linear(h, h, bias=not gated)
        self.up = nn.Linear(h, (2 if gated else 1) * ffn, bias=not gated)
        self.down = nn.Linear(ffn, h, bias=not gated)

    def attend(self, q, k, v):
        if self.kv != self.heads:
            k = k.repeat_interleave(self.heads // self.kv, dim=1)
            v = v.repeat_interleave(self.heads // self.kv, dim=1)
        if self.attention == "flash":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        s = q.shape[-2]
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        mask = torch.ones(s, s, device=q.device, dtype=torch.bool).triu(1)
        return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v

    def forward(self, x):
        b, s, h = x.shape
        d = h // self.heads
        qkv = self.qkv(self.n1(x))
        q, k, v = qkv.split([h, self.kv * d, self.kv * d], dim=-1)
        q = q.view(b, s, self.heads, d).transpose(1, 2)
        k = k.view(b, s, self.kv, d).transpose(1, 2)
        v = v.view(b, s, self.kv, d).transpose(1, 2)
        x = x + self.proj(self.attend(q, k, v).transpose(1, 2).reshape(b, s, h))
        u = self.up(self.n2(x))
        if self.gated:
            gate, up = u.chunk(2, dim=-1)
            u = F.silu(gate) * up
        else:
            u = F.gelu(u)
        return x + self.down(u)


def layer_configs(tiny: bool) -> list[tuple]:
    # (name, hidden, heads, kv_heads, ffn, gated, seq, micro-batches)
    if tiny:
        return [("gpt-tiny", 64, 4, 4, 256, False, 32, (1, 2))]
    return [
        ("gpt-1.3b", 2048, 16, 16, 8192, False, 2048, (1, 4)),
        ("gpt-350m", 1024, 16, 16, 4096, False, 1024, (1, 8)),
        ("gpt-6.7b", 4096, 32, 32, 16384, False, 2048, (1, 4)),
        ("gpt-13b", 5120, 40, 40, 20480, False, 2048, (1, 2)),
        ("gpt-22b", 6144, 64, 64, 24576, False, 2048, (1, 4)),
        ("gpt-175b", 12288, 96, 96, 49152, False, 2048, (1,)),
        ("llama-7b", 4096, 32, 32, 11008, True, 4096, (1, 2)),
        ("llama3-8b", 4096, 32, 8, 14336, True, 8192, (1,)),
        ("llama2-70b", 8192, 64, 8, 28672, True, 4096, (1, 2)),
    ]


def time_layer(
    block: nn.Module, x, recompute: str, mean_s, repeats: int
) -> tuple[float, float, float]:
    """(forward s, forward + backward s, bytes the forward left allocated) of one layer on input
    x."""

    def fwd():
        if recompute == "full":
            return torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
        return block(x)

    def fwd_only():
        with torch.no_grad() if recompute == "full" else torch.enable_grad():
            return fwd()

    grad = torch.randn_like(x)
    t_fwd = mean_s(fwd_only, repeats)
    stored = 0.0
    if x.is_cuda:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        y = fwd()
        torch.cuda.synchronize()
        stored = float(torch.cuda.memory_allocated() - before - y.numel() * y.element_size())
        del y
    t_both = mean_s(lambda: fwd().backward(grad), repeats)
    block.zero_grad(set_to_none=True)
    x.grad = None
    return t_fwd, t_both, stored


def measure_layers(device: str, tiny: bool, gpu: str, software: str) -> list[dict]:
    mean_s = timer(device)
    rows = []
    repeats = 3 if tiny else 10
    for name, h, heads, kv, ffn, gated, s, mbs in layer_configs(tiny):
        for attention in ("flash", "standard"):
            if attention == "standard" and (gated or h > 6144):
                continue  # the s×s scores of big models: flash only, as they are trained
            block = Block(h, heads, kv, ffn, gated, attention).to(device=device, dtype=DTYPE)
            for b in mbs:
                x = torch.randn(b, s, h, device=device, dtype=DTYPE, requires_grad=True)
                for recompute in ("none", "full"):
                    t_fwd, t_both, stored = time_layer(block, x, recompute, mean_s, repeats)
                    rows.append(
                        {
                            "model": name,
                            "heads": heads,
                            "kv_heads": kv,
                            "hidden": h,
                            "ffn_hidden": ffn,
                            "gated_mlp": gated,
                            "layers": 1,
                            "tp": 1,
                            "micro_batch": b,
                            "seq_len": s,
                            "vocab": 50257,
                            "gpu": gpu,
                            "attention": attention,
                            "config": "baseline full recompute"
                            if recompute == "full"
                            else "baseline no recompute",
                            "layer_fwd_ms": round(t_fwd * 1e3, 4),
                            "layer_bwd_ms": round((t_both - t_fwd) * 1e3, 4),
                            "layer_total_ms": round(t_both * 1e3, 4),
                            "stored_bytes": stored,
                            "source": f"hetopt benchmarks/measure_device.py ({software})",
                        }
                    )
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
    return rows


def measure_device(device: str, tiny: bool) -> dict:
    out: dict = {"device": device}
    mean_s = timer(device)
    n = 2**20 if tiny else 2**28
    a = torch.randn(n, device=device, dtype=DTYPE)
    b = torch.randn(n, device=device, dtype=DTYPE)
    t_add = mean_s(lambda a=a, b=b: a + b, 20)
    t_copy = mean_s(lambda a=a: a.clone(), 20)
    out["elementwise_add_gbyte_s"] = 3 * n * 2 / t_add / 1e9
    out["copy_gbyte_s"] = 2 * n * 2 / t_copy / 1e9
    a = b = None  # free them before the allocation probe
    if not device.startswith("cuda"):
        return out
    torch.cuda.empty_cache()
    props = torch.cuda.get_device_properties(0)
    free, total = torch.cuda.mem_get_info()
    out.update(
        name=props.name,
        total_memory_bytes=props.total_memory,
        mem_get_info_total=total,
        mem_get_info_free=free,
        context_and_runtime_bytes=total - free - torch.cuda.memory_reserved(),
        multiprocessors=props.multi_processor_count,
    )
    blocks, chunk = [], 2**30
    try:
        while True:
            blocks.append(torch.empty(chunk, dtype=torch.uint8, device=device))
    except torch.OutOfMemoryError:
        pass
    small = 2**26
    try:
        while True:
            blocks.append(torch.empty(small, dtype=torch.uint8, device=device))
    except torch.OutOfMemoryError:
        pass
    out["allocatable_bytes"] = sum(x.numel() for x in blocks)
    del blocks
    torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", required=True, help="hetopt catalog name of the GPU measured")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--tiny", action="store_true", help="tiny sizes (a CPU smoke test)")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    args.out.mkdir(parents=True, exist_ok=True)
    software = f"torch {torch.__version__}" + (
        f", CUDA {torch.version.cuda}" if torch.version.cuda else ""
    )
    info = {
        "gpu": args.gpu,
        "date": dt.date.today().isoformat(),
        "software": software,
        "method": "benchmarks/measure_device.py: CUDA-event means after warm-up",
        **measure_device(device, args.tiny),
    }
    (args.out / "device.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info), flush=True)
    for name, rows in (
        ("gemm.csv", measure_gemms(device, args.tiny, args.gpu, software)),
        ("layer_times.csv", measure_layers(device, args.tiny, args.gpu, software)),
    ):
        with (args.out / name).open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        print(f"{name}: {len(rows)} rows", flush=True)


if __name__ == "__main__":
    main()
