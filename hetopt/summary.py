"""What `hetopt validate` reports about an instance: the cluster, the model and the work per
iteration."""

from __future__ import annotations

from typing import Any

from hetopt.cost.flops import layer_params, model_flops_per_token, total_params
from hetopt.spec.instance import Instance


def instance_summary(inst: Instance) -> dict[str, Any]:
    """A JSON-ready summary; every figure is derived from the instance and the catalog."""
    m, cluster = inst.model, inst.cluster
    tokens_per_iteration = inst.global_batch * inst.seq_len
    flops_per_token = model_flops_per_token(m, inst.seq_len)
    flops_per_iteration = flops_per_token * tokens_per_iteration
    classes = []
    for dc in cluster.device_classes.values():
        gpu = inst.gpu_types[dc.gpu]
        classes.append(
            {
                "class": dc.label,
                "gpu": dc.gpu,
                "island": dc.island,
                "nodes": len(dc.nodes),
                "gpus": dc.gpus,
                "gpus_per_node": dc.max_gpus_per_node,
                "nic_gbps": dc.min_nic_gbps,
                "memory_gib": dc.gpus * gpu.memory_gib,
                "peak_tflops": dc.gpus * gpu.peak_tflops,
            }
        )
    total_peak_flops = cluster.total_peak_tflops * 1e12
    return {
        "name": inst.name,
        "path": str(inst.path) if inst.path else None,
        "description": inst.spec.description,
        "model": {
            "name": m.name,
            "layers": m.layers,
            "hidden": m.hidden,
            "heads": m.heads,
            "kv_heads": m.kv_heads,
            "ffn_hidden": m.ffn_hidden,
            "gated_mlp": m.gated_mlp,
            "vocab": m.vocab,
            "params": total_params(m),
            "params_per_layer": layer_params(m),
            "source": m.source,
        },
        "training": {
            "seq_len": inst.seq_len,
            "global_batch": inst.global_batch,
            "tokens_per_iteration": tokens_per_iteration,
            "precision": inst.precision,
            "attention": inst.spec.training.attention,
            "norm_kernel": inst.spec.training.norm_kernel,
            "framework": inst.spec.training.framework,
        },
        "flops_per_token": flops_per_token,
        "flops_per_iteration": flops_per_iteration,
        # A bound no plan can beat: all model FLOPs at the peak of every GPU, no communication.
        "iteration_time_at_peak_s": flops_per_iteration / total_peak_flops,
        "device_classes": classes,
        "totals": {
            "nodes": len(cluster.nodes),
            "gpus": cluster.total_gpus,
            "islands": len(cluster.islands),
            "memory_gib": cluster.total_memory_gib,
            "peak_tflops": cluster.total_peak_tflops,
        },
        "links": [
            {"a": lk.a, "b": lk.b, "gbps": lk.gbps, "latency_us": lk.latency_us}
            for lk in inst.spec.cluster.network.links
        ],
        "scenarios": [
            {
                "name": sc.name,
                "probability": sc.probability,
                "kind": sc.generator.kind if sc.generator else "events",
            }
            for sc in inst.spec.scenarios
        ]
        or [{"name": "stable", "probability": 1.0, "kind": "stable"}],
    }
