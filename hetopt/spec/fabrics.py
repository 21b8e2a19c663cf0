"""Fabrics: what fraction of its nominal bandwidth each interconnect delivers, and its per-step
latency.

A fabric f has two numbers:

- η_f: the achieved fraction of the nominal per-direction bandwidth for large messages. Nominal is
  the
  catalog's ``intra_node_gbps`` inside a node, and the instance's ``nic_gbps`` or link ``gbps``
  outside.
- α_f: the latency of one collective step, seconds. A ring all-reduce of n ranks has 2(n − 1) steps.

A collective of B bytes on fabric f takes bytes(B) / (η_f · nominal) + steps · α_f
(hetopt.cost.comm). The table ships as ``hetopt/cost/profiles/fabrics.json``, fitted on nccl-tests
results by ``hetopt calibrate --fabrics`` (hetopt.calibrate.fabrics says how each fabric gets its
numbers).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources

# -- the fabrics
# ------------------------------------------------------------------------------------------

NAMES = (
    "nvlink2",
    "nvlink3",
    "nvlink4",
    "nvlink5",
    "xgmi",
    "pcie3",
    "pcie4",
    "pcie5",
    "pcie3_host",
    "pcie4_host",
    "pcie5_host",
    "infiniband",
    "roce",
    "efa",
    "tcpxo",
    "omnipath",
    "tcp",
    "ideal",
)
"""Every fabric name an instance may use. ``pcieN``: GPUs talk peer-to-peer through a PCIe switch;
``pcieN_host``: through the CPU's root complex (no P2P, e.g. consumer boards or GPUs under different
CPU sockets). ``ideal``: line rate and no latency (hand-worked examples)."""

MESH = ("xgmi",)
"""All-to-all point-to-point links (AMD Infinity Fabric): a GPU reaches each peer over its own link,
so a group of n GPUs in a node of g uses n − 1 of its g − 1 links (the MI300X rows: 2 GPUs reach
47.7 GB/s of one 64 GB/s link, 8 GPUs 313 GB/s of 7 links)."""

RDMA_GBPS = 100.0
"""Default rule for NICs and links that name no fabric: below 100 Gbit/s it is TCP Ethernet
(1/10/25/40/50 GbE, no RDMA in commodity NICs), from 100 Gbit/s on an RDMA fabric (InfiniBand)."""

INTERCONNECT = {
    "NVLink 2": "nvlink2",
    "NVLink 3": "nvlink3",
    "NVLink 4": "nvlink4",
    "NVLink 5": "nvlink5",
    "PCIe 3.0": "pcie3",
    "PCIe 4.0": "pcie4",
    "PCIe 5.0": "pcie5",
    "xGMI": "xgmi",
}
"""Catalog ``interconnect`` (hetopt/spec/gpus.py) → fabric, matched on the start of the string."""


@dataclass(frozen=True)
class Fabric:
    name: str
    eta: float
    """Achieved fraction of nominal per-direction bandwidth, large messages."""
    alpha_s: float
    """Latency per collective step, seconds."""
    source: str = ""

    @property
    def mesh(self) -> bool:
        return self.name in MESH


IDEAL = Fabric("ideal", 1.0, 0.0, "line rate, no latency (by definition)")


def intra_default(interconnect: str) -> str:
    """The fabric of a GPU's catalog interconnect; custom GPUs (``as declared``) and unknown ones:
    pcie4."""
    for prefix, name in INTERCONNECT.items():
        if interconnect.startswith(prefix):
            return name
    return "pcie4"


def nic_default(gbps: float) -> str:
    return "tcp" if gbps < RDMA_GBPS else "infiniband"


@cache
def table() -> dict[str, Fabric]:
    """The shipped fabric table (hetopt/cost/profiles/fabrics.json), by name; read once per
    process."""
    path = resources.files("hetopt.cost").joinpath("profiles", "fabrics.json")
    data = json.loads(path.read_text("utf-8"))
    found = {n: Fabric(n, f["eta"], f["alpha_s"], f["source"]) for n, f in data["fabrics"].items()}
    return {**found, "ideal": IDEAL}


def get(name: str) -> Fabric:
    return table()[name]
