"""The instance file schema (docs/instance-format.md) as pydantic models.

Every section forbids unknown keys, so a misspelt key is an error rather than a silently ignored
line. Integers are strict (``"8"`` or ``8.5`` is not a count). Each field's description doubles as
the fix in error messages and as documentation in ``hetopt schema``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from hetopt.spec.fabrics import NAMES as FABRIC_NAMES
from hetopt.spec.kernels import Attention, NormKernel

PositiveInt = Annotated[int, Field(strict=True, gt=0)]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Name = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]
LinkEnds = Annotated[
    list[Name],
    Field(
        min_length=2,
        max_length=2,
        description="The two islands the link joins, e.g. [rack0, rack1].",
    ),
]
Recompute = Literal["none", "selective", "full"]
FabricName = Literal[FABRIC_NAMES]
"""A fabric of hetopt/spec/fabrics.py (achieved bandwidth fraction and per-step latency)."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSection(Section):
    """The model: a preset, explicit fields, or both (explicit fields override the preset)."""

    preset: str | None = Field(
        None, description="A built-in architecture; `hetopt presets` lists them."
    )
    layers: PositiveInt | None = Field(None, description="Number of transformer layers.")
    hidden: PositiveInt | None = Field(None, description="Hidden size h.")
    heads: PositiveInt | None = Field(None, description="Attention heads a; must divide hidden.")
    kv_heads: PositiveInt | None = Field(
        None,
        description="Key/value heads for grouped-query attention; must divide heads. Default: "
        "heads.",
    )
    ffn_hidden: PositiveInt | None = Field(
        None, description="MLP inner size f. Default: 4 × hidden."
    )
    gated_mlp: bool | None = Field(
        None, description="true: SwiGLU-style three-matrix MLP (LLaMA); false: GPT two-matrix MLP."
    )
    vocab: PositiveInt | None = Field(None, description="Vocabulary size V.")
    max_seq_len: PositiveInt | None = Field(
        None, description="Trained context length; default training.seq_len."
    )
    norm: Literal["layernorm", "rmsnorm"] | None = Field(
        None, description="Normalisation layer kind."
    )
    linear_bias: bool | None = Field(None, description="Biases in the linear projections.")
    position_embedding: Literal["learned", "rotary"] | None = Field(
        None, description="Position encoding."
    )
    tied_embeddings: bool | None = Field(
        None, description="Input embedding and LM head share weights."
    )


class TrainingSection(Section):
    seq_len: PositiveInt | None = Field(
        None, description="Sequence length in tokens; defaults to the preset's context length."
    )
    global_batch: PositiveInt = Field(description="Sequences per iteration, a positive integer.")
    precision: Literal["fp32", "tf32", "fp16", "bf16", "fp8"] | None = Field(
        None,
        description="Training number format: fp32 (CUDA cores), tf32 (fp32 tensors, TF32 tensor "
        "cores), fp16 or bf16 (16-bit mixed precision with an fp32 master copy), fp8 (Transformer "
        "Engine FP8 GEMMs, bf16 otherwise). Every GPU of the cluster must have it. Default: bf16, "
        "or fp16 where a GPU has no BF16 (Volta, Turing).",
    )
    attention: Attention = Field(
        "flash",
        description="Attention kernel: flash (FlashAttention-2) and flash1 (FlashAttention v1) do "
        "not store the s×s scores; standard stores them with one fused scale-mask-softmax kernel "
        "(Megatron's); torch stores them with eager PyTorch ops, one pass each.",
    )
    norm_kernel: NormKernel = Field(
        "fused",
        description="RMSNorm as one fused kernel (fused) or as eager PyTorch ops (torch: more "
        "memory traffic, one more stored tensor per norm). LayerNorm is one kernel either way.",
    )
    grad_reduce_dtype: Literal["bf16", "fp16", "fp32"] | None = Field(
        None,
        description="Data type of the data-parallel gradient reduction (and the templates' "
        "exchange): fp32 as Megatron's --grad-reduce-in-fp32 or DeepSpeed's fp32 all-reduce (4 "
        "bytes per gradient); default 16 bits (2 bytes) in mixed precision and fp8, 32 bits in "
        "fp32 and tf32, whose gradients are fp32 (a 16-bit value there is refused).",
    )
    framework: Literal["megatron", "fsdp", "scaling"] = Field(
        "megatron",
        description="The training stack: megatron (Megatron-LM, Megatron-DeepSpeed, NeMo: fused "
        "kernels, what the GPU profiles were fitted on), fsdp (PyTorch FSDP stacks such as "
        "torchtitan or llm-foundry: device compute at the fitted efficiency of "
        "hetopt/cost/profiles/stacks.json) or scaling (Aleph Alpha's Scaling, a DeepSpeed-style "
        "pipeline with 16-bit gradients, a ZeRO-1 fp32 gradient shard and a loss on gathered "
        "logits: its compute efficiency and memory buffers fitted on the Hagemann et al. 2023 "
        "sweep).",
    )


class CustomGPU(Section):
    """A GPU type beyond the built-in catalog; same fields and units as the catalog."""

    peak_tflops: PositiveFloat = Field(description="Dense 16-bit tensor TFLOP/s, > 0.")
    peak_tflops_fp32: PositiveFloat | None = Field(
        None, description="Dense FP32 TFLOP/s (CUDA cores); without it the GPU refuses fp32."
    )
    peak_tflops_tf32: PositiveFloat | None = Field(
        None, description="Dense TF32 tensor TFLOP/s; without it the GPU refuses tf32."
    )
    peak_tflops_fp8: PositiveFloat | None = Field(
        None, description="Dense FP8 tensor TFLOP/s; without it the GPU refuses fp8."
    )
    memory_gib: PositiveFloat = Field(description="Device memory in GiB, > 0.")
    hbm_gbps: PositiveFloat = Field(description="Device-memory bandwidth in Gbit/s, > 0.")
    intra_node_gbps: PositiveFloat = Field(
        description="Per-GPU, per-direction bandwidth to the other GPUs of its node in Gbit/s, > 0."
    )
    family: Literal["volta", "turing", "ampere", "ada", "hopper", "cdna2", "cdna3"] | None = Field(
        None,
        description="Architecture family it resembles: its efficiencies derive from that "
        "family's calibrated types (without it, from the type nearest in peak TFLOP/s).",
    )
    tdp_w: PositiveFloat | None = Field(
        None,
        description="Board power in W, > 0: a low power per peak TFLOP/s lowers the derived "
        "efficiency.",
    )
    usd_per_hour: NonNegativeFloat | None = Field(
        None,
        description="Rental price of one GPU in US$ per hour, ≥ 0. Without it (and without "
        "usd_per_hour on its node groups) plans on it have no dollar cost.",
    )


class NodeGroup(Section):
    """`count` identical nodes."""

    name: Name = Field(description="Unique group name; nodes are called <name>-0, <name>-1, ...")
    count: PositiveInt = Field(description="Number of identical nodes in the group, ≥ 1.")
    gpu: str = Field(description="A GPU type from `hetopt gpus` or from cluster.gpus.")
    gpus_per_node: PositiveInt = Field(8, description="GPUs in each node, ≥ 1.")
    island: Name = Field("default", description="Rack / zone / data centre the nodes sit in.")
    nic_gbps: PositiveFloat = Field(description="Network bandwidth out of one node in Gbit/s, > 0.")
    nic_fabric: FabricName | None = Field(
        None,
        description="Fabric of the nodes' NICs. Default: tcp below 100 Gbit/s, infiniband from "
        "100 on.",
    )
    intra_fabric: FabricName | None = Field(
        None,
        description="Fabric joining the GPUs inside a node, overriding the GPU's catalog "
        "interconnect (e.g. pcie4_host for a box without peer-to-peer).",
    )
    usd_per_hour: NonNegativeFloat | None = Field(
        None,
        description="Rental price of one node in US$ per hour, ≥ 0 (0: owned, free). Default: "
        "the catalog's on-demand price per GPU-hour (`hetopt gpus`) × gpus_per_node.",
    )
    max_count: PositiveInt | None = Field(
        None,
        description="A quota: the most nodes of the group a plan may rent, ≥ 1 (of the count "
        "available). Default: all of them.",
    )

    @property
    def rentable(self) -> int:
        """The nodes a plan may use: count, or the quota where it is lower."""
        return min(self.count, self.max_count) if self.max_count else self.count


class Link(Section):
    a: Name = Field(description="An island that some node group names.")
    b: Name = Field(description="Another island that some node group names.")
    gbps: PositiveFloat = Field(description="Link bandwidth in Gbit/s, > 0.")
    latency_us: NonNegativeFloat = Field(0.0, description="One-way latency in microseconds, ≥ 0.")
    usd_per_gb: NonNegativeFloat = Field(
        0.0,
        description="Data-transfer price in US$ per GB (10^9 bytes) carried across the link in "
        "either direction, ≥ 0 (e.g. 0.01 between zones, 0.02 between regions).",
    )
    fabric: FabricName | None = Field(
        None,
        description="Fabric of the link. Default: tcp below 100 Gbit/s, infiniband from 100 on.",
    )


class Network(Section):
    links: list[Link] = Field(
        default_factory=list,
        description="Island-to-island links. Islands with no path through links meet on a "
        "non-blocking fabric limited by the NICs.",
    )


class ClusterSection(Section):
    gpus: dict[Name, CustomGPU] = Field(
        default_factory=dict, description="Extra GPU types by name."
    )
    nodes: list[NodeGroup] = Field(min_length=1, description="Node groups; at least one.")
    network: Network = Field(default_factory=Network)


class BandwidthEvent(Section):
    at_s: NonNegativeFloat = Field(description="Time from the start of training, seconds ≥ 0.")
    link: LinkEnds
    gbps: NonNegativeFloat = Field(
        description="The link's bandwidth from at_s on, Gbit/s ≥ 0 (0: the link is down until a "
        "later event brings it back)."
    )


class StepGenerator(Section):
    """Drop a link to `low_gbps` at `at_s`, recover to its nominal bandwidth at `until_s`."""

    kind: Literal["step"]
    link: LinkEnds
    low_gbps: NonNegativeFloat = Field(
        description="Bandwidth during the drop, Gbit/s ≥ 0 (0: an outage, which needs until_s)."
    )
    at_s: NonNegativeFloat = Field(description="When the drop starts, seconds.")
    until_s: PositiveFloat | None = Field(
        None, description="When it recovers, seconds; absent = never."
    )


class MarkovGenerator(Section):
    """Random switching between bandwidth levels, exponential dwell times, seeded."""

    kind: Literal["markov"]
    link: LinkEnds
    levels_gbps: Annotated[list[PositiveFloat], Field(min_length=2)] = Field(
        description="At least two bandwidth levels, Gbit/s > 0."
    )
    mean_dwell_s: PositiveFloat = Field(description="Mean time spent at a level, seconds > 0.")
    seed: int = Field(0, description="Random seed; the same seed gives the same trace.")


class DiurnalGenerator(Section):
    """Smooth periodic load: gbps(t) = mean − amplitude·cos(2π(t + phase)/period), sampled every
    step_s."""

    kind: Literal["diurnal"]
    link: LinkEnds
    mean_gbps: PositiveFloat = Field(description="Mean bandwidth, Gbit/s > 0.")
    amplitude_gbps: NonNegativeFloat = Field(
        description="Swing around the mean, Gbit/s; below mean_gbps."
    )
    period_s: PositiveFloat = Field(description="Length of one cycle, seconds > 0.")
    step_s: PositiveFloat = Field(
        60.0, description="Sampling step of the piecewise-constant trace, seconds."
    )
    phase_s: NonNegativeFloat = Field(0.0, description="Shift of the cycle, seconds.")


class TraceGenerator(Section):
    """A measured trace: CSV with columns at_s, a, b, gbps (path relative to the instance file)."""

    kind: Literal["trace"]
    path: str = Field(description="CSV file with columns at_s,a,b,gbps.")


Generator = Annotated[
    StepGenerator | MarkovGenerator | DiurnalGenerator | TraceGenerator, Field(discriminator="kind")
]


class Scenario(Section):
    name: Name = Field(description="Unique scenario name.")
    probability: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = Field(
        description="Probability in (0, 1]; the scenarios' probabilities sum to 1."
    )
    events: list[BandwidthEvent] = Field(
        default_factory=list, description="Explicit bandwidth changes."
    )
    generator: Generator | None = Field(
        None, description="A seeded bandwidth generator (instead of events)."
    )


class SearchSection(Section):
    gpus: list[str] | None = Field(
        None,
        description="GPU types the search may place stages on (types of cluster.nodes[].gpu); "
        "the others are left idle. Default: every type. `solve --runnable megatron` sets it to "
        "the types that run the instance's flash kernel.",
    )
    tp: list[PositiveInt] | None = Field(None, description="Allowed tensor-parallel degrees.")
    micro_batch: list[PositiveInt] | None = Field(None, description="Allowed micro-batch sizes.")
    recompute: list[Recompute] | None = Field(
        None, description="Allowed activation-recompute modes."
    )
    max_stages: PositiveInt | None = Field(None, description="Largest pipeline depth to consider.")
    max_classes: Annotated[int, Field(ge=1, le=8)] | None = Field(
        None,
        description="Most device classes one pipeline template may span (default: every device "
        "class of the cluster, at least 4; fewer narrows the search).",
    )
    virtual_stages: list[PositiveInt] | None = Field(
        None,
        description="Model chunks per pipeline stage to try (default [1]): values above 1 "
        "search the interleaved 1F1B schedule (Megatron-LM's virtual pipeline stages) for "
        "one-template plans, every stage holding a multiple of that many layers.",
    )
    cp: list[PositiveInt] | None = Field(
        None,
        description="Context-parallel degrees to try, one for every stage of a plan (each stage "
        "then takes tp·cp GPUs of one node; flash attention). Default: 1, and 2, 4, 8 where each "
        "rank keeps at least 8,192 tokens of the sequence.",
    )
    tp_across_nodes: bool = Field(
        False,
        description="Allow TP groups over several whole nodes (TP collectives over the "
        "network). Plans given to evaluate/simulate may have them regardless; the search does not "
        "generate them yet (its TP degrees stay within a node), so true changes no search today.",
    )
    zero: list[Literal[0, 1, 2, 3]] | None = Field(
        None,
        description="ZeRO stages to try (default [1]): 2 (gradients sharded too) and 3 (FSDP: "
        "the 16-bit weights too) trade per-micro-batch collectives for memory, for one-template "
        "plans; 0 is never faster nor smaller than 1 and is searched only alone.",
    )
    tp_per_stage: bool = Field(
        False,
        description="Let one pipeline template run a device class as two consecutive segments "
        "at two TP degrees (e.g. the last stage, with the output head, at twice the TP of the "
        "others). Default false: one TP degree per class.",
    )
    placement: list[Literal["replica", "stage"]] | None = Field(
        None,
        description="Placement orders to try for the replicas of one-template plans: replica "
        "(each replica's stages packed together) and stage (the same stage of consecutive replicas "
        "together, as Megatron-LM numbers its ranks). Default both; plans of two or three "
        "templates and uniform layouts always try both. `hetopt solve --runnable` keeps stage.",
    )
    uniform_tp: bool = Field(
        False,
        description="Every stage of a template at one TP degree (as Megatron-LM runs a model; "
        "`hetopt solve --runnable` sets it). Default false: each device class its own TP degree.",
    )
    shards: bool = Field(
        True,
        description="Also search stages with shards: one template whose stages are Metis's "
        "heterogeneous device groups (a replica's ranks, fastest GPU type first, cut into stages "
        "of equal speed; each micro-batch split among a stage's ranks in proportion to speed), the "
        "layers chosen by the integer program. Default true; false searches one rank per stage and "
        "replica only.",
    )
    uniform_layouts: bool = Field(
        True,
        description="Also search every uniform layout over the GPUs of a set of device classes "
        "(every class, each island, each GPU type, the fastest classes, chains of nearest islands; "
        "the other GPUs idle): Megatron-LM's tp, pp, dp in its rank order; on a mixed cluster its "
        "replicas form several templates, each over the classes its stages land on, all running "
        "one layer split chosen by the integer program; with max_templates 2 or more, however many "
        "templates a layout forms. Default true; false leaves out those the families do not hold.",
    )
    recompute_per_stage: bool = Field(
        False,
        description="Let each pipeline stage pick its own recompute mode among `recompute` (the "
        "first stages of 1F1B hold the most activations): one integer program per skeleton chooses "
        "the modes with the layers. Default false: a mode for the whole plan.",
    )
    max_templates: Literal[1, 2, 3] | None = Field(
        None,
        description="1: one pipeline template; 2: also pairs of templates (each over at most "
        "`pair_classes` device classes) with their own micro-batch shares; 3 (default): also three "
        "single-class templates side by side (each with its own TP, depth, replicas and share).",
    )
    pair_classes: Annotated[int, Field(ge=1, le=8)] | None = Field(
        None,
        description="Most device classes each template of a two-template pair may span (default "
        "1: pairs of single-class templates). 2 or more also searches pairs such as (H200 → A100) "
        "‖ (H100 → A100-40GB), at a large cost in time on big clusters.",
    )
    horizon_s: PositiveFloat | None = Field(
        None,
        description="Seconds of training, from t = 0, over which the robust objectives "
        "(expected, worst, cvar) price each scenario's links and `hetopt simulate` replays them by "
        "default (default 60): expected and cvar at the transfer-time mean bandwidth over it, "
        "worst at the lowest bandwidth in it.",
    )


class ReplanSection(Section):
    """How a switch of plans is priced and when the adaptive policy decides (`hetopt replan`,
    `hetopt simulate --policy replan`)."""

    restart_s: NonNegativeFloat = Field(
        0.0,
        description="Seconds a switch of plans costs beside moving the model state: stopping, "
        "reloading and re-forming communicators, as your framework restarts. Default 0: the "
        "migration alone, the least a switch can cost.",
    )
    detection_delay_s: NonNegativeFloat = Field(
        0.0,
        description="Seconds between a bandwidth change and the adaptive policy seeing it (a "
        "monitor's polling interval). Default 0; the switch waits for the iteration running then "
        "to end.",
    )
    dwell_s: PositiveFloat | None = Field(
        None,
        description="Seconds a new bandwidth is expected to last. Default: a Markov scenario's "
        "mean_dwell_s, a diurnal one's step_s, else the longer of the mean time between the "
        "changes seen so far and the time the level has lasted, else the rest of the horizon; at "
        "most the rest of the horizon.",
    )
    search: Literal["neighbourhood", "full"] = Field(
        "full",
        description="What the adaptive policy searches at a change: neighbourhood (the running "
        "plan's templates, re-split) or full (that, then the whole space).",
    )
    time_limit_s: PositiveFloat = Field(
        10.0, description="Seconds each search of the adaptive policy may take."
    )


class InstanceFile(Section):
    """A hetopt instance: a cluster, a model and training settings (docs/instance-format.md)."""

    name: Name = Field(description="Instance name.")
    description: str = Field("", description="One line saying what the instance models.")
    model: ModelSection
    training: TrainingSection
    cluster: ClusterSection
    scenarios: list[Scenario] = Field(
        default_factory=list,
        description="Dynamic-bandwidth scenarios; absent = one stable scenario.",
    )
    search: SearchSection = Field(default_factory=SearchSection)
    replan: ReplanSection = Field(default_factory=ReplanSection)


def json_schema() -> dict:
    """The JSON Schema of the instance format (`hetopt schema`)."""
    schema = InstanceFile.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "hetopt instance"
    return schema
