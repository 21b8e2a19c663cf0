"""Every solver backend hetopt knows, by name, and which are usable here."""

from __future__ import annotations

import functools

from hetopt.search.backends.base import Backend
from hetopt.search.backends.cbc import CbcBackend
from hetopt.search.backends.cpsat import CpSatBackend
from hetopt.search.backends.highs import HighsBackend

REGISTRY: dict[str, Backend] = {b.name: b for b in (CpSatBackend(), CbcBackend(), HighsBackend())}
"""Every backend hetopt knows, usable here or not (`available`)."""
FALLBACK_ORDER = ("highs", "cbc", "cpsat")
"""Who takes a skeleton over when its backend fails: the fastest MILP first, CP-SAT (another kind of
solver altogether, so unlikely to fail the same way) last."""


def get(name: str) -> Backend:
    """The backend called `name` (KeyError for an unknown one: `pick` words the user's error)."""
    return REGISTRY[name]


@functools.cache
def available(name: str) -> tuple[bool, str]:
    """(usable here, why not); cached: the answer cannot change within a process."""
    return REGISTRY[name].available()
