"""Validate the cost model on published runs that are NOT in the calibration data.

Run: python benchmarks/validate_published.py
Prints predicted vs published iteration time per run, MAPE, and Spearman rank correlation.

Data: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
(arXiv:2205.05198), Table 3 (configurations) and Table 5 (iteration times) — GPT models of 22B to 1T
parameters on DGX A100 80GB nodes of NVIDIA's Selene (8 GPUs per node on NVSwitch, 8 × 200 Gbit/s
HDR InfiniBand per node), sequence 2048, vocabulary 51200. "full" is full activation recompute
without sequence parallelism; "present" is selective recompute with sequence parallelism.
Assumptions where the paper is silent: micro-batch 1 (4 for the 22B model, as in its Table 4), the
1F1B schedule, standard attention, no ZeRO. The 22B rows share their paper with the layer times used
in calibration (a different measurement: whole iterations here, one layer there), so they are not
fully out of sample.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from hetopt.evaluate import evaluate
from hetopt.layout import expand_layout, parse_layout
from hetopt.spec.instance import instance_from_spec
from hetopt.spec.load import validate_document
from hetopt.spec.schema import InstanceFile

# name, heads, hidden, layers, tp, pp, gpus, global batch, micro-batch, {config: published seconds}
RUNS = [
    ("22B", 64, 6144, 48, 8, 1, 8, 4, 4, {"full": 1.42, "present": 1.10}),
    ("175B", 96, 12288, 96, 8, 8, 64, 64, 1, {"full": 18.13, "present": 13.75}),
    ("530B", 128, 20480, 105, 8, 35, 280, 280, 1, {"full": 49.05, "present": 37.83}),
    ("1T", 160, 25600, 128, 8, 64, 512, 512, 1, {"full": 94.42, "present": 71.49}),
]
CONFIGS = {"full": "recompute=full,sp=false", "present": "recompute=selective,sp=true"}


def instance(heads: int, hidden: int, layers: int, gpus: int, batch: int):
    data = {
        "name": "selene",
        "model": {
            "layers": layers,
            "hidden": hidden,
            "heads": heads,
            "vocab": 51200,
            "max_seq_len": 2048,
        },
        "training": {"seq_len": 2048, "global_batch": batch, "attention": "standard"},
        "cluster": {
            "nodes": [
                {
                    "name": "dgx",
                    "count": gpus // 8,
                    "gpu": "A100-80GB",
                    "gpus_per_node": 8,
                    "nic_gbps": 1600,
                }
            ]
        },
    }
    return instance_from_spec(
        validate_document(data, "selene", InstanceFile, "instance"), "selene", Path(".")
    )


def main() -> None:
    predicted, published = [], []
    print(f"{'run':<14}{'layout':<52}{'published s':>12}{'predicted s':>12}{'error':>8}{'fits':>6}")
    for name, heads, hidden, layers, tp, pp, gpus, batch, mb, times in RUNS:
        inst = instance(heads, hidden, layers, gpus, batch)
        for config, seconds in times.items():
            layout = f"tp={tp},pp={pp},dp={gpus // (tp * pp)},mb={mb},zero=0,{CONFIGS[config]}"
            ev = evaluate(inst, expand_layout(inst, parse_layout(layout)))
            predicted.append(ev.iteration_time_s)
            published.append(seconds)
            err = ev.iteration_time_s / seconds - 1
            print(
                f"{name + ' ' + config:<14}{layout:<52}{seconds:>12.2f}"
                f"{ev.iteration_time_s:>12.2f}{err:>+8.1%}{'yes' if ev.fits else 'NO':>6}"
            )
    p, m = np.array(predicted), np.array(published)
    print(
        f"MAPE {np.mean(np.abs(p / m - 1)):.1%}, max {np.max(np.abs(p / m - 1)):.1%}, Spearman "
        f"{spearmanr(p, m).statistic:.3f} over {len(p)} runs (all ran: every one must fit)"
    )


if __name__ == "__main__":
    main()
