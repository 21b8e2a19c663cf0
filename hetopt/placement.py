"""Placing an aggregated plan onto concrete nodes and GPUs.

Rules: a stage's TP group sits inside one node; stages of one replica stay on the node of the previous stage
when it has room (their point-to-point traffic then stays on NVLink); otherwise best fit — the node of the
stage's device class with the fewest free GPUs that still hold the group, which keeps whole nodes free for
wide groups. Every GPU is used at most once.
"""

from __future__ import annotations

from hetopt.errors import InfeasibleError
from hetopt.plan import PlacementEntry, Plan
from hetopt.spec.cluster import Cluster


def place(plan: Plan, cluster: Cluster) -> Plan:
    """The plan with a placement (an existing placement is kept as given)."""
    if plan.placement:
        return plan
    free = {name: list(range(node.gpus)) for name, node in cluster.nodes.items()}
    entries = []
    for p_index, pipe in enumerate(plan.pipelines):
        for replica in range(pipe.replicas):
            previous: str | None = None
            for s_index, stage in enumerate(pipe.stages):
                dc = cluster.device_classes.get(stage.device_class)
                if dc is None:
                    raise InfeasibleError(f"pipelines[{p_index}].stages[{s_index}]: no device class "
                                          f"{stage.gpu}@{stage.island} in the cluster")
                fits = [n.name for n in dc.nodes if len(free[n.name]) >= stage.tp]
                if not fits:
                    raise InfeasibleError(
                        f"pipelines[{p_index}] replica {replica} stage {s_index}: no node of "
                        f"{stage.gpu}@{stage.island} has {stage.tp} free GPUs left for its TP group")
                node = previous if previous in fits else min(fits, key=lambda n: len(free[n]))
                gpus, free[node] = free[node][: stage.tp], free[node][stage.tp:]
                entries.append(PlacementEntry(pipeline=p_index, replica=replica, stage=s_index, node=node, gpus=gpus))
                previous = node
    return plan.model_copy(update={"placement": entries})
