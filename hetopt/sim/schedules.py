"""Per-device operation order of the pipeline schedules (Narayanan et al. 2021, §2.2).

An op is (kind, chunk, micro-batch): kind "F" or "B", chunk the model chunk (virtual stage) on the
device. Virtual stage v = chunk·p + device. Each device executes its ops in this order; an op also
waits for its input (activations from v−1 for F, gradients from v+1 for B).
"""

from __future__ import annotations

from hetopt.errors import InputError, Problem

Op = tuple[str, int, int]


def device_ops(
    schedule: str, stages: int, micro_batches: int, device: int, virtual_stages: int = 1
) -> list[Op]:
    p, m = stages, micro_batches
    if schedule == "gpipe":
        return [("F", 0, i) for i in range(m)] + [("B", 0, i) for i in range(m)]
    if virtual_stages == 1:
        warmup = min(p - device - 1, m)
        ops: list[Op] = [("F", 0, i) for i in range(warmup)]
        for i in range(m - warmup):
            ops += [("F", 0, warmup + i), ("B", 0, i)]
        return ops + [("B", 0, i) for i in range(m - warmup, m)]
    return _interleaved(p, m, device, virtual_stages)


def _interleaved(p: int, m: int, device: int, vp: int) -> list[Op]:
    """Megatron-LM's interleaved 1F1B: micro-batches in groups of p run through chunk 0, then chunk
    1, ..."""
    if m % p:
        raise InputError(
            "plan",
            [
                Problem(
                    "pipelines[].micro_batches",
                    f"the interleaved schedule needs the micro-batches divisible by the {p} stages",
                    m,
                    True,
                )
            ],
        )
    total = m * vp
    warmup = min((p - device - 1) * 2 + (vp - 1) * p, total)

    def op(kind: str, k: int) -> Op:
        in_group = k % (p * vp)
        chunk = in_group // p
        return (kind, chunk if kind == "F" else vp - 1 - chunk, (k // (p * vp)) * p + in_group % p)

    ops = [op("F", k) for k in range(warmup)]
    for k in range(total - warmup):
        ops += [op("F", warmup + k), op("B", k)]
    return ops + [op("B", k) for k in range(total - warmup, total)]
