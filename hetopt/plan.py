"""The plan (docs/plan-format.md): pipeline templates of stages, their replicas and micro-batch
shares, placement.

`pipelines` are templates; `replicas` copies of a template run as data-parallel pipelines; each
replica of template i processes `micro_batches` micro-batches per iteration. `placement` maps every
stage of every replica onto a node and local GPU indices; hetopt fills it in when a plan comes
without one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator

from hetopt.outputs import write_text
from hetopt.spec.load import read_document, validate_document
from hetopt.spec.schema import Name, PositiveInt, Recompute, Section

Schedule = Literal["gpipe", "1f1b", "interleaved"]
NonNegativeInt = Annotated[int, Field(strict=True, ge=0)]


class Shard(Section):
    """Data-parallel ranks of one device class inside one replica of a stage (Metis-style: a stage
    whose ranks mix GPU types, each taking its own share of every micro-batch; also a stage wider
    than its neighbours in data parallelism)."""

    gpu: str = Field(description="GPU type of the ranks' device class.")
    island: Name = Field(description="Island of the ranks' device class.")
    ranks: PositiveInt = Field(
        description="Data-parallel ranks of this class in one replica of the stage, each tp·cp "
        "GPUs."
    )
    sequences: PositiveInt = Field(
        description="Sequences of every micro-batch each of these ranks runs."
    )

    @property
    def device_class(self) -> tuple[str, str]:
        return (self.gpu, self.island)


class Stage(Section):
    layers: NonNegativeInt = Field(
        description="Transformer layers this stage holds; 0 on the first stage holds the "
        "embedding alone, on the last the output head alone, on a middle stage nothing (it passes "
        "the activations on, as DeepSpeed's parameter-based partition makes such stages)."
    )
    gpu: str = Field(description="GPU type of the stage's device class.")
    island: Name = Field(description="Island of the stage's device class.")
    tp: PositiveInt = Field(
        description="Tensor-parallel degree: GPUs of the stage, inside one node, or whole nodes "
        "of its device class when it exceeds a node (placement `more_nodes`)."
    )
    cp: PositiveInt = Field(
        1,
        description="Context-parallel degree: the stage's sequence split over cp TP groups "
        "(ring attention), tp·cp GPUs inside one node; needs flash attention.",
    )
    recompute: Recompute = Field(
        "none", description="Activation recompute: none, selective or full."
    )
    sp: bool = Field(True, description="Sequence parallelism.")
    shards: list[Shard] = Field(
        default_factory=list,
        description="The stage's data-parallel ranks inside one replica, by device class, the "
        "first of the stage's own class: each micro-batch is split among them (Σ ranks·sequences = "
        "micro_batch). Empty: one rank of the stage's class runs the whole micro-batch.",
    )

    @property
    def device_class(self) -> tuple[str, str]:
        return (self.gpu, self.island)

    @property
    def width(self) -> int:
        """GPUs of one replica of the stage: tp·cp."""
        return self.tp * self.cp

    def ranks_of(self, micro_batch: int) -> list[Shard]:
        """The stage's data-parallel ranks in one replica, by class: its shards, or one rank of its
        own class running all `micro_batch` sequences."""
        return self.shards or [
            Shard(gpu=self.gpu, island=self.island, ranks=1, sequences=micro_batch)
        ]

    @property
    def dp_ranks(self) -> int:
        """Data-parallel ranks of the stage in one replica (1 without shards)."""
        return sum(sh.ranks for sh in self.shards) or 1

    @property
    def gpus(self) -> int:
        """GPUs of one replica of the stage: tp·cp per data-parallel rank."""
        return self.width * self.dp_ranks


class Pipeline(Section):
    replicas: PositiveInt = Field(description="Data-parallel copies of this template.")
    micro_batches: PositiveInt = Field(
        description="Micro-batches each replica processes per iteration."
    )
    stages: list[Stage] = Field(min_length=1, description="Pipeline stages in order.")

    @property
    def layers(self) -> int:
        return sum(s.layers for s in self.stages)


class NodeGPUs(Section):
    node: str = Field(description="A node name, <group>-<index>.")
    gpus: list[NonNegativeInt] = Field(
        min_length=1, description="Local GPU indices inside the node."
    )


class PlacementEntry(Section):
    pipeline: NonNegativeInt
    replica: NonNegativeInt
    stage: NonNegativeInt
    rank: NonNegativeInt = Field(
        0,
        description="The stage's data-parallel rank inside the replica (0 but for stages with "
        "shards: their ranks in the shards' order).",
    )
    node: str = Field(description="A node name, <group>-<index>.")
    gpus: list[NonNegativeInt] = Field(
        min_length=1, description="Local GPU indices inside the node."
    )
    more_nodes: list[NodeGPUs] = Field(
        default_factory=list,
        description="Further nodes of a TP group wider than one node (whole nodes of the "
        "stage's device class); empty when the group sits inside `node`.",
    )

    @property
    def members(self) -> list[tuple[str, list[int]]]:
        """Every (node, local GPUs) of the stage's TP group, `node` first."""
        return [(self.node, self.gpus), *((n.node, n.gpus) for n in self.more_nodes)]


class PlannedFor(Section):
    """The instance a plan was planned for: its name and the fingerprint of each part a plan depends
    on (`Instance.fingerprint`). Evaluating the plan against an instance whose parts differ is
    refused."""

    name: str = Field(description="The instance's name.")
    model: str = Field(description="SHA-256 (12 hex digits) of the resolved model.")
    training: str = Field(description="SHA-256 (12 hex digits) of the training settings.")
    cluster: str = Field(description="SHA-256 (12 hex digits) of the nodes, GPU types and network.")


class Plan(Section):
    micro_batch: PositiveInt = Field(description="Sequences per micro-batch.")
    schedule: Schedule = Field("1f1b", description="gpipe, 1f1b or interleaved.")
    virtual_stages: PositiveInt = Field(
        1, description="Virtual stages per GPU (interleaved schedule when > 1)."
    )
    zero: Literal[0, 1, 2, 3] = Field(
        1,
        description="ZeRO stage over the data-parallel group: 1 shards the optimizer states "
        "(distributed optimizer), 2 also the gradients, 3 (FSDP FULL_SHARD) also the 16-bit "
        "weights.",
    )
    pipelines: list[Pipeline] = Field(min_length=1)
    placement: list[PlacementEntry] = Field(default_factory=list)
    instance: PlannedFor | None = Field(
        None, description="The instance the plan was planned for; absent in plans written by hand."
    )

    @field_validator("virtual_stages")
    @classmethod
    def _virtual_stages_need_interleaving(cls, v: int, info: ValidationInfo) -> int:
        """Virtual stages exist only in the interleaved schedule (Megatron-LM's virtual
        pipeline)."""
        schedule = info.data.get("schedule")
        if v > 1 and schedule != "interleaved":
            raise ValueError(
                f"{v} virtual stages need schedule: interleaved (the schedule is {schedule}); "
                "set the schedule or virtual_stages: 1"
            )
        return v

    @property
    def gpus_used(self) -> int:
        return sum(p.replicas * s.gpus for p in self.pipelines for s in p.stages)

    @property
    def replicas(self) -> int:
        return sum(p.replicas for p in self.pipelines)


def load_plan(path: str | Path) -> Plan:
    path = Path(path)
    data, lines = read_document(path, what="plan")
    return validate_document(
        data, str(path), Plan, "a plan has keys micro_batch and pipelines", lines
    )


def plan_json(plan: Plan) -> dict:
    """The plan as JSON, without the keys of stages with shards where they hold their defaults
    (`shards` empty, placement `rank` 0), so that plans without shards read as before 2026-12-02."""
    data = plan.model_dump(mode="json")
    for pipe in data["pipelines"]:
        for st in pipe["stages"]:
            if not st["shards"]:
                del st["shards"]
    for entry in data["placement"]:
        if entry["rank"] == 0:
            del entry["rank"]
    return data


def row_labels(plan: Plan) -> list[tuple[int, int, str]]:
    """(template, stage, label) of each row of a plan's per-stage figures (peak memory): one per
    stage, or per shard of a stage with shards, labelled by its GPU type ("" for a stage without
    shards)."""
    return [
        (j, i, sh.gpu if st.shards else "")
        for j, pipe in enumerate(plan.pipelines)
        for i, st in enumerate(pipe.stages)
        for sh in st.ranks_of(plan.micro_batch)
    ]


def save_plan(plan: Plan, path: Path) -> None:
    write_text(path, json.dumps(plan_json(plan), indent=2) + "\n")
