"""Flow-level network: transfers are flows along paths of directed links; flows sharing a link get
max-min fair shares (progressive filling, Bertsekas & Gallager, Data Networks §6.5.2), recomputed
whenever a flow starts or ends or a capacity changes.

Incremental, so that thousands of GPUs stay fast: a change only re-balances the flows connected to
it through shared links (max-min shares of one connected component do not depend on the others); a
flow's bytes are settled only when its rate changes; finish times sit in a heap with lazy
invalidation.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

Link = tuple[str, str]
"""A directed link (u, v): links are full duplex, each direction has the full capacity."""

DONE_BYTES = 1e-6
"""A flow with less than this left has finished (floating-point slack)."""


@dataclass
class Flow:
    fid: int
    path: tuple[Link, ...]
    remaining_bytes: float
    on_done: Callable[[float], None]
    label: str = ""
    rate: float = 0.0
    settled_s: float = 0.0
    version: int = 0


def max_min_rates(paths: list[tuple[Link, ...]], capacity: dict[Link, float]) -> list[float]:
    """Max-min fair rates (bytes/s) of flows along `paths`; links missing from `capacity` are
    unlimited."""
    rates = [math.inf] * len(paths)
    users: dict[Link, set[int]] = {}
    for i, path in enumerate(paths):
        for link in path:
            if link in capacity:
                users.setdefault(link, set()).add(i)
    remaining = {link: capacity[link] for link in users}
    while users:
        link, share = min(
            ((lk, remaining[lk] / len(us)) for lk, us in users.items()), key=lambda x: x[1]
        )
        for i in list(users[link]):
            rates[i] = share
            for lk in paths[i]:
                if lk in users:
                    users[lk].discard(i)
                    remaining[lk] -= share
        users = {lk: us for lk, us in users.items() if us}
    return rates


@dataclass
class Network:
    """Capacities (bytes/s per direction) and the active flows."""

    capacity: dict[Link, float]
    flows: dict[int, Flow] = field(default_factory=dict)
    bytes_on: dict[Link, float] = field(default_factory=dict)
    """Bytes carried per directed link so far (for utilisation)."""
    _users: dict[Link, set[int]] = field(default_factory=dict)
    _finish: list[tuple[float, int, int]] = field(default_factory=list)
    _next_id: int = 0

    def start(
        self,
        now_s: float,
        path: tuple[Link, ...],
        nbytes: float,
        on_done: Callable[[float], None],
        label: str = "",
    ) -> Flow:
        flow = Flow(self._next_id, path, nbytes, on_done, label, settled_s=now_s)
        self._next_id += 1
        self.flows[flow.fid] = flow
        for link in path:
            if link in self.capacity:
                self._users.setdefault(link, set()).add(flow.fid)
        self._rebalance(now_s, [flow.fid])
        return flow

    def set_capacity(self, now_s: float, link: Link, bytes_per_s: float) -> None:
        self.capacity[link] = bytes_per_s
        self._rebalance(now_s, list(self._users.get(link, ())))

    def next_finish_s(self) -> float:
        while self._finish:
            t, fid, version = self._finish[0]
            flow = self.flows.get(fid)
            if flow is not None and flow.version == version:
                return t
            heapq.heappop(self._finish)
        return math.inf

    def pop_finished(self, now_s: float) -> list[Flow]:
        """Remove and return the flows done by `now_s`; the others are re-balanced."""
        done = []
        while self._finish and self._finish[0][0] <= now_s:
            _, fid, version = heapq.heappop(self._finish)
            flow = self.flows.get(fid)
            if flow is None or flow.version != version:
                continue
            self._settle(flow, now_s)
            done.append(flow)
        neighbours: set[int] = set()
        for flow in done:
            del self.flows[flow.fid]
            for link in flow.path:
                users = self._users.get(link)
                if users is not None:
                    users.discard(flow.fid)
                    neighbours |= users
        if neighbours:
            self._rebalance(now_s, list(neighbours))
        return done

    def settle_all(self, now_s: float) -> None:
        """Account the bytes every active flow has moved by `now_s` (for utilisation)."""
        for flow in self.flows.values():
            self._settle(flow, now_s)

    # internals
    def _settle(self, flow: Flow, now_s: float) -> None:
        dt = now_s - flow.settled_s
        if dt > 0 and flow.rate > 0:
            moved = (
                min(flow.remaining_bytes, flow.rate * dt)
                if math.isfinite(flow.rate)
                else flow.remaining_bytes
            )
            flow.remaining_bytes -= moved
            for link in flow.path:
                self.bytes_on[link] = self.bytes_on.get(link, 0.0) + moved
        flow.settled_s = now_s

    def _component(self, seeds: Iterable[int]) -> list[int]:
        seen, stack = set(), [f for f in seeds if f in self.flows]
        while stack:
            fid = stack.pop()
            if fid in seen:
                continue
            seen.add(fid)
            for link in self.flows[fid].path:
                for other in self._users.get(link, ()):
                    if other not in seen:
                        stack.append(other)
        return list(seen)

    def _rebalance(self, now_s: float, seeds: Iterable[int]) -> None:
        component = self._component(seeds)
        flows = [self.flows[f] for f in component]
        for flow in flows:
            self._settle(flow, now_s)
        for flow, rate in zip(
            flows, max_min_rates([f.path for f in flows], self.capacity), strict=True
        ):
            flow.rate = rate
            flow.version += 1
            left = max(flow.remaining_bytes, 0.0)
            finish = (
                now_s
                if left <= DONE_BYTES or math.isinf(rate)
                else (now_s + left / rate if rate > 0 else math.inf)
            )
            if math.isfinite(finish):
                heapq.heappush(self._finish, (finish, flow.fid, flow.version))
