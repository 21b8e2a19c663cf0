"""The replica-aware bound of a set of one-template families with their first classes decided (the
search tree's ChoiceNode, hetopt.search.tree.choices).

The throughput bound T ≥ M·N / Σ_k G_k/(t_k·a_k) counts every GPU of every class in at full rate.
A template cannot use them so: each of its R replicas runs at least one stage of each class in, so R
≤ G_k/t_k for the smallest class, and a replica holds at most P = min(max_stages, N, M/R) stages.
At R replicas with m = M/R micro-batches each, every stage i of class k holding L_i layers has

    T ≥ w_k·L_i,   w_k = m·a_k                      (1F1B or interleaved: T ≥ m·max τ ≥ m·a_k·L_i)
                   w_k = max(m·a_k, e_k)            (1F1B, ZeRO ≤ 1: and what it cannot shed, e_k
                                                     of `TemplateBounds.unshed_per_layer`)

so with Σ L_i = N, T ≥ N / Σ_i 1/w_i = N / Σ_k n_k/w_k, n_k the stages of class k (1 ≤ n_k ≤
⌊G_k/(t_k·R)⌋, Σ n_k ≤ P). Σ_k n_k/w_k is at most either of

    (a) Σ_k min(P, ⌊G_k/(t_k·R)⌋)/w_k      each class at its most stages (an open class at its best
                                            TP degree, the `room` best open classes);
    (b) Σ_{k in} 1/w_k + (P − |in|)/w_min   one stage per class in, the others at the least w any
                                            class could give,

and T ≥ N / min((a), (b)) at each R that divides M (`Family.replica_counts`). Each class in holds
a stage of one layer at least, so also T ≥ w_k for every class in: a slow class beside fast ones
costs a whole layer's time, which the rate alone spreads thin. The least over R. Each
family under the node is bounded so at each of its replica counts, so the least over R bounds them
all.

With two classes in or more, the key also takes the pipeline's fill and the sends beside the
changes of class (`_pipeline`): an order is a path through the classes in. With every class decided
the path's sends are at least a least spanning tree's; with some open, the path may pass through
open classes, and rooted at any class in, every other class in (and every other island of a class
in) has an edge of its own into it, at least its least edge to any class that could be in
(`_least_reach`): on clusters of islands joined by slow links, the WAN sends a choice must pay.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from hetopt.search.bounds.templates import TemplateBounds
from hetopt.search.types import Segment


class ChoiceBounds:
    """The replica-aware bound of one micro-batch size's families (module docstring), its per-class
    tables built once.

    Parameters: templates — the run's `TemplateBounds`; classes — the cluster's device classes in
    order; tps — each class's TP degrees; batch — (b, M, cp); recompute — the least-work mode;
    max_stages — P's cap; unshed — whether every family is 1F1B with ZeRO ≤ 1 (e_k applies) at
    R > 1, and `unshed_one` at R = 1."""

    def __init__(
        self,
        templates: TemplateBounds,
        classes: list,
        tps: list[tuple[int, ...]],
        batch: tuple[int, int, int],
        recompute: str,
        max_stages: int,
        virtual: int,
        unshed: bool,
        unshed_one: bool,
    ) -> None:
        b, total_mb, cp = batch
        layers = templates.inst.model.layers
        self.layers, self.sends, self.batch = layers, templates.sends, batch
        self.virtual = virtual
        self.keys = [(dc.gpu, dc.island) for dc in classes]
        self.per_layer: list[dict[int, float]] = []
        self._edges: dict[tuple[int, int, int, int], np.ndarray] = {}
        self._least_edges: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        tops = [dc.gpus // (min(t) * cp) for dc, t in zip(classes, tps, strict=True) if t]
        self.replicas = np.array(
            [r for r in range(1, max(tops, default=0) + 1) if total_mb % r == 0], dtype=float
        )
        rs = self.replicas.astype(int)
        m = total_mb // rs
        self.cap = np.minimum(np.minimum(max_stages, layers), m).astype(float)
        # per class, per TP degree: the most stages at each R and the weight w (inf: no stage fits)
        self.most: list[dict[int, np.ndarray]] = []
        self.weight: list[dict[int, np.ndarray]] = []
        for dc, options in zip(classes, tps, strict=True):
            most, weight = {}, {}
            self.per_layer.append({})
            for t in options:
                n = np.minimum(self.cap, dc.gpus // (t * cp * rs))
                a = templates.per_layer_s(dc.gpu, t, b, recompute, cp)
                self.per_layer[-1][t] = a
                w = m * max(a, 0.0)
                seg = Segment(dc.gpu, dc.island, t, 1, cp)
                for j, r in enumerate(rs):
                    if n[j] >= 1 and (unshed if r > 1 else unshed_one):
                        e = templates.unshed_per_layer(seg, b, recompute, int(r), int(m[j]))
                        w[j] = max(w[j], e)
                w = np.where(n >= 1, w, np.inf)
                most[t], weight[t] = n, w
            self.most.append(most)
            self.weight.append(weight)
        with np.errstate(divide="ignore", invalid="ignore"):
            # a class's most Σ n/w at each R, at its best TP degree (inf where some w is 0)
            best = [
                np.max([_rate(most[t], weight[t]) for t in most], axis=0)
                if most
                else np.zeros_like(self.cap)
                for most, weight in zip(self.most, self.weight, strict=True)
            ]
            least_w = [
                np.min([weight[t] for t in weight], axis=0)
                if weight
                else np.full_like(self.cap, np.inf)
                for weight in self.weight
            ]
        # each class's most Σ n/a and least a at each R over its TP degrees (compute alone: the
        # pipeline bound's units), for the open classes of `_open_pipeline`
        self.pipe_rate: list[np.ndarray] = []
        self.pipe_least: list[np.ndarray] = []
        for k, most in enumerate(self.most):
            rate, least_a = np.zeros_like(self.cap), np.full_like(self.cap, np.inf)
            for t, n in most.items():
                a = self.per_layer[k][t]
                rate = np.maximum(rate, n / a if a > 0 else np.inf)
                least_a = np.where(n >= 1, np.minimum(least_a, a), least_a)
            self.pipe_rate.append(rate)
            self.pipe_least.append(least_a)
        # the open classes from i on: the best `room` of them (cumulative, descending), least w
        self.open_sum: list[np.ndarray] = []
        self.open_least: list[np.ndarray] = []
        for i in range(len(classes) + 1):
            rest = np.array(best[i:]).reshape(len(classes) - i, len(self.cap))
            ranked = -np.sort(-rest, axis=0)
            self.open_sum.append(
                np.vstack([np.zeros((1, len(self.cap))), np.cumsum(ranked, axis=0)])
            )
            self.open_least.append(
                np.min(np.array(least_w[i:]).reshape(-1, len(self.cap)), axis=0, initial=np.inf)
            )

    def bound(
        self, chosen: tuple[int, ...], room: int, order: tuple[int, ...] | None = None
    ) -> float:
        """Every family whose first classes are `chosen` (a TP degree each, 0: out), with at most
        `room` of the open classes in; inf where no replica count is left. `order`: every class
        decided, the one family that runs the classes in in this order (class indices), whose
        sends are those of its path, not of the least spanning tree."""
        ins = [(k, t) for k, t in enumerate(chosen) if t]
        if not len(self.cap):
            return math.inf
        fits = self.cap >= len(ins)
        rate_in = np.zeros_like(self.cap)
        most_in = np.zeros_like(self.cap)
        least = self.open_least[len(chosen)] if room > 0 else np.full_like(self.cap, np.inf)
        with np.errstate(divide="ignore", invalid="ignore"):
            for k, t in ins:
                n, w = self.most[k][t], self.weight[k][t]
                fits &= np.isfinite(w)
                rate_in = rate_in + 1 / w
                most_in = most_in + _rate(n, w)
                least = np.minimum(least, w)
            open_rows = self.open_sum[len(chosen)]
            opened = open_rows[min(room, len(open_rows) - 1)] if room > 0 else 0.0
            if not ins:  # at least one open class must fit
                fits &= np.isfinite(least)
            most_sum = most_in + opened
            budget = rate_in + (self.cap - len(ins)) / least
            budget = np.where(self.cap > len(ins), budget, rate_in)
            rate = np.minimum(most_sum, budget)
            times = np.where(fits, self.layers / rate, np.inf)
            for k, t in ins:  # each class in holds a stage of one layer at least: T ≥ w_k
                times = np.maximum(times, self.weight[k][t])
            opens = [k for k in range(len(chosen), len(self.keys)) if self.most[k]]
            if len(ins) > 1 and (not opens or room <= 0):  # the classes in are the family's
                times = np.maximum(times, self._pipeline(ins, order))
            elif len(ins) > 1:
                times = np.maximum(times, self._open_pipeline(ins, opens, room))
        best = float(np.min(times, initial=np.inf))
        return 0.0 if math.isnan(best) else best

    def _pipeline(
        self, ins: list[tuple[int, int]], order: tuple[int, ...] | None = None
    ) -> np.ndarray:
        """`FamilyBounds.pipeline_bucket` of every order of the classes `ins` (k, t_k), every class
        decided, at each R: T ≥ (m − 1/v)·λ + max(λ, S)/v with λ = (N + W)/max Σ n_k/a_k and S =
        N·a_min + Σ_k (a_k − a_min) + C, where W and C are the least Σ c_i/a_i and Σ c_i of the
        sends beside the changes of class of any order (`_least_tree`), or those of `order`'s path
        where one is given, and Σ n_k/a_k is bounded as (a) and (b) of the module docstring."""
        a = np.array([self.per_layer[k][t] for k, t in ins])
        if a.min() <= 0:
            return np.zeros_like(self.cap)
        most = np.array([self.most[k][t] for k, t in ins])
        rate = np.minimum(
            (most / a[:, None]).sum(axis=0),
            (1 / a).sum() + np.maximum(self.cap - len(ins), 0) / a.min(),
        )
        tp = dict(ins)
        path = [self._edge(k, tp[k], j, tp[j]) for k, j in itertools.pairwise(order or ())]
        if order is None or any(float(np.min(part)) < 0 for pair in path for part in pair):
            weighted, plain = self._least_tree(ins)
        else:  # one family: the sends at its changes of class, in its order (wrapping round
            # under interleaving only adds sends, none negative)
            weighted, plain = sum(w for w, _ in path), sum(c for _, c in path)
        least_sum = self.layers * a.min() + (a - a.min()).sum() + plain
        m, v = self.batch[1] / self.replicas, self.virtual
        with np.errstate(divide="ignore", invalid="ignore"):
            lam = (self.layers + weighted) / rate
            times = (m - 1 / v) * lam + np.maximum(lam, least_sum) / v
        return np.where(rate > 0, times, np.inf)  # rate 0: no replica fits at R

    def _open_pipeline(self, ins: list[tuple[int, int]], opens: list[int], room: int) -> np.ndarray:
        """`_pipeline` of the families whose classes are `ins` (k, t_k) and at most `room` of the
        open classes `opens`: with Σ n_k/a_k bounded as (a) and (b) of the module docstring, the
        open classes at their best TP degree, a_min the least a of any class that could be in, and
        W and C the least Σ c_i/a_i and Σ c_i that an order reaching every class in, through open
        classes or not, must pay (`_least_reach`)."""
        a = np.array([self.per_layer[k][t] for k, t in ins])
        if a.min() <= 0 or any(self.per_layer[k][t] <= 0 for k in opens for t in self.most[k]):
            return np.zeros_like(self.cap)
        most = np.array([self.most[k][t] for k, t in ins])
        opened = np.zeros_like(self.cap)
        if opens:
            ranked = -np.sort(-np.array([self.pipe_rate[k] for k in opens]), axis=0)
            opened = ranked[: min(room, len(opens))].sum(axis=0)
        a_min = np.minimum(
            a.min(), np.min([self.pipe_least[k] for k in opens], axis=0, initial=np.inf)
        )
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = np.minimum(
                (most / a[:, None]).sum(axis=0) + opened,
                (1 / a).sum() + np.maximum(self.cap - len(ins), 0) / a_min,
            )
            weighted, plain = self._least_reach(ins, opens)
            least_sum = self.layers * a_min + (a[:, None] - a_min).sum(axis=0) + plain
            m, v = self.batch[1] / self.replicas, self.virtual
            lam = (self.layers + weighted) / rate
            times = (m - 1 / v) * lam + np.maximum(lam, least_sum) / v
        return np.where(rate > 0, times, np.inf)

    def _least_reach(
        self, ins: list[tuple[int, int]], opens: list[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """At each R, lower bounds on Σ c_i/a_i and on Σ c_i over the sends of any order of the
        classes `ins` and some of `opens` (each at any TP degree). The order is a path, so rooted
        at any class in, every other class in has its own parent edge, at least the least edge it
        has to any class that could be in: the sum of those least edges less the smallest. So too
        for islands: the path's edges between islands join the islands it visits, so every island
        of a class in but the root's has its own edge out of it, at least the least edge from a
        class that could be in on that island to one elsewhere. The larger of the two sums."""
        nodes = [(k, (t,)) for k, t in ins] + [(k, tuple(self.most[k])) for k in opens]

        edges = {
            (u, v): self._least_edge(*nodes[u], *nodes[v])
            for u in range(len(nodes))
            for v in range(u + 1, len(nodes))
        }

        if any(float(np.min(part)) < 0 for pair in edges.values() for part in pair):
            # an order's sends are at least the edges it keeps only where none is negative (no
            # shipped profile has a negative weight; a custom one might)
            return np.zeros_like(self.cap), np.zeros_like(self.cap)

        def edge(u: int, v: int) -> tuple[np.ndarray, np.ndarray]:
            return edges[min(u, v), max(u, v)]

        def rooted(outs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
            """Σ over the groups of nodes `outs` (its own nodes, the others) of the least edge
            leaving it, less the smallest; 0 with fewer than two groups."""
            if len(outs) < 2:
                return np.zeros_like(self.cap), np.zeros_like(self.cap)
            sums = []
            for part in (0, 1):
                least = np.array(
                    [
                        np.min(
                            [
                                edge(u, v)[part]
                                for u in own
                                for v in range(len(nodes))
                                if v not in own
                            ],
                            axis=0,
                        )
                        for own in outs
                    ]
                )
                sums.append(least.sum(axis=0) - least.min(axis=0))
            return sums[0], sums[1]

        by_class = rooted([[u] for u in range(len(ins))])
        islands = sorted({self.keys[k][1] for k, _ in ins})
        by_island = rooted(
            [[u for u, (k, _) in enumerate(nodes) if self.keys[k][1] == isl] for isl in islands]
        )
        return np.maximum(by_class[0], by_island[0]), np.maximum(by_class[1], by_island[1])

    def _least_edge(
        self, k: int, tks: tuple[int, ...], j: int, tjs: tuple[int, ...]
    ) -> tuple[np.ndarray, np.ndarray]:
        """`_edge` between classes k and j, each at the least over its TP degrees `tks`, `tjs`
        (both parts apart), memoised."""
        key = (k, tks, j, tjs)
        if key not in self._least_edges:
            pairs = [self._edge(k, t, j, tj) for t in tks for tj in tjs]
            self._least_edges[key] = (
                np.min([w for w, _ in pairs], axis=0),
                np.min([c for _, c in pairs], axis=0),
            )
        return self._least_edges[key]

    def _least_tree(self, ins: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
        """At each R, lower bounds on Σ c_i/a_i and on Σ c_i over the stages beside the changes of
        class of any order of `ins`: an order is a path through the classes, a spanning tree, so
        each sum is at least a least spanning tree's (Prim's), edge k–l weighing c(k→l)/a_k +
        c(l→k)/a_j and c(k→l) + c(l→k) (`SendBounds.send_s`, the R replicas sharing island
        links)."""
        pairs = [(i, j) for i in range(len(ins)) for j in range(i + 1, len(ins))]
        edges = {(i, j): self._edge(*ins[i], *ins[j]) for i, j in pairs}
        return (
            np.array(
                [
                    _least_tree(len(ins), {e: w[0][r] for e, w in edges.items()})
                    for r in range(len(self.cap))
                ]
            ),
            np.array(
                [
                    _least_tree(len(ins), {e: w[1][r] for e, w in edges.items()})
                    for r in range(len(self.cap))
                ]
            ),
        )

    def _edge(self, k: int, tk: int, j: int, tj: int) -> tuple[np.ndarray, np.ndarray]:
        """(c(k→j)/a_k + c(j→k)/a_j, c(k→j) + c(j→k)) at each R: the two stages beside a change
        from class k (TP t_k) to class j (or back), memoised."""
        key = (k, tk, j, tj)
        if key not in self._edges:
            b, _, cp = self.batch
            ak, aj = self.per_layer[k][tk], self.per_layer[j][tj]
            there = np.array(
                [
                    self.sends.send_s(self.keys[k], self.keys[j], tk * cp, b, int(r))
                    for r in self.replicas
                ]
            )
            back = np.array(
                [
                    self.sends.send_s(self.keys[j], self.keys[k], tj * cp, b, int(r))
                    for r in self.replicas
                ]
            )
            self._edges[key] = (there / ak + back / aj, there + back)
        return self._edges[key]


def _least_tree(size: int, weight: dict[tuple[int, int], float]) -> float:
    """The weight of a least spanning tree of the complete graph on `size` vertices (Prim's),
    `weight` of each edge (i, j), i < j."""
    reached, left, total = {0}, set(range(1, size)), 0.0
    while left:
        w, j = min((weight[min(i, j), max(i, j)], j) for i in reached for j in left)
        total += w
        reached.add(j)
        left.discard(j)
    return total


def _rate(most: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """n/w at each R, 0 where no stage fits (w = inf)."""
    return np.where(np.isfinite(weight), most / weight, 0.0)
