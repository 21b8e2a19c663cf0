"""Flow-level network: transfers are flows along paths of directed links; flows sharing a link get
max-min fair shares (progressive filling, Bertsekas & Gallager, Data Networks §6.5.2), recomputed whenever
a flow starts or ends or a capacity changes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

Link = tuple[str, str]
"""A directed link (u, v): links are full duplex, each direction has the full capacity."""


@dataclass
class Flow:
    fid: int
    path: tuple[Link, ...]
    remaining_bytes: float
    on_done: Callable[[float], None]
    label: str = ""
    rate: float = 0.0
    started_s: float = 0.0


def max_min_rates(paths: list[tuple[Link, ...]], capacity: dict[Link, float]) -> list[float]:
    """Max-min fair rates (bytes/s) of flows along `paths`; links missing from `capacity` are unlimited."""
    rates = [0.0] * len(paths)
    users: dict[Link, set[int]] = {}
    for i, path in enumerate(paths):
        for link in path:
            if link in capacity:
                users.setdefault(link, set()).add(i)
    remaining = {link: capacity[link] for link in users}
    active = set(range(len(paths)))
    unconstrained = [i for i in active if not any(link in users for link in paths[i])]
    for i in unconstrained:
        rates[i] = math.inf
        active.discard(i)
    while active:
        link, share = min(((lk, remaining[lk] / len(us)) for lk, us in users.items() if us), key=lambda x: x[1])
        for i in list(users[link]):
            rates[i] = share
            active.discard(i)
            for lk in paths[i]:
                if lk in users:
                    users[lk].discard(i)
                    remaining[lk] -= share
        users = {lk: us for lk, us in users.items() if us}
    return rates


@dataclass
class Network:
    """Capacities (bytes/s per direction) and the active flows, advanced in simulated time."""

    capacity: dict[Link, float]
    flows: dict[int, Flow] = field(default_factory=dict)
    now_s: float = 0.0
    bytes_on: dict[Link, float] = field(default_factory=dict)
    """Bytes carried per directed link so far (for utilisation)."""
    _next_id: int = 0

    def advance(self, t_s: float) -> None:
        dt = t_s - self.now_s
        if dt > 0:
            for f in self.flows.values():
                moved = min(f.remaining_bytes, f.rate * dt)
                f.remaining_bytes -= moved
                for link in f.path:
                    self.bytes_on[link] = self.bytes_on.get(link, 0.0) + moved
        self.now_s = max(self.now_s, t_s)

    def start(self, path: tuple[Link, ...], nbytes: float, on_done: Callable[[float], None], label: str = "") -> Flow:
        flow = Flow(self._next_id, path, nbytes, on_done, label, started_s=self.now_s)
        self._next_id += 1
        self.flows[flow.fid] = flow
        self.rebalance()
        return flow

    def set_capacity(self, link: Link, bytes_per_s: float) -> None:
        self.capacity[link] = bytes_per_s
        self.rebalance()

    def rebalance(self) -> None:
        flows = list(self.flows.values())
        for f, r in zip(flows, max_min_rates([f.path for f in flows], self.capacity), strict=True):
            f.rate = r

    def next_finish_s(self) -> float:
        best = math.inf
        for f in self.flows.values():
            t = self.now_s if f.remaining_bytes <= 0 or math.isinf(f.rate) else (
                self.now_s + f.remaining_bytes / f.rate if f.rate > 0 else math.inf)
            best = min(best, t)
        return best

    def pop_finished(self, tolerance_bytes: float = 1e-3) -> list[Flow]:
        done = [f for f in self.flows.values() if f.remaining_bytes <= tolerance_bytes or math.isinf(f.rate)]
        for f in done:
            del self.flows[f.fid]
        if done:
            self.rebalance()
        return done
