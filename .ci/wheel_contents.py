"""Check a built wheel and sdist against the source tree.

The wheel must hold every module under hetopt/, formulations/ as hetopt/formulations/, the bundled
instances as hetopt/bundled/ and the cost profiles, and no top-level package but hetopt. The sdist
must hold what a wheel is built from.

Usage: python .ci/wheel_contents.py REPO WHEEL SDIST
"""

from __future__ import annotations

import sys
import tarfile
import zipfile
from pathlib import Path


def expected(repo: Path) -> set[str]:
    """The files the wheel must hold, as paths inside it."""
    files = {p.relative_to(repo).as_posix() for p in (repo / "hetopt").rglob("*.py")}
    files |= {
        p.relative_to(repo).as_posix() for p in (repo / "hetopt/cost/profiles").glob("*.json")
    }
    files |= {f"hetopt/formulations/{p.name}" for p in (repo / "formulations").glob("*.py")}
    files |= {
        f"hetopt/bundled/{p.name}"
        for p in (repo / "instances").iterdir()
        if p.suffix in (".yaml", ".json", ".csv", ".py")
    }
    return {f for f in files if "__pycache__" not in f}


def main(repo: Path, wheel: Path, sdist: Path) -> list[str]:
    problems = []
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(expected(repo) - names)
    if missing:
        problems.append(f"the wheel lacks {len(missing)} files: {', '.join(missing[:10])}")
    tops = {n.split("/")[0] for n in names} - {"hetopt"}
    tops = {t for t in tops if not t.endswith(".dist-info")}
    if tops:
        problems.append(f"the wheel installs top-level names other than hetopt: {sorted(tops)}")
    with tarfile.open(sdist) as tar:
        inside = {"/".join(m.name.split("/")[1:]) for m in tar.getmembers()}
    for need in (
        "pyproject.toml",
        "setup.py",
        "README.md",
        "formulations/__init__.py",
        "instances/demo-a100-v100-llama7b.yaml",
        "hetopt/__init__.py",
    ):
        if need not in inside:
            problems.append(f"the sdist lacks {need}")
    return problems


if __name__ == "__main__":
    repo, wheel, sdist = (Path(a) for a in sys.argv[1:4])
    found = main(repo, wheel, sdist)
    for line in found:
        print(f"wheel check: {line}", file=sys.stderr)
    if found:
        sys.exit(1)
    print(f"wheel check: {wheel.name} holds all {len(expected(repo))} files; {sdist.name} complete")
