"""Subtrees expanded by the workers: the search's inner nodes handed out beside its leaves, so that
expanding and bounding use every core, not only the skeletons' solves (docs/planner.md, "Workers
expand subtrees").

A worker given a chunk of inner nodes expands them best-first, each node against the incumbent the
job carries, while the least open key is at most the job's cutoff (the search's next key when the
batch was sent), until it has made SUBTREE_NODES nodes or the deadline passes; it sends back the
open nodes it did not expand (the leaves it reached keyed by their own bounds) and what it counted.
Each worker builds its own `Tree` of the search's instance and space once, with bounds memoised in
that worker. A node a worker did not expand keeps a key that holds for every skeleton under it, as
in the search's own heap, so the search's bound and proof are those of expanding in one process;
before the deadline, what a job makes depends only on the job, not on which worker ran it or when.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time

from hetopt.search.bounds.run import Bounds
from hetopt.search.leaves import LeafContext, solve_leaf
from hetopt.search.run import OPTIMALITY_TOLERANCE
from hetopt.search.tree.base import Expanded, Node, Tree
from hetopt.search.types import SearchStats

SUBTREE_NODES = 1_000
"""The most nodes one job makes, so that one job's expanding (about 0.2–0.6 s at the 1,700–5,000
nodes a second of the stress suite) does not hold up its batch's leaves; the cutoff ends most jobs
first (195 nodes a job on dual-01 at 60 s, 2026-12-07)."""
SUBTREE_ROOTS = 16
"""Inner nodes per worker in a batch, sent as one job: expanding one node best-first below the
search's next key makes a handful of nodes (5 on dual-01), less work than the job's round trip."""

SUBTREE_WORKERS = 3
"""Workers from which subtrees are handed out by default (SearchRequest.subtrees None). With two
workers on two cores (the default here) the search's own process is a third, and the cores are
full already: measured 2026-12-07 at 60 s, subtrees made 8–22% more nodes and lowered the gap on
dual-01 (11.65% → 10.99%) and wan5-03 (35.03% → 34.57%), but the search solved fewer skeletons,
and its incumbent stayed higher on cloud4-05 (gap 20.64% → 24.75%) and bigbatch-00 (proven at 56 s
→ 3.04% open) (docs/planner.md, "Workers expand subtrees")."""

LEAF, SUBTREE = "leaf", "subtree"


def expand_subtree(
    tree: Tree,
    roots: tuple[Node, ...],
    incumbent: float,
    budget: int,
    deadline: float = math.inf,
    cutoff: float = math.inf,
) -> Expanded:
    """Expand `roots` best-first within their subtrees, against `incumbent`.

    Parameters: tree — a tree of the search's instance and space (its `stats` are replaced by the
    job's); roots — nodes of the search's heap (inner nodes, as the search sends them; a leaf is
    refined); incumbent — the search's best time when the job was sent; budget — the most nodes to
    make; deadline — a time.time() after which nothing more is expanded; cutoff — nothing keyed
    above it is expanded.
    Returns: the open nodes not expanded (the leaves popped refined: their own bounds), the nodes
    made, and the job's counts. A node the incumbent beats is counted as pruned under its rule, not
    returned."""
    stats = SearchStats()
    tree.stats, tree.incumbent = stats, incumbent
    tie = itertools.count()
    heap = [(root.bound, next(tie), root) for root in roots]
    heapq.heapify(heap)
    leaves: list[Node] = []
    made = 0
    while heap and heap[0][0] <= cutoff and made < budget and time.time() < deadline:
        _, _, node = heapq.heappop(heap)
        if tree.beaten(node.bound):
            node.count_pruned(stats)
            continue
        if node.is_leaf:
            if not node.refined:
                node = tree.refine(node)
            if tree.beaten(node.bound):
                node.count_pruned(stats)
            else:
                leaves.append(node)
            continue
        kids = node.expand(tree)
        made += 1 + len(kids)
        for kid in kids:
            if tree.beaten(kid.bound):
                kid.count_pruned(stats)
            elif tree.keeps(kid):
                heapq.heappush(heap, (kid.bound, next(tie), kid))
    return Expanded([*leaves, *(node for _, _, node in heap)], made, stats)


_TREE: tuple[LeafContext, Tree] | None = None
"""This worker's tree, built for the context it was given (one per pool: its bounds' memo)."""


def worker_tree(ctx: LeafContext) -> Tree:
    """The tree a worker expands subtrees in: built once per context, its bounds memoised here."""
    global _TREE
    if _TREE is None or _TREE[0] is not ctx:
        assert ctx.options is not None, "a subtree job needs the search's space in its context"
        clusters = [sc.instance.cluster for sc in ctx.scenarios]
        bounds = Bounds(ctx.inst, ctx.profiles, clusters)
        tree = Tree(ctx.inst, ctx.options, SearchStats(), bounds, ctx.budget)
        tree.tolerance = OPTIMALITY_TOLERANCE
        _TREE = (ctx, tree)
    return _TREE[1]


def work(ctx: LeafContext, kind: str, *job):
    """One job of a worker: a leaf's solve (`solve_leaf`'s arguments and outcome) or a chunk of
    subtrees' expansion ((roots, limit, incumbent, budget, cutoff) → `Expanded`; limit as
    `solve_leaf`'s: (deadline as a time.time(), seconds left when sent), whichever ends first)."""
    if kind == LEAF:
        return solve_leaf(ctx, *job)
    roots, (deadline, left_s), incumbent, budget, cutoff = job
    until = min(deadline, time.time() + left_s)
    return expand_subtree(worker_tree(ctx), roots, incumbent, budget, until, cutoff)
