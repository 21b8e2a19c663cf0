"""`hetopt export`: a plan as files a launcher takes (docs/cli-output.md).

`export` checks the plan against its instance (the verifier: a plan for another instance is
refused), places it, builds its rank map (hetopt.export.rankmap) and the chosen format's files
(hetopt.export.launchers); `write_files` writes them all or none.
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hetopt.errors import InputError, Problem, did_you_mean
from hetopt.export.launchers import (
    FORMATS,
    blockers,
    deepspeed_config,
    dumps,
    hostfile,
    megatron_args,
    megatron_config,
    pipeline_parts,
    precision_env,
    rank_env,
    torchrun_lines,
)
from hetopt.export.rankmap import RankMap, rank_map
from hetopt.outputs import check_output_directory
from hetopt.placement import place
from hetopt.plan import Plan
from hetopt.spec.instance import Instance
from hetopt.verify import check_plan


@dataclass
class Export:
    """What an export writes: file name → text; the features that keep the format's launcher from
    running the plan as it is ([] when it can: then the launcher's files are written, else the rank
    map only)."""

    format: str
    files: dict[str, str]
    rankmap: RankMap
    blocked: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "format": self.format,
            "files": sorted(self.files),
            "blocked": self.blocked,
            "world_size": self.rankmap.world_size,
            "order": self.rankmap.order,
            "nodes": len(self.rankmap.nodes),
        }


def export(
    inst: Instance, plan: Plan, fmt: str, source: str = "plan", script: str = "train.py"
) -> Export:
    """The files of `plan` in format `fmt`.

    Parameters: inst — the instance the plan was planned for; plan — the plan (placed or not); fmt —
    one of FORMATS; source — where the plan came from, for messages; script — the training script
    the torchrun lines start. Returns: the Export. Raises: InputError (exit 2) for an unknown format
    or a plan the verifier rejects (planned for another instance, stages that do not fit the
    cluster)."""
    check_format(fmt)
    problems = check_plan(inst, plan)
    if problems:
        raise InputError(source, [Problem(path, message) for path, message in problems])
    plan = place(plan, inst.cluster)
    rm = rank_map(inst, plan)
    files = {"rankmap.json": dumps(rm.to_json())}
    blocked: list[str] = []
    if fmt == "torchrun":
        env = precision_env(inst.precision)
        # the user's script is one word of the shell line, whatever it holds
        files["torchrun.sh"] = _script(torchrun_lines(rm, shlex.quote(script), env))
        files["rank_env.json"] = dumps(rank_env(rm, env))
    elif fmt in ("megatron", "deepspeed"):
        blocked = blockers(plan, fmt, rm.order, inst)
        if not blocked and fmt == "megatron":
            args = megatron_args(inst, plan, rm)
            files["megatron_args.txt"] = shlex.join(args) + "\n"
            files["megatron_core.json"] = dumps(megatron_config(inst, plan))
            launch = "pretrain_gpt.py " + shlex.join(args)
            env = precision_env(inst.precision)
            files["launch.sh"] = _script(torchrun_lines(rm, launch, env))
        elif not blocked:
            files["ds_config.json"] = dumps(deepspeed_config(inst, plan))
            files["hostfile"] = hostfile(rm)
            files["pipeline_parts.json"] = dumps(
                {
                    "parts": pipeline_parts(plan),
                    "layer_specs": ["embedding", f"{inst.model.layers} transformer layers", "head"],
                }
            )
            files["launch.sh"] = _script(
                [
                    f"deepspeed --hostfile hostfile --master_addr {shlex.quote(rm.master)} "
                    f"{shlex.quote(script)} --deepspeed --deepspeed_config ds_config.json"
                ]
            )
            env = precision_env(inst.precision)
            if env:  # DeepSpeed's runner passes the variables of .deepspeed_env to every node
                files[".deepspeed_env"] = "".join(f"{k}={v}\n" for k, v in env.items())
    return Export(fmt, files, rm, blocked)


def check_format(fmt: str) -> None:
    """Raises: InputError (exit 2) for a format not in FORMATS, with the nearest name."""
    if fmt not in FORMATS:
        raise InputError(
            "export",
            [
                Problem(
                    "--format",
                    f"unknown format{did_you_mean(fmt, FORMATS)}; use one of " + ", ".join(FORMATS),
                    fmt,
                    True,
                )
            ],
        )


def _script(lines: list[str]) -> str:
    return (
        "#!/usr/bin/env bash\n# written by hetopt export: one launch line per node\n"
        + "\n".join(lines)
        + "\n"
    )


def write_files(files: dict[str, str], directory: Path, force: bool) -> list[Path]:
    """Write every file into `directory` (made if missing), all or none: an existing file is
    replaced only with `force`; every file is first written whole into a temporary folder inside
    `directory`, and only then are they renamed into place. Returns: the paths written. Raises:
    InputError (exit 2) naming --out, the directory and the fix."""

    def refuse(message: str) -> InputError:
        return InputError(str(directory), [Problem("--out", message, str(directory), True)])

    check_output_directory(directory, "--out")
    taken = [
        name for name in files if (directory / name).exists() or (directory / name).is_symlink()
    ]
    if taken and not force:
        raise refuse(
            f"already holds {', '.join(taken)}; pass --force to overwrite them or choose "
            "another directory"
        )
    odd = [
        name
        for name in taken
        if not (directory / name).is_file() or (directory / name).is_symlink()
    ]
    if odd:  # found before anything is written: a rename onto a folder would fail half-way through
        raise refuse(
            f"holds {', '.join(odd)} as a folder or link, where a file is to go; move it or "
            "choose another directory"
        )
    made = directory  # the topmost folder this call creates, removed again if the write fails
    while not made.parent.exists() and made.parent != made:
        made = made.parent
    made = made if not made.exists() else None
    staging = None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=directory, prefix=".hetopt-export-"))
        for name, text in files.items():
            (staging / name).write_text(text, encoding="utf-8")
            if name.endswith(".sh"):
                (staging / name).chmod(0o755)
        paths = []
        for name in files:
            os.replace(staging / name, directory / name)
            paths.append(directory / name)
        return paths
    except OSError as exc:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        raise refuse(
            f"could not be written ({exc.strerror or exc}); free space or choose another directory"
        ) from exc
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
