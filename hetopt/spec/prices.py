"""On-demand rental prices of the catalog's GPU types, per GPU-hour, each with its offer, source and
date (docs/cost-model.md, "Dollars").

A price is one public cloud's on-demand list price of one offer, divided by the GPUs the offer has:
it includes the host (CPU, memory, local disk) the offer bundles, as a rented node does. Prices
differ several-fold between providers and change often: an instance overrides them per node group
(`cluster.nodes[].usd_per_hour`, per node), and a custom GPU type may carry its own
(`cluster.gpus.<name>.usd_per_hour`, per GPU). None of these numbers enter the time model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hetopt.spec.schema import ClusterSection, NodeGroup


@dataclass(frozen=True)
class Price:
    """One GPU type's on-demand price.

    usd_per_gpu_hour: the offer's hourly price ÷ its GPUs; provider, offer: whose list and which
    machine; source: where the figure was read; as_of: the date the source gives for it."""

    usd_per_gpu_hour: float
    provider: str
    offer: str
    source: str
    as_of: str


_RUNPOD = (
    "RunPod on-demand list, as tabulated in Deploybase, 'RunPod GPU Pricing: 2026 Comprehensive "
    "Pricing Guide' (deploybase.ai/articles/runpod-gpu-pricing)"
)
_AWS = "AWS EC2 On-Demand pricing, US East (N. Virginia), Linux (aws.amazon.com/ec2/pricing)"
_SAILOR = (
    "Google Cloud on-demand prices used by Sailor (Strati et al., SOSP 2025) in its artifact's "
    "price table (us-central1)"
)

PRICES: dict[str, Price] = {
    "V100-16GB": Price(2.859998, "Google Cloud", "n1 VM + 1× V100 16GB", _SAILOR, "2025"),
    "V100-32GB": Price(31.212 / 8, "AWS", "p3dn.24xlarge ($31.212/h) ÷ 8", _AWS, "2025"),
    "A100-40GB": Price(3.673385, "Google Cloud", "a2-highgpu-1g (1× A100 40GB)", _SAILOR, "2025"),
    "A100-80GB": Price(2.45, "RunPod", "A100 SXM 80GB", _RUNPOD, "2026-03"),
    "H100-SXM": Price(4.76, "RunPod", "H100 SXM 80GB", _RUNPOD, "2026-03"),
    "H100-PCIe": Price(3.51, "RunPod", "H100 PCIe 80GB", _RUNPOD, "2026-03"),
    "H200": Price(6.35, "RunPod", "H200 141GB", _RUNPOD, "2026-03"),
    "GH200": Price(
        1.49,
        "Lambda",
        "1× GH200 96GB",
        "Lambda Cloud on-demand pricing (lambda.ai/pricing)",
        "2025",
    ),
    "L4": Price(0.78, "RunPod", "L4 24GB", _RUNPOD, "2026-03"),
    "L40S": Price(1.40, "RunPod", "L40S 48GB", _RUNPOD, "2026-03"),
    "A10G": Price(1.006, "AWS", "g5.xlarge (1× A10G)", _AWS, "2025"),
    "T4": Price(0.526, "AWS", "g4dn.xlarge (1× T4)", _AWS, "2025"),
    "RTX-3090": Price(0.39, "RunPod", "RTX 3090 24GB", _RUNPOD, "2026-03"),
    "RTX-4090": Price(0.60, "RunPod", "RTX 4090 24GB", _RUNPOD, "2026-03"),
    "MI250X": Price(
        1.35,
        "Runcrate",
        "MI250X on-demand",
        "gpu.blog provider listing for the AMD Instinct MI250X (gpu.blog/gpus/instinct-mi250x-"
        "mi250x)",
        "2026",
    ),
    "MI300X": Price(
        1.85,
        "Vultr",
        "MI300X on-demand",
        "Cliff Center research note 'AMD inference economics' (cliffcenter.com/research/amd-"
        "inference-economics)",
        "2026-05-18",
    ),
}
"""Catalog GPU type → its price; `hetopt gpus` shows them."""

GB = 1e9
"""Bytes in the GB that clouds price data transfer in."""


def catalog_price(gpu: str) -> Price | None:
    """The catalog's price of a GPU type, or None (a custom type without one)."""
    return PRICES.get(gpu)


def node_usd_per_hour(group: NodeGroup, cluster: ClusterSection) -> float | None:
    """What one node of a group costs per hour: the group's own `usd_per_hour`; else, for a GPU type
    the instance declares, its `usd_per_hour` per GPU × the node's GPUs; else the catalog's price ×
    the node's GPUs; None where none of them is known."""
    if group.usd_per_hour is not None:
        return group.usd_per_hour
    if group.gpu in cluster.gpus:
        per_gpu = cluster.gpus[group.gpu].usd_per_hour
    else:
        price = catalog_price(group.gpu)
        per_gpu = price.usd_per_gpu_hour if price else None
    return None if per_gpu is None else per_gpu * group.gpus_per_node
