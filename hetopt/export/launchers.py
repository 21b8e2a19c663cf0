"""A plan as the stock launchers take it: Megatron-LM's arguments (and megatron-core's
configuration), DeepSpeed's config JSON and hostfile, torchrun's launch lines — and what keeps a
launcher from running a plan as it is (`blockers`).

Megatron-LM runs one pipeline template: every stage at one TP and CP degree, its replicas alike, one
recompute mode; the uneven layer split goes in through `--pipeline-model-parallel-layout`
(megatron-core's `PipelineParallelLayerLayout`: "E" the embedding, "t" a transformer layer, "L" the
loss, "|" between stages, rows in virtual-stage-major order for the interleaved schedule). ZeRO-1 is
its distributed optimizer, ZeRO-3 Megatron-FSDP (`--use-megatron-fsdp`, sharding
optim_grads_params); it has no ZeRO-2. DeepSpeed's pipeline engine runs one template without tensor
or context parallelism (those need Megatron-DeepSpeed), ZeRO-0/1 only with pipelining, its own 1F1B
schedule, one activation-checkpoint interval; its `PipelineModule` takes the layer boundaries
(`parts`) this module writes beside the config.
"""

from __future__ import annotations

import json
import shlex

from hetopt.export.rankmap import RankMap
from hetopt.plan import Plan, Stage
from hetopt.spec.instance import Instance
from hetopt.spec.kernels import is_flash, runs_kernel

FORMATS = ("megatron", "deepspeed", "torchrun", "rankmap")
MASTER_PORT = 29500
"""torchrun's --master-port in the launch lines (torchrun's default)."""


def blockers(
    plan: Plan, launcher: str, order: str = "tp-cp-dp-pp", inst: Instance | None = None
) -> list[str]:
    """What keeps `launcher` (megatron or deepspeed) from running `plan` as it is; [] when it can.

    Parameters: plan — a plan; launcher — megatron or deepspeed; order — the rank map's order
    (Megatron needs one of its own); inst — its instance, whose training settings may block too.
    Returns: one line per blocking feature."""
    stages = [st for pipe in plan.pipelines for st in pipe.stages]
    out = _template_blockers(plan, stages, launcher)
    if launcher == "megatron":
        out += _megatron_feature_blockers(plan, stages)
        if inst is not None:
            out += _megatron_training_blockers(inst) + _kernel_blockers(inst, stages)
        out += _megatron_order_blockers(stages, order, blocked=bool(out))
    else:
        out += _deepspeed_feature_blockers(plan, stages)
        out += _deepspeed_order_blockers(order, blocked=bool(out))
    return out


def _kernel_blockers(inst: Instance, stages: list[Stage]) -> list[str]:
    """The instance's attention kernel on GPUs that lack it: the launch would die at start-up."""
    attention = inst.spec.training.attention
    lacking = sorted(
        {
            st.gpu
            for st in stages
            if st.gpu in inst.gpu_types
            and not runs_kernel(attention, inst.gpu_types[st.gpu].family)
        }
    )
    if not lacking:
        return []
    kernel = "FlashAttention-2" if attention == "flash" else "FlashAttention v1"
    return [
        f"{kernel} (training.attention: {attention}) does not run on {', '.join(lacking)}: set "
        "training.attention: standard, or plan without those GPUs"
    ]


def _megatron_training_blockers(inst: Instance) -> list[str]:
    """Training settings Megatron cannot run: flash attention (--use-flash-attn) outside fp16 and
    bf16."""
    if inst.precision in ("fp32", "tf32") and is_flash(inst.spec.training.attention):
        return [
            f"flash attention in {inst.precision} (Megatron's --use-flash-attn runs fp16 and bf16 "
            "only): set training.attention: standard, or train in bf16"
        ]
    return []


def _template_blockers(plan: Plan, stages: list[Stage], launcher: str) -> list[str]:
    """What neither launcher runs: both run one template, its replicas and stages alike."""
    out = []
    if len(plan.pipelines) > 1:
        out.append(
            f"{len(plan.pipelines)} pipeline templates with their own micro-batch shares "
            f"({launcher} runs one template: its replicas alike)"
        )
    if any(st.shards for st in stages):
        out.append(
            "stages with shards (data-parallel ranks of several GPU types inside a stage; "
            f"{launcher} gives every stage the same data-parallel width)"
        )
    if len({st.recompute for st in stages}) > 1:
        out.append(f"a recompute mode per stage ({launcher} takes one for the model)")
    return out


def _megatron_feature_blockers(plan: Plan, stages: list[Stage]) -> list[str]:
    """The plan's features Megatron-LM has no argument for."""
    out = []
    if len({(st.tp, st.cp) for st in stages}) > 1:
        out.append("stages at different TP or CP degrees (Megatron-LM takes one of each)")
    if plan.zero == 2:
        out.append(
            "ZeRO-2 (Megatron-LM has the distributed optimizer, ZeRO-1, and Megatron-FSDP, ZeRO-3)"
        )
    if plan.schedule == "gpipe":
        out.append("the GPipe schedule (Megatron-LM runs 1F1B or interleaved 1F1B)")
    return out


def _megatron_order_blockers(stages: list[Stage], order: str, blocked: bool) -> list[str]:
    """A rank order Megatron-LM cannot build; the node order is said only when nothing else
    blocks, as the rank map runs it."""
    out = []
    if order == "node" and not blocked:
        out.append(
            "a placement whose nodes hold ranks out of Megatron's order (tp-cp-dp-pp or "
            "tp-cp-pp-dp): the rank map still runs it"
        )
    if order == "tp-cp-pp-dp" and any(st.cp > 1 for st in stages):
        out.append(
            "context parallelism with replicas placed replica by replica (Megatron-LM's "
            "--use-tp-pp-dp-mapping takes no CP): place stage by stage (search.placement: "
            "[stage])"
        )
    return out


def _deepspeed_feature_blockers(plan: Plan, stages: list[Stage]) -> list[str]:
    """The plan's features DeepSpeed's pipeline engine lacks."""
    out = []
    if any(st.tp > 1 or st.cp > 1 for st in stages):
        out.append(
            "tensor or context parallelism (DeepSpeed's pipeline engine has neither: "
            "Megatron-DeepSpeed)"
        )
    if plan.zero >= 2:
        out.append(f"ZeRO-{plan.zero} (DeepSpeed's pipeline engine runs ZeRO-0/1 only)")
    if plan.schedule == "interleaved":
        out.append("the interleaved schedule (DeepSpeed's pipeline engine runs its own 1F1B)")
    if any(st.recompute == "selective" for st in stages):
        out.append("selective recompute (DeepSpeed's pipeline checkpoints whole layers)")
    return out


def _deepspeed_order_blockers(order: str, blocked: bool) -> list[str]:
    """A rank order other than DeepSpeed's pipe-data topology; said only when nothing else
    blocks."""
    if order != "tp-cp-dp-pp" and not blocked:
        return [
            "a placement whose nodes hold ranks out of DeepSpeed's order (its pipe-data "
            "topology: the same stage of every copy together): place stage by stage "
            "(search.placement: [stage])"
        ]
    return []


def layout_string(plan: Plan) -> str:
    """Megatron's --pipeline-model-parallel-layout of a one-template plan: each stage's layers as
    "t"s, "E" before the first, "L" after the last; with v virtual stages each stage's layers cut
    into v equal chunks, rows in virtual-stage-major order (chunk c of stage i is row c·p + i)."""
    stages = plan.pipelines[0].stages
    v, p = plan.virtual_stages, len(stages)
    rows = ["t" * (stages[i].layers // v) for c in range(v) for i in range(p)]
    rows[0], rows[-1] = "E" + rows[0], rows[-1] + "L"
    return "|".join(rows)


def megatron_config(inst: Instance, plan: Plan) -> dict:
    """The plan's values in megatron-core's own configuration classes: keyword arguments of
    `TransformerConfig` and of `DistributedDataParallelConfig`, with the training's batch sizes.

    Parameters: inst — the instance; plan — a plan Megatron can run (`blockers` empty).
    Returns: {"transformer": {...}, "ddp": {...}, "batch": {...}}."""
    m, st, pipe = inst.model, plan.pipelines[0].stages[0], plan.pipelines[0]
    transformer = {
        "num_layers": m.layers,
        "hidden_size": m.hidden,
        "num_attention_heads": m.heads,
        "num_query_groups": m.kv_heads,
        "ffn_hidden_size": m.ffn_hidden,
        "gated_linear_unit": m.gated_mlp,
        "normalization": "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm",
        "add_bias_linear": m.linear_bias,
        "tensor_model_parallel_size": st.tp,
        "pipeline_model_parallel_size": len(pipe.stages),
        "context_parallel_size": st.cp,
        "sequence_parallel": st.sp and st.tp > 1,
        **megatron_precision(inst.precision),
    }
    if not is_flash(inst.spec.training.attention):
        # megatron-core's own attention (its `auto` would pick Transformer Engine's flash or
        # fused kernels): the fused softmax for standard, eager ops for torch
        transformer["attention_backend"] = "local"  # AttnBackend's name
        transformer["masked_softmax_fusion"] = inst.spec.training.attention == "standard"
    if len(pipe.stages) > 1 or plan.virtual_stages > 1:
        transformer["pipeline_model_parallel_layout"] = layout_string(plan)
    if plan.virtual_stages > 1:
        transformer["virtual_pipeline_model_parallel_size"] = plan.virtual_stages
    if st.recompute == "full":
        transformer |= {
            "recompute_granularity": "full",
            "recompute_method": "uniform",
            "recompute_num_layers": 1,
        }
    elif st.recompute == "selective":
        transformer["recompute_granularity"] = "selective"
    ddp = {
        "use_distributed_optimizer": plan.zero == 1,
        "use_megatron_fsdp": plan.zero == 3,
        "data_parallel_sharding_strategy": "optim_grads_params" if plan.zero == 3 else "no_shard",
        "grad_reduce_in_fp32": inst.spec.training.grad_reduce_dtype == "fp32",
    }
    batch = {
        "micro_batch_size": plan.micro_batch,
        "global_batch_size": inst.spec.training.global_batch,
        "seq_length": inst.seq_len,
        "data_parallel_size": pipe.replicas,
    }
    return {"transformer": transformer, "ddp": ddp, "batch": batch}


def megatron_args(inst: Instance, plan: Plan, rm: RankMap) -> list[str]:
    """Megatron-LM's command-line arguments (pretrain_gpt.py) for a plan it can run."""
    cfg = megatron_config(inst, plan)
    t, b = cfg["transformer"], cfg["batch"]
    args = [
        "--num-layers",
        t["num_layers"],
        "--hidden-size",
        t["hidden_size"],
        "--num-attention-heads",
        t["num_attention_heads"],
        "--ffn-hidden-size",
        t["ffn_hidden_size"],
        "--seq-length",
        b["seq_length"],
        "--max-position-embeddings",
        inst.model.max_seq_len,
        "--micro-batch-size",
        b["micro_batch_size"],
        "--global-batch-size",
        b["global_batch_size"],
        "--tensor-model-parallel-size",
        t["tensor_model_parallel_size"],
        "--pipeline-model-parallel-size",
        t["pipeline_model_parallel_size"],
        "--context-parallel-size",
        t["context_parallel_size"],
        *megatron_precision_args(inst.precision),
    ]
    if t["num_query_groups"] != t["num_attention_heads"]:
        args += ["--group-query-attention", "--num-query-groups", t["num_query_groups"]]
    if t["gated_linear_unit"]:
        args += ["--swiglu"]
    if t["normalization"] == "RMSNorm":
        args += ["--normalization", "RMSNorm"]
    if not t["add_bias_linear"]:
        args += ["--disable-bias-linear"]
    if inst.model.position_embedding == "rotary":
        args += ["--position-embedding-type", "rope"]
    if not inst.model.tied_embeddings:
        args += ["--untie-embeddings-and-output-weights"]
    if "pipeline_model_parallel_layout" in t:
        args += ["--pipeline-model-parallel-layout", t["pipeline_model_parallel_layout"]]
    if plan.virtual_stages > 1:
        args += ["--num-virtual-stages-per-pipeline-rank", plan.virtual_stages]
    if t["sequence_parallel"]:
        args += ["--sequence-parallel"]
    if "recompute_granularity" in t:
        args += ["--recompute-granularity", t["recompute_granularity"]]
        if t["recompute_granularity"] == "full":
            args += ["--recompute-method", "uniform", "--recompute-num-layers", 1]
    if plan.zero == 1:
        args += ["--use-distributed-optimizer"]
    elif plan.zero == 3:  # Megatron-FSDP, fully sharded: the DDP config's use_megatron_fsdp (below)
        args += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"]
    if cfg["ddp"]["grad_reduce_in_fp32"]:
        args += ["--accumulate-allreduce-grads-in-fp32"]
    if is_flash(inst.spec.training.attention):
        args += ["--use-flash-attn"]
    else:  # megatron-core's own attention, not Transformer Engine's flash or fused kernels
        args += ["--attention-backend", "local"]
        if inst.spec.training.attention == "torch":  # eager softmax, not the fused kernel
            args += ["--no-masked-softmax-fusion"]
    if rm.order == "tp-cp-pp-dp":
        args += ["--use-tp-pp-dp-mapping"]
    return [str(a) for a in args]


def deepspeed_config(inst: Instance, plan: Plan) -> dict:
    """DeepSpeed's config JSON for a one-template plan: batch sizes (train_batch_size = micro-batch
    × gradient accumulation × data-parallel width, as DeepSpeed checks), ZeRO stage, precision, the
    pipeline section and activation checkpointing."""
    pipe = plan.pipelines[0]
    cfg = {
        "train_batch_size": inst.spec.training.global_batch,
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": pipe.micro_batches,
        "zero_optimization": {"stage": plan.zero},
        **deepspeed_precision(inst.precision),
        "pipeline": {
            "stages": len(pipe.stages),
            "partition": "uniform",
            "activation_checkpoint_interval": 1 if pipe.stages[0].recompute == "full" else 0,
        },
    }
    if inst.spec.training.grad_reduce_dtype == "fp32":
        cfg["communication_data_type"] = "fp32"
    return cfg


def pipeline_parts(plan: Plan) -> list[int]:
    """DeepSpeed PipelineModule's `parts` for the plan's split, over its layer specs [embedding,
    each transformer layer, head]: stage i holds specs parts[i]…parts[i+1]−1 (the embedding on the
    first stage, the head on the last). Set them in place of its own partition
    (`_partition_layers`)."""
    parts = [0, 1]  # the embedding
    for st in plan.pipelines[0].stages:
        parts.append(parts[-1] + st.layers)
    parts[-1] += 1  # the head
    return [parts[0], *parts[2:]]


def hostfile(rm: RankMap) -> str:
    """DeepSpeed's hostfile: each node and its slots, in node-rank order."""
    return "".join(f"{n['name']} slots={n['nproc']}\n" for n in rm.nodes)


def megatron_precision(fmt: str) -> dict:
    """Megatron-Core TransformerConfig's precision fields for training format `fmt`: bf16/fp16
    flags and the parameter dtype (fp32 and tf32: neither flag, fp32 parameters); fp8 trains in
    bf16 with Transformer Engine's FP8 GEMMs in the hybrid format (E4M3 forward, E5M2 gradients)."""
    dtype = {"fp32": "fp32", "tf32": "fp32", "fp16": "fp16", "bf16": "bf16", "fp8": "bf16"}[fmt]
    out = {
        "bf16": dtype == "bf16",
        "fp16": dtype == "fp16",
        "params_dtype": dtype,
        "pipeline_dtype": dtype,
    }
    if fmt == "fp8":
        out |= {"fp8": "hybrid", "transformer_impl": "transformer_engine"}
    return out


def megatron_precision_args(fmt: str) -> list[str]:
    """Megatron-LM's precision arguments: --bf16, --fp16, neither (fp32, tf32), or --bf16 with
    --fp8-format hybrid on Transformer Engine (fp8). TF32 comes from the environment
    (`precision_env`)."""
    cfg = megatron_precision(fmt)
    args = ["--bf16"] if cfg["bf16"] else ["--fp16"] if cfg["fp16"] else []
    if fmt == "fp8":
        args += ["--fp8-format", "hybrid", "--transformer-impl", "transformer_engine"]
    return args


def deepspeed_precision(fmt: str) -> dict:
    """DeepSpeed's precision section: fp16 or bf16 enabled (fp8: bf16, Transformer Engine's FP8
    GEMMs being in the model code); none for fp32 and tf32."""
    section = megatron_precision(fmt)
    if section["bf16"]:
        return {"bf16": {"enabled": True}}
    if section["fp16"]:
        return {"fp16": {"enabled": True}}
    return {}


def precision_env(fmt: str) -> dict[str, str]:
    """Environment a rank needs for training format `fmt`: tf32 turns on TF32 in cuBLAS
    (TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1, PyTorch's override of allow_tf32 = False); fp32 turns it
    off in every library (NVIDIA_TF32_OVERRIDE=0), so that cuDNN's TF32 default does not apply."""
    return {
        "tf32": {"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"},
        "fp32": {"NVIDIA_TF32_OVERRIDE": "0"},
    }.get(fmt, {})


def torchrun_lines(
    rm: RankMap, script: str = "train.py", env: dict[str, str] | None = None
) -> list[str]:
    """One launch line per node, in node-rank order: its GPUs (CUDA_VISIBLE_DEVICES, in local-rank
    order), --nnodes/--node-rank/--nproc-per-node and the rendezvous at rank 0's node; the rank map
    travels as HETOPT_RANKMAP, with `env` (`precision_env`) beside it. `script` is the command
    line as the shell reads it: its words already quoted (shlex.quote)."""
    extra = "".join(f" {k}={shlex.quote(v)}" for k, v in (env or {}).items())
    out = []
    for n in rm.nodes:
        visible = ",".join(map(str, n["gpus"]))
        env_text = f"CUDA_VISIBLE_DEVICES={visible} HETOPT_RANKMAP=rankmap.json{extra}"
        out.append(
            f"# on {n['name']}\n{env_text} torchrun --nnodes={len(rm.nodes)} "
            f"--node-rank={n['node_rank']} --nproc-per-node={n['nproc']} "
            f"--master-addr={shlex.quote(rm.master)} --master-port={MASTER_PORT} {script}"
        )
    return out


def rank_env(rm: RankMap, env: dict[str, str] | None = None) -> list[dict]:
    """The environment each rank runs with under those lines (torchrun sets RANK, LOCAL_RANK,
    WORLD_SIZE, MASTER_ADDR and MASTER_PORT; the node's line sets CUDA_VISIBLE_DEVICES,
    HETOPT_RANKMAP and `env`)."""
    visible = {n["name"]: ",".join(map(str, n["gpus"])) for n in rm.nodes}
    return [
        {
            "RANK": r.rank,
            "LOCAL_RANK": r.local_rank,
            "WORLD_SIZE": rm.world_size,
            "MASTER_ADDR": rm.master,
            "MASTER_PORT": MASTER_PORT,
            "CUDA_VISIBLE_DEVICES": visible[r.node],
            "HETOPT_RANKMAP": "rankmap.json",
            **(env or {}),
        }
        for r in rm.ranks
    ]


def dumps(data) -> str:
    """`data` as indented JSON, except that a list of records (dicts) is written one record per
    line: a rank map of 4,096 GPUs reads rank by rank, and the encoder writes it in C (fully
    indented, in Python's pure encoder: 5 s a file)."""
    return _dumps(data, "") + "\n"


def _dumps(data, indent: str) -> str:
    inner = indent + "  "
    if isinstance(data, dict) and data:
        items = (f"{inner}{json.dumps(str(k))}: {_dumps(v, inner)}" for k, v in data.items())
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(data, list) and data and all(isinstance(x, dict) for x in data):
        return "[\n" + ",\n".join(inner + json.dumps(x) for x in data) + "\n" + indent + "]"
    if isinstance(data, list) and any(isinstance(x, (dict, list)) for x in data):
        return "[\n" + ",\n".join(inner + _dumps(x, inner) for x in data) + "\n" + indent + "]"
    return json.dumps(data)
