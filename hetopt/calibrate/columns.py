"""The CSV files calibration reads, one :class:`~hetopt.csvfile.CsvKind` each: the columns a file
must have and what each cell may hold (hetopt/csvfile.py reads and checks them)."""

from __future__ import annotations

from typing import get_args

from hetopt.csvfile import (
    Column,
    CsvKind,
    bandwidth_range,
    byte_size,
    choice,
    count,
    count_or_words,
    percent,
    positive,
)
from hetopt.spec.kernels import Attention


def _counts(*names: str, needed: bool = True, filled: bool = False) -> tuple[Column, ...]:
    """Columns of whole numbers ≥ 1 (num_nodes may also say ">1", read as unstated)."""
    return tuple(
        Column(n, count_or_words if n == "num_nodes" else count, needed, filled) for n in names
    )


RUNS_CSV = CsvKind(
    "an end-to-end runs CSV",
    "data/calibration/public/training_throughput_non_a100.csv",
    (
        Column("gpu"),
        Column("model"),
        Column("source"),
        *_counts("num_gpus", "gpus_per_node", "seq_len", "micro_batch", "tp", "pp", "dp"),
        *_counts(
            "num_nodes",
            "n_layers",
            "hidden",
            "ffn_hidden",
            "n_heads",
            "n_kv_heads",
            "vocab",
            "global_batch_seqs",
            "grad_accum",
            "cp",
            needed=False,
        ),
        Column("achieved_tflops_per_gpu", positive, False, what="the measured TFLOP/s per GPU"),
        Column("tokens_per_s_per_gpu", positive, False, what="the measured tokens/s per GPU"),
        Column("iteration_time_s", positive, False, what="the measured seconds per iteration"),
        Column("peak_tflops_used_for_mfu", positive, False),
        Column("mfu_pct", percent, False),
        Column("hfu_pct", percent, False),
    ),
)
GEMM_CSV = CsvKind(
    "a GEMM measurements CSV",
    "data/calibration/public/gemm_achieved.csv",
    (
        Column("gpu", filled=True),
        Column("gpu_variant"),
        Column("m", count_or_words),
        Column("n", count_or_words),
        Column("k", count_or_words),
        Column("batch", count),
        Column("dtype", filled=True),
        Column("achieved_tflops", positive, filled=True, what="the measured TFLOP/s"),
        Column("source"),
        Column("confidence"),
    ),
)
FABRICS_CSV = CsvKind(
    "a collectives CSV",
    "data/calibration/public/collectives_achieved.csv",
    (
        Column("fabric", filled=True),
        Column("collective", filled=True),
        Column("nominal_gbit_s", positive, what="the fabric's nominal Gbit/s"),
        Column("message_size_bytes", byte_size),
        Column("busbw_GBps", bandwidth_range),
        Column("algbw_GBps", positive, what="the measured algorithm bandwidth in GB/s"),
        Column("other_metric"),
        Column("num_gpus", count_or_words),
        Column("num_nodes", count_or_words),
        Column("gpus_per_node", count_or_words),
        Column("algorithm_or_env"),
        Column("source"),
    ),
)
LAYOUTS_CSV = CsvKind(
    "a layout-runs CSV",
    "data/calibration/a100_single_node_megatron_deepspeed.csv",
    (
        *_counts(
            "gpus",
            "global_batch",
            "micro_batch",
            "hidden",
            "heads",
            "layers",
            "seq_len",
            "tp",
            "dp",
            "pp",
            filled=True,
        ),
        Column("iter_time_ms", positive, filled=True, what="the measured iteration time in ms"),
        Column("activation_recompute", needed=False),
    ),
)
LAYERS_CSV = CsvKind(
    "a layer-times CSV",
    "data/calibration/a100_22b_layer_times_korthikanti2022.csv",
    (
        *_counts("heads", "hidden", "tp", "micro_batch", "seq_len", filled=True),
        Column("layers", count, needed=False),
        Column("vocab", count, needed=False),
        Column("kv_heads", count, needed=False),
        Column("ffn_hidden", count, needed=False),
        Column("config"),
        Column("layer_fwd_ms", positive, filled=True, what="the measured forward time in ms"),
        Column("layer_bwd_ms", positive, filled=True, what="the measured backward time in ms"),
        Column("layer_total_ms", positive, needed=False),
        Column("attention", choice(*get_args(Attention)), needed=False),
    ),
)
OUTCOMES_CSV = CsvKind(
    "a run-outcomes CSV",
    "data/calibration/public/hagemann_llama13b_runs.csv",
    (
        *_counts(
            "layers",
            "hidden",
            "heads",
            "ffn_hidden",
            "vocab",
            "seq_len",
            "gpus",
            "gpus_per_node",
            "tp",
            "pp",
            "dp",
            "micro_batch",
            filled=True,
        ),
        Column("gpu", filled=True),
        Column("activation_checkpointing"),
        Column("attention_kernel"),
        Column("sequence_parallel"),
        Column("precision"),
        Column("status", filled=True),
        Column("step_time_s", positive, needed=False, what="the measured seconds, or nothing"),
    ),
)
