"""The GPU catalog: published peak figures of the GPU types hetopt knows, each with its source.

Units follow the instance format (docs/instance-format.md): ``peak_tflops`` is dense (no sparsity)
16-bit tensor-core TFLOP/s with FP32 accumulation, the mode mixed-precision training runs in;
``memory_gib`` is the device memory as the datasheet states it (HBM/GDDR capacities are binary: an
A100-80GB reports 81920 MiB); ``hbm_gbps`` is device-memory bandwidth in Gbit/s (datasheet GB/s ×
8); ``intra_node_gbps`` is the bandwidth one GPU can send to its peers inside a node, per direction,
in Gbit/s (NVLink/xGMI aggregate / 2, or one direction of the PCIe slot for GPUs without a
GPU-to-GPU fabric).

These are peak figures; how much of them a kernel reaches is the calibrated efficiency of the cost
model.

Each type also carries its architecture ``family`` (which calibrated types it resembles), its
datasheet board power ``tdp_w`` (the power cap that bounds sustained clocks: a 70 W T4 sustains ~24
of its 65 TFLOP/s) and ``usable_memory_gib``: the device memory the CUDA/ROCm driver reports to a
program (cudaMemGetInfo total, ``torch.cuda.mem_get_info()[1]``), which is what allocations can use
(the CUDA context comes out of it and is priced by the profile's ``reserve_gib``). It is below the
datasheet figure: ECC on GDDR6 datacenter boards takes 1/16 (T4: 15360 MiB in nvidia-smi), and the
driver keeps a further few hundred MiB (H200: nvidia-smi 143771 MiB, the program sees 143157 MiB =
139.80 GiB, measured with benchmarks/measure_device.py). The rule per type is in
``sources["usable_memory_gib"]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hetopt.spec.formats import FORMAT, FORMAT_EFFICIENCY

GBYTE_TO_GBIT = 8.0
MIB = 1 / 1024
"""GiB per MiB."""

FAMILIES = ("volta", "turing", "ampere", "ada", "hopper", "cdna2", "cdna3")
"""Architecture families: NVIDIA Volta (GV100), Turing (TU10x), Ampere (GA10x), Ada Lovelace
(AD10x), Hopper (GH100); AMD CDNA 2 (MI200) and CDNA 3 (MI300)."""


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
    family: str = ""
    """Architecture family (one of FAMILIES); empty for a custom GPU that names none."""
    tdp_w: float = 0.0
    """Datasheet board power, W (0 when unknown)."""
    usable_memory_gib: float = 0.0
    """Device memory a program can allocate in (the driver's reported total), GiB; 0 →
    memory_gib."""
    peaks: dict[str, float] = field(default_factory=dict, compare=False, hash=False)
    """Dense TFLOP/s per training format it has (spec/formats.py: fp32, tf32, fp16, bf16, fp8);
    a format missing here is one the GPU lacks. Empty: fp16 and bf16 at peak_tflops."""
    format: str = ""
    """The training format this entry is priced in (`for_format`); empty: 16-bit."""
    format_efficiency: float = 1.0
    """A large GEMM's share of the format's peak relative to 16-bit (formats.FORMAT_EFFICIENCY)."""
    attention_tflops: float = 0.0
    """Peak the attention core runs at in this format; 0 → peak_tflops."""

    def __post_init__(self) -> None:
        if not self.usable_memory_gib:
            object.__setattr__(self, "usable_memory_gib", self.memory_gib)
        if not self.peaks:
            object.__setattr__(self, "peaks", {"fp16": self.peak_tflops, "bf16": self.peak_tflops})

    def has(self, fmt: str) -> bool:
        """Whether the GPU runs training format `fmt`: its GEMMs' format and its attention's (fp8
        needs BF16 too)."""
        spec = FORMAT.get(fmt)
        return spec is not None and spec.gemm in self.peaks and spec.attention in self.peaks

    def for_format(self, fmt: str) -> GPUType:
        """This GPU priced in training format `fmt`: peak_tflops becomes the format's dense peak
        (what MFU is against), with the format's GEMM efficiency and attention peak. The format
        must be one it has (`has`)."""
        spec = FORMAT[fmt]
        return replace(
            self,
            peak_tflops=self.peaks[spec.gemm],
            format=fmt,
            format_efficiency=FORMAT_EFFICIENCY[fmt].ratio,
            attention_tflops=self.peaks[spec.attention],
        )

    @property
    def tensor16_tflops(self) -> float:
        """Dense 16-bit tensor TFLOP/s whatever the format priced in: the figure the GPU profiles'
        efficiencies and the family rules are stated against."""
        return self.peaks.get("bf16") or self.peaks.get("fp16") or self.peak_tflops

    @property
    def gemm_flops(self) -> float:
        """FLOP/s a GEMM is priced against: the format's peak × its efficiency relative to 16-bit
        (the profile's fitted GEMM weight applies on top)."""
        return self.peak_tflops * 1e12 * self.format_efficiency

    @property
    def attention_flops(self) -> float:
        """FLOP/s of the work that stays out of FP8 (the attention core, the output head): the
        attention format's peak, at the profiles' own 16-bit efficiency. In every format but fp8
        this equals gemm_flops (format_efficiency is 1 there)."""
        return (self.attention_tflops or self.peak_tflops) * 1e12

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
            "intra_node_gbps": f"{link_source}: {interconnect}, {intra_node_gbyte_s:g} GB/s per "
            "direction",
        },
    )


def _with_power_and_memory(g: GPUType) -> GPUType:
    """Add family, board power and usable memory from the tables below, with their sources."""
    family, tdp_w, power_source = _POWER[g.name]
    usable, usable_source = _USABLE[g.name]
    sources = {
        **g.sources,
        "family": f"{family}: {_FAMILY_SOURCE[family]}",
        "tdp_w": f"{power_source}: {tdp_w:g} W",
        "usable_memory_gib": f"{usable:.2f} GiB: {usable_source}",
    }
    return replace(
        g, family=family, tdp_w=tdp_w, usable_memory_gib=round(usable, 2), sources=sources
    )


_PCIE3 = "PCI Express 3.0 x16 specification: 15.75 GB/s per direction, rounded to 16"
_PCIE4 = "PCI Express 4.0 x16 specification: 31.5 GB/s per direction, rounded to 32"
_PCIE5 = "PCI Express 5.0 x16 specification: 63 GB/s per direction, rounded to 64"

_FAMILY_SOURCE = {
    "volta": "GV100 chip (NVIDIA Tesla V100 GPU architecture whitepaper)",
    "turing": "TU104 chip (NVIDIA Turing GPU architecture whitepaper)",
    "ampere": "GA100 / GA102 chips (NVIDIA A100 Tensor Core GPU architecture whitepaper; Ampere "
    "GA102 whitepaper)",
    "ada": "AD102 / AD104 chips (NVIDIA Ada GPU architecture whitepaper)",
    "hopper": "GH100 chip (NVIDIA H100 Tensor Core GPU architecture whitepaper)",
    "cdna2": "Aldebaran, CDNA 2 (AMD CDNA 2 architecture whitepaper)",
    "cdna3": "Aqua Vanjaram, CDNA 3 (AMD CDNA 3 architecture whitepaper)",
}

# name: (family, board power W, source of the power figure)
_POWER = {
    "V100-16GB": ("volta", 300, "NVIDIA Tesla V100 datasheet (SXM2): max power"),
    "V100-32GB": ("volta", 300, "NVIDIA Tesla V100 datasheet (SXM2): max power"),
    "A100-40GB": ("ampere", 400, "NVIDIA A100 Tensor Core GPU datasheet (SXM4): max TDP"),
    "A100-80GB": ("ampere", 400, "NVIDIA A100 Tensor Core GPU datasheet (SXM4): max TDP"),
    "H100-SXM": ("hopper", 700, "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM): max TDP up to"),
    "H100-PCIe": ("hopper", 350, "NVIDIA H100 Tensor Core GPU datasheet (H100 PCIe): max TDP"),
    "H200": (
        "hopper",
        700,
        "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM): max TDP up to; nvidia-smi "
        "power.limit 700.00 W on the H200 measured here",
    ),
    "GH200": (
        "hopper",
        1000,
        "NVIDIA GH200 Grace Hopper Superchip datasheet: module power configurable 450 W to 1000 "
        "W (CPU + GPU + memory), upper end",
    ),
    "L4": ("ada", 72, "NVIDIA L4 Tensor Core GPU datasheet: max thermal design power"),
    "L40S": ("ada", 350, "NVIDIA L40S GPU datasheet: max power consumption"),
    "A10G": (
        "ampere",
        150,
        "NVIDIA A10 Tensor Core GPU datasheet: max TDP (AWS A10G variant; the A10 figure, as "
        "for its peaks)",
    ),
    "T4": ("turing", 70, "NVIDIA T4 Tensor Core GPU datasheet: max power"),
    "RTX-3090": ("ampere", 350, "NVIDIA GeForce RTX 3090 specifications: graphics card power"),
    "RTX-4090": ("ada", 450, "NVIDIA GeForce RTX 4090 specifications: total graphics power"),
    "MI250X": ("cdna2", 560, "AMD Instinct MI250X accelerator datasheet: peak TBP (OAM)"),
    "MI300X": ("cdna3", 750, "AMD Instinct MI300X accelerator datasheet: peak TBP (OAM)"),
}

_H200_USABLE = 150109880320 / 2**30
"""cudaMemGetInfo total of the H200 measured here (benchmarks/measure_device.py,
torch.cuda.mem_get_info)."""
_HOPPER_SMI_GAP_MIB = 143771 - 150109880320 / 2**20
"""H200: nvidia-smi memory.total 143771 MiB minus what the program sees (both measured here): 614
MiB."""
_T4_SMI_GAP_MIB = 15360 - 15109
"""T4: nvidia-smi memory.total 15360 MiB (ECC on) minus PyTorch total_memory 15109 MB (public Colab
reports)."""
_RTX3090_SMI_GAP_MIB = 24576 - 23.69 * 1024
"""RTX 3090: nvidia-smi 24576 MiB minus PyTorch's reported total capacity 23.69 GiB (public OOM
reports)."""
_MI250X_GCD = 68702699520 / 2**30
"""rocm-smi VRAM total of one MI250X GCD, 68702699520 B (public rocm-smi output); a package has two
GCDs."""
_NOT_MEASURED = "public reports, not measured here; check with benchmarks/measure_device.py"

# name: (usable GiB, rule / source)
_USABLE = {
    "V100-16GB": (
        16160 * MIB,
        f"nvidia-smi memory.total 16160 MiB = PyTorch total 15.78 GiB ({_NOT_MEASURED})",
    ),
    "V100-32GB": (
        32510 * MIB,
        f"nvidia-smi memory.total 32510 MiB = PyTorch total 31.75 GiB ({_NOT_MEASURED})",
    ),
    "A100-40GB": (
        40536 * MIB,
        f"nvidia-smi memory.total 40536 MiB = PyTorch total 39.59 GiB ({_NOT_MEASURED})",
    ),
    "A100-80GB": (
        79.15,
        f"PyTorch-reported total capacity 79.15 GiB on an A100-SXM4-80GB ({_NOT_MEASURED})",
    ),
    "H100-SXM": (
        (81559 - _HOPPER_SMI_GAP_MIB) * MIB,
        f"nvidia-smi memory.total 81559 MiB ({_NOT_MEASURED}) minus the 614 MiB "
        "nvidia-smi-to-program gap measured on the H200 (same family)",
    ),
    "H100-PCIe": (
        (81559 - _HOPPER_SMI_GAP_MIB) * MIB,
        f"nvidia-smi memory.total 81559 MiB ({_NOT_MEASURED}) minus the 614 MiB "
        "nvidia-smi-to-program gap measured on the H200 (same family)",
    ),
    "H200": (
        _H200_USABLE,
        "measured here: cudaMemGetInfo total 150109880320 B (nvidia-smi memory.total 143771 "
        "MiB) with benchmarks/measure_device.py",
    ),
    "GH200": (
        96 * _H200_USABLE / 141,
        "datasheet 96 GB × the H200's measured usable/datasheet ratio 139.80/141 (family rule: "
        "no GH200 total known)",
    ),
    "L4": (
        (23034 - _T4_SMI_GAP_MIB) * MIB,
        f"nvidia-smi memory.total 23034 MiB with ECC ({_NOT_MEASURED}) minus the T4's 251 MiB "
        "nvidia-smi-to-program gap (GDDR6 datacenter board rule)",
    ),
    "L40S": (
        (46068 - _T4_SMI_GAP_MIB) * MIB,
        f"nvidia-smi memory.total 46068 MiB with ECC ({_NOT_MEASURED}) minus the T4's 251 MiB "
        "nvidia-smi-to-program gap (GDDR6 datacenter board rule)",
    ),
    "A10G": (
        (23028 - _T4_SMI_GAP_MIB) * MIB,
        f"nvidia-smi memory.total 23028 MiB with ECC ({_NOT_MEASURED}) minus the T4's 251 MiB "
        "nvidia-smi-to-program gap (GDDR6 datacenter board rule)",
    ),
    "T4": (
        15109 * MIB,
        f"PyTorch total_memory 15109 MB; nvidia-smi 15360 MiB, ECC keeps 1/16 ({_NOT_MEASURED})",
    ),
    "RTX-3090": (23.69, f"PyTorch-reported total capacity 23.69 GiB ({_NOT_MEASURED})"),
    "RTX-4090": (
        (24564 - _RTX3090_SMI_GAP_MIB) * MIB,
        f"nvidia-smi memory.total 24564 MiB ({_NOT_MEASURED}) minus the RTX 3090's 318 MiB "
        "nvidia-smi-to-PyTorch gap (GeForce board rule)",
    ),
    "MI250X": (2 * _MI250X_GCD, f"2 GCDs × rocm-smi VRAM total 68702699520 B ({_NOT_MEASURED})"),
    "MI300X": (
        192 * _MI250X_GCD / 64,
        "datasheet 192 GB × the MI250X GCD's reported/datasheet ratio 63.98/64 (AMD rule: no "
        "MI300X total known)",
    ),
}

_SPARSE = "; dense, half the datasheet's with-sparsity figure"
_GA102 = "NVIDIA Ampere GA102 GPU architecture whitepaper (RTX 3090), FP32 accumulate"
_AD102 = "NVIDIA Ada GPU architecture whitepaper (RTX 4090), FP32 accumulate"
# name: ({format: dense TFLOP/s}, source). fp32 is the CUDA-core (non-tensor) rate on NVIDIA and the
# FP32 matrix-core rate on AMD (rocBLAS runs SGEMM on the MFMA units); a format missing is one the
# GPU lacks: Volta and Turing have no BF16, TF32 or FP8; Ampere and CDNA 2 no FP8; CDNA 2 no TF32.
_PEAKS = {
    "V100-16GB": ({"fp32": 15.7, "fp16": 125}, "NVIDIA Tesla V100 datasheet (SXM2)"),
    "V100-32GB": ({"fp32": 15.7, "fp16": 125}, "NVIDIA Tesla V100 datasheet (SXM2)"),
    "A100-40GB": (
        {"fp32": 19.5, "tf32": 156, "fp16": 312, "bf16": 312},
        "NVIDIA A100 Tensor Core GPU datasheet (SXM4)" + _SPARSE,
    ),
    "A100-80GB": (
        {"fp32": 19.5, "tf32": 156, "fp16": 312, "bf16": 312},
        "NVIDIA A100 Tensor Core GPU datasheet (SXM4)" + _SPARSE,
    ),
    "H100-SXM": (
        {"fp32": 67, "tf32": 494.7, "fp16": 989, "bf16": 989, "fp8": 1979},
        "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM)" + _SPARSE,
    ),
    "H100-PCIe": (
        {"fp32": 51, "tf32": 378, "fp16": 756, "bf16": 756, "fp8": 1513},
        "NVIDIA H100 Tensor Core GPU datasheet (H100 PCIe)" + _SPARSE,
    ),
    "H200": (
        {"fp32": 67, "tf32": 494.7, "fp16": 989, "bf16": 989, "fp8": 1979},
        "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM)" + _SPARSE,
    ),
    "GH200": (
        {"fp32": 67, "tf32": 494.7, "fp16": 989, "bf16": 989, "fp8": 1979},
        "NVIDIA GH200 Grace Hopper Superchip datasheet (GPU: H100/H200 SXM figures)" + _SPARSE,
    ),
    "L4": (
        {"fp32": 30.3, "tf32": 60, "fp16": 121, "bf16": 121, "fp8": 242.5},
        "NVIDIA L4 Tensor Core GPU datasheet" + _SPARSE,
    ),
    "L40S": (
        {"fp32": 91.6, "tf32": 183, "fp16": 362, "bf16": 362, "fp8": 733},
        "NVIDIA L40S GPU datasheet" + _SPARSE,
    ),
    "A10G": (
        {"fp32": 31.2, "tf32": 62.5, "fp16": 125, "bf16": 125},
        "NVIDIA A10 Tensor Core GPU datasheet (AWS A10G variant)" + _SPARSE,
    ),
    "T4": ({"fp32": 8.1, "fp16": 65}, "NVIDIA T4 Tensor Core GPU datasheet"),
    "RTX-3090": ({"fp32": 35.6, "tf32": 35.6, "fp16": 71, "bf16": 71}, _GA102),
    "RTX-4090": ({"fp32": 82.6, "tf32": 82.6, "fp16": 165.2, "bf16": 165.2, "fp8": 330.3}, _AD102),
    "MI250X": (
        {"fp32": 95.7, "fp16": 383, "bf16": 383},
        "AMD Instinct MI250X accelerator datasheet (FP32 matrix)",
    ),
    "MI300X": (
        {"fp32": 163.4, "tf32": 653.7, "fp16": 1307.4, "bf16": 1307.4, "fp8": 2614.9},
        "AMD Instinct MI300X accelerator datasheet (FP32 matrix; dense)",
    ),
}


def _with_peaks(g: GPUType) -> GPUType:
    """Add the dense peak of every format the type has, with its source."""
    peaks, source = _PEAKS[g.name]
    assert peaks.get("fp16") == g.peak_tflops, g.name  # one 16-bit figure per type
    text = ", ".join(f"{fmt} {tflops:g}" for fmt, tflops in peaks.items())
    return replace(
        g,
        peaks={k: float(v) for k, v in peaks.items()},
        sources={**g.sources, "peaks": f"{source}: dense TFLOP/s {text}"},
    )


CATALOG: dict[str, GPUType] = {
    g.name: _with_peaks(_with_power_and_memory(g))
    for g in [
        # NVLink 2 on V100 SXM2: 300 GB/s aggregate (both directions, 6 links) → 150 GB/s per
        # direction.
        _gpu("V100-16GB", 125, 16, 900, 150, "NVLink 2", "NVIDIA Tesla V100 datasheet (SXM2)"),
        _gpu("V100-32GB", 125, 32, 900, 150, "NVLink 2", "NVIDIA Tesla V100 datasheet (SXM2)"),
        # NVLink 3 on A100 SXM4: 600 GB/s aggregate → 300 GB/s per direction.
        _gpu(
            "A100-40GB",
            312,
            40,
            1555,
            300,
            "NVLink 3",
            "NVIDIA A100 Tensor Core GPU datasheet (SXM4 40GB)",
        ),
        _gpu(
            "A100-80GB",
            312,
            80,
            2039,
            300,
            "NVLink 3",
            "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB)",
        ),
        # NVLink 4 on H100/H200 SXM: 900 GB/s aggregate → 450 GB/s per direction.
        _gpu(
            "H100-SXM",
            989,
            80,
            3350,
            450,
            "NVLink 4",
            "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM)",
        ),
        _gpu(
            "H100-PCIe",
            756,
            80,
            2000,
            64,
            "PCIe 5.0",
            "NVIDIA H100 Tensor Core GPU datasheet (H100 PCIe)",
            link_source=_PCIE5,
        ),
        _gpu(
            "H200",
            989,
            141,
            4800,
            450,
            "NVLink 4",
            "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM)",
        ),
        _gpu(
            "GH200",
            989,
            96,
            4000,
            450,
            "NVLink 4",
            "NVIDIA GH200 Grace Hopper Superchip datasheet (96GB HBM3)",
        ),
        _gpu(
            "L4",
            121,
            24,
            300,
            32,
            "PCIe 4.0",
            "NVIDIA L4 Tensor Core GPU datasheet",
            link_source=_PCIE4,
        ),
        _gpu("L40S", 362, 48, 864, 32, "PCIe 4.0", "NVIDIA L40S GPU datasheet", link_source=_PCIE4),
        # AWS publishes no tensor figures for the A10G; it is a GA102 A10 variant, so the A10
        # datasheet is used.
        _gpu(
            "A10G",
            125,
            24,
            600,
            32,
            "PCIe 4.0",
            "NVIDIA A10 Tensor Core GPU datasheet (AWS A10G variant)",
            link_source=_PCIE4,
        ),
        _gpu(
            "T4",
            65,
            16,
            320,
            16,
            "PCIe 3.0",
            "NVIDIA T4 Tensor Core GPU datasheet",
            link_source=_PCIE3,
            peak_note=" (FP16 mixed precision; no BF16)",
        ),
        _gpu(
            "RTX-3090",
            71,
            24,
            936,
            32,
            "PCIe 4.0",
            "NVIDIA Ampere GA102 GPU architecture whitepaper (RTX 3090)",
            link_source=_PCIE4,
            peak_note=" with FP32 accumulate",
        ),
        _gpu(
            "RTX-4090",
            165.2,
            24,
            1008,
            32,
            "PCIe 4.0",
            "NVIDIA Ada GPU architecture whitepaper (RTX 4090)",
            link_source=_PCIE4,
            peak_note=" with FP32 accumulate",
        ),
        # Infinity Fabric: MI250X 8 links, 800 GB/s aggregate; MI300X 7 links × 128 GB/s = 896 GB/s
        # aggregate.
        _gpu(
            "MI250X", 383, 128, 3276.8, 400, "xGMI ×8", "AMD Instinct MI250X accelerator datasheet"
        ),
        _gpu(
            "MI300X", 1307.4, 192, 5300, 448, "xGMI ×7", "AMD Instinct MI300X accelerator datasheet"
        ),
    ]
}


def family_usable_ratio(family: str) -> float | None:
    """Mean usable/datasheet memory of the catalog types of a family (None for a family without
    any)."""
    ratios = [g.usable_memory_gib / g.memory_gib for g in CATALOG.values() if g.family == family]
    return sum(ratios) / len(ratios) if ratios else None


def custom_gpu(
    name: str,
    peak_tflops: float,
    memory_gib: float,
    hbm_gbps: float,
    intra_node_gbps: float,
    source: str,
    family: str | None = None,
    tdp_w: float | None = None,
    peaks: dict[str, float | None] | None = None,
) -> GPUType:
    """A GPU type declared in an instance file (``cluster.gpus``); every field's source is that
    file. With a `family`, its usable memory is the declared memory × the family's mean
    usable/datasheet ratio; without one, the declared memory is taken as usable. Formats: fp16 at
    `peak_tflops`, bf16 too unless the family is Volta or Turing (which have none), and fp32, tf32
    and fp8 where `peaks` declares them."""
    sources = {f: source for f in ("peak_tflops", "memory_gib", "hbm_gbps", "intra_node_gbps")}
    ratio = family_usable_ratio(family) if family else None
    if ratio is None:
        usable = memory_gib
        sources["usable_memory_gib"] = (
            f"{source}: memory_gib as declared (no family named to derive a reserve)"
        )
    else:
        usable = memory_gib * ratio
        sources["usable_memory_gib"] = (
            f"memory_gib × {ratio:.4f}, the mean usable/datasheet ratio of the catalog's "
            f"{family} types"
        )
    if family:
        sources["family"] = source
    if tdp_w:
        sources["tdp_w"] = source
    formats = {"fp16": peak_tflops}
    if family not in ("volta", "turing"):
        formats["bf16"] = peak_tflops
    formats.update({k: float(v) for k, v in (peaks or {}).items() if v})
    sources["peaks"] = source
    return GPUType(
        name=name,
        peak_tflops=peak_tflops,
        memory_gib=memory_gib,
        hbm_gbps=hbm_gbps,
        intra_node_gbps=intra_node_gbps,
        peaks=formats,
        interconnect="as declared",
        sources=sources,
        family=family or "",
        tdp_w=float(tdp_w or 0.0),
        usable_memory_gib=usable,
    )
