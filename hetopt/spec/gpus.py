"""The GPU catalog: published peak figures of the GPU types hetopt knows, each with its source.

Units follow the instance format (DESIGN 2.1): ``peak_tflops`` is dense (no sparsity) 16-bit tensor-core
TFLOP/s with FP32 accumulation, the mode mixed-precision training runs in; ``memory_gib`` is the device
memory as the datasheet states it (HBM/GDDR capacities are binary: an A100-80GB reports 81920 MiB);
``hbm_gbps`` is device-memory bandwidth in Gbit/s (datasheet GB/s × 8); ``intra_node_gbps`` is the
bandwidth one GPU can send to its peers inside a node, per direction, in Gbit/s (NVLink/xGMI aggregate / 2,
or one direction of the PCIe slot for GPUs without a GPU-to-GPU fabric).

These are peak figures; how much of them a kernel reaches is the calibrated efficiency of the cost model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GBYTE_TO_GBIT = 8.0


@dataclass(frozen=True)
class GPUType:
    """One GPU type with published peak figures."""

    name: str
    peak_tflops: float
    """Dense 16-bit tensor TFLOP/s (FP32 accumulate)."""
    memory_gib: float
    hbm_gbps: float
    """Device-memory bandwidth, Gbit/s."""
    intra_node_gbps: float
    """Per-GPU, per-direction bandwidth to peers in the same node, Gbit/s."""
    interconnect: str = ""
    """What carries intra-node traffic (NVLink 3, PCIe 4.0 x16, ...)."""
    sources: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    """Field name → where the number comes from."""

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * 2**30

    @property
    def peak_flops(self) -> float:
        """Peak FLOP/s."""
        return self.peak_tflops * 1e12


def _gpu(
    name: str,
    peak_tflops: float,
    memory_gib: float,
    hbm_gbyte_s: float,
    intra_node_gbyte_s: float,
    interconnect: str,
    datasheet: str,
    link_source: str | None = None,
    peak_note: str = "",
) -> GPUType:
    """Build a catalog entry from datasheet units (GB/s) and record the source of every field."""
    link_source = link_source or datasheet
    return GPUType(
        name=name,
        peak_tflops=peak_tflops,
        memory_gib=memory_gib,
        hbm_gbps=hbm_gbyte_s * GBYTE_TO_GBIT,
        intra_node_gbps=intra_node_gbyte_s * GBYTE_TO_GBIT,
        interconnect=interconnect,
        sources={
            "peak_tflops": f"{datasheet}: dense FP16/BF16 tensor {peak_tflops:g} TFLOPS{peak_note}",
            "memory_gib": f"{datasheet}: {memory_gib:g} GB device memory",
            "hbm_gbps": f"{datasheet}: memory bandwidth {hbm_gbyte_s:g} GB/s (× 8 bit/byte)",
            "intra_node_gbps": f"{link_source}: {interconnect}, {intra_node_gbyte_s:g} GB/s per direction",
        },
    )


_PCIE3 = "PCI Express 3.0 x16 specification: 15.75 GB/s per direction, rounded to 16"
_PCIE4 = "PCI Express 4.0 x16 specification: 31.5 GB/s per direction, rounded to 32"
_PCIE5 = "PCI Express 5.0 x16 specification: 63 GB/s per direction, rounded to 64"

CATALOG: dict[str, GPUType] = {
    g.name: g
    for g in [
        # NVLink 2 on V100 SXM2: 300 GB/s aggregate (both directions, 6 links) → 150 GB/s per direction.
        _gpu("V100-16GB", 125, 16, 900, 150, "NVLink 2", "NVIDIA Tesla V100 datasheet (SXM2)"),
        _gpu("V100-32GB", 125, 32, 900, 150, "NVLink 2", "NVIDIA Tesla V100 datasheet (SXM2)"),
        # NVLink 3 on A100 SXM4: 600 GB/s aggregate → 300 GB/s per direction.
        _gpu("A100-40GB", 312, 40, 1555, 300, "NVLink 3", "NVIDIA A100 Tensor Core GPU datasheet (SXM4 40GB)"),
        _gpu("A100-80GB", 312, 80, 2039, 300, "NVLink 3", "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB)"),
        # NVLink 4 on H100/H200 SXM: 900 GB/s aggregate → 450 GB/s per direction.
        _gpu("H100-SXM", 989, 80, 3350, 450, "NVLink 4", "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM)"),
        _gpu("H100-PCIe", 756, 80, 2000, 64, "PCIe 5.0", "NVIDIA H100 Tensor Core GPU datasheet (H100 PCIe)",
             link_source=_PCIE5),
        _gpu("H200", 989, 141, 4800, 450, "NVLink 4", "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM)"),
        _gpu("GH200", 989, 96, 4000, 450, "NVLink 4", "NVIDIA GH200 Grace Hopper Superchip datasheet (96GB HBM3)"),
        _gpu("L4", 121, 24, 300, 32, "PCIe 4.0", "NVIDIA L4 Tensor Core GPU datasheet", link_source=_PCIE4),
        _gpu("L40S", 362, 48, 864, 32, "PCIe 4.0", "NVIDIA L40S GPU datasheet", link_source=_PCIE4),
        # AWS publishes no tensor figures for the A10G; it is a GA102 A10 variant, so the A10 datasheet is used.
        _gpu("A10G", 125, 24, 600, 32, "PCIe 4.0", "NVIDIA A10 Tensor Core GPU datasheet (AWS A10G variant)",
             link_source=_PCIE4),
        _gpu("T4", 65, 16, 320, 16, "PCIe 3.0", "NVIDIA T4 Tensor Core GPU datasheet", link_source=_PCIE3,
             peak_note=" (FP16 mixed precision; no BF16)"),
        _gpu("RTX-3090", 71, 24, 936, 32, "PCIe 4.0", "NVIDIA Ampere GA102 GPU architecture whitepaper (RTX 3090)",
             link_source=_PCIE4, peak_note=" with FP32 accumulate"),
        _gpu("RTX-4090", 165.2, 24, 1008, 32, "PCIe 4.0", "NVIDIA Ada GPU architecture whitepaper (RTX 4090)",
             link_source=_PCIE4, peak_note=" with FP32 accumulate"),
        # Infinity Fabric: MI250X 8 links, 800 GB/s aggregate; MI300X 7 links × 128 GB/s = 896 GB/s aggregate.
        _gpu("MI250X", 383, 128, 3276.8, 400, "xGMI ×8", "AMD Instinct MI250X accelerator datasheet"),
        _gpu("MI300X", 1307.4, 192, 5300, 448, "xGMI ×7", "AMD Instinct MI300X accelerator datasheet"),
    ]
}


def custom_gpu(name: str, peak_tflops: float, memory_gib: float, hbm_gbps: float, intra_node_gbps: float,
               source: str) -> GPUType:
    """A GPU type declared in an instance file (``cluster.gpus``); every field's source is that file."""
    return GPUType(
        name=name,
        peak_tflops=peak_tflops,
        memory_gib=memory_gib,
        hbm_gbps=hbm_gbps,
        intra_node_gbps=intra_node_gbps,
        interconnect="as declared",
        sources={f: source for f in ("peak_tflops", "memory_gib", "hbm_gbps", "intra_node_gbps")},
    )
