"""`hetopt solve --runnable megatron|deepspeed`: the plan space a stock launcher runs as it is.

The instance's own `search:` section narrowed to what `hetopt.export.launchers.blockers` lets
through: one pipeline template (`max_templates: 1`), every stage at one TP degree (`uniform_tp`),
one recompute mode, no stages with shards, no uniform layouts over several templates; Megatron-LM
without ZeRO-2, its replicas placed stage by stage (`placement: [stage]`: ranks in Megatron's own
order); DeepSpeed's pipeline engine without tensor or context parallelism, interleaving, ZeRO-2/3 or
selective recompute, placed stage by stage too (its pipe-data topology). The heuristics and the
search then keep to it alike (hetopt.baselines.common.Candidates).
"""

from __future__ import annotations

from dataclasses import replace

from hetopt.errors import InputError, Problem, did_you_mean
from hetopt.spec.instance import Instance
from hetopt.spec.kernels import runs_kernel

LAUNCHERS = ("megatron", "deepspeed")


def runnable_instance(inst: Instance, launcher: str) -> Instance:
    """The instance with its search space narrowed to plans `launcher` runs as they are.

    Parameters: inst — the instance; launcher — megatron or deepspeed.
    Returns: the narrowed instance (its model, training and cluster unchanged, so its plans are the
    instance's). Raises: InputError (exit 2) for another launcher."""
    if launcher not in LAUNCHERS:
        raise InputError(
            "--runnable",
            [
                Problem(
                    "--runnable",
                    f"unknown launcher{did_you_mean(launcher, LAUNCHERS)}; use one "
                    "of " + ", ".join(LAUNCHERS),
                    launcher,
                    True,
                )
            ],
        )
    s = inst.spec.search
    zero = s.zero or [1]
    update: dict = {
        "max_templates": 1,
        "pair_classes": 1,
        "uniform_tp": True,
        "tp_per_stage": False,
        "recompute_per_stage": False,
        "shards": False,
        "uniform_layouts": False,
    }
    # its ranks stage-major (tp-cp-dp-pp): the same stage of replicas together
    if launcher == "megatron":
        update |= {"zero": [z for z in zero if z != 2] or [1], "placement": ["stage"]}
    else:
        update |= {
            "tp": [1],
            "cp": [1],
            "virtual_stages": [1],
            "zero": [z for z in zero if z <= 1] or [1],
            "placement": ["stage"],
            "recompute": [rc for rc in (s.recompute or ["none", "full"]) if rc != "selective"]
            or ["none"],
        }
    if launcher == "megatron":
        update["gpus"] = _kernel_gpus(inst, s.gpus)
    search = s.model_copy(update=update)
    return replace(inst, spec=inst.spec.model_copy(update={"search": search}))


def _kernel_gpus(inst: Instance, allowed: list[str] | None) -> list[str] | None:
    """The GPU types of search.gpus (default every type) that run the instance's flash kernel, as
    Megatron launches it (the flash-attn package); None where that is all of them. Raises:
    InputError (exit 2) where none does."""
    attention = inst.spec.training.attention
    types = allowed or list(inst.gpu_types)
    running = [t for t in types if runs_kernel(attention, inst.gpu_types[t].family)]
    if not running:
        raise InputError(
            "--runnable",
            [
                Problem(
                    "--runnable",
                    f"Megatron runs training.attention: {attention} on none of "
                    f"{', '.join(types)} (the flash-attn package needs Ampere or later for "
                    "FlashAttention-2, Turing or later for v1): set training.attention: standard",
                    "megatron",
                    True,
                )
            ],
        )
    return None if running == types and allowed is None else running
