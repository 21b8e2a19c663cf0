"""Communication lower bounds that hold wherever a stage goes: point-to-point sends between device
classes, a stage's ZeRO-2/3 collectives, and the gradient exchange between templates.

Each is priced at the fastest pair of nodes of the classes involved, under the fastest planning
cluster, so it holds under every scenario and every placement.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from hetopt.cost.comm import group_gbps, reduce_scatter, transfer
from hetopt.cost.flops import layer_params, total_params
from hetopt.cost.profiles import Profiles
from hetopt.cost.terms import LAT, LINK, NET, STEP
from hetopt.cost.transfers import shared_gbps, slowest_transfer
from hetopt.evaluate import (
    grad_comm_bytes,
    p2p_features,
)
from hetopt.spec.instance import Instance


class SendBounds:
    """The communication lower bounds of a search run, memoised on this object (one search
    run's)."""

    def __init__(self, inst: Instance, profiles: Profiles, clusters: list | None = None) -> None:
        self.inst, self.profiles = inst, profiles
        self.clusters = clusters or [inst.cluster]
        """Every cluster a plan is timed on (the planning scenarios'): a send is bounded by its
        fastest."""
        self._sends: dict[tuple, float] = {}
        self._zero: dict[tuple, float] = {}
        self._exchange: dict[tuple, float] = {}
        self._template_nodes: dict[tuple, int] = {}
        self._node_sizes: dict[tuple[str, str], tuple[int, int]] = {}
        self._like_nodes: dict[tuple[str, str], tuple[set, set]] = {}  # node sizes, NIC speeds
        self._apart: dict[tuple, bool] = {}
        self._channels: dict[tuple, int] = {}
        self._packed: dict[tuple, tuple] = {}

    def send_s(
        self,
        src: tuple[str, str],
        dst: tuple[str, str],
        tp: int,
        micro_batch: int,
        flows: int = 1,
        apart: bool = False,
        stacked: int = 1,
    ) -> float:
        """Least seconds of one activation (or gradient) send from a stage of device class `src`
        (GPU type, island) of `tp` GPUs (its TP·CP ranks, each sending its share) to a stage of
        class `dst`: the fastest pair of their nodes (features.p2p_features, priced with the
        sender's weights), under the fastest planning cluster. Different GPU types never share a
        node, so a send between classes always crosses NICs. Alone on its links — except that
        between islands the `flows` replicas of a template all cross the same island links at once
        (every route from one island to another takes the same island path, Cluster.island_path), so
        each gets at most 1/flows of them (their max-min share, as p2p_features prices it).
        `apart`: the two stages never share a node (`stages_apart`), so a node is not paired with
        itself. `stacked`: with `apart`, this many sends of the same boundary leave the sender's
        node at once (`stacked`, the stage order), so they share its NIC."""
        if src[1] == dst[1]:
            # inside one island the replicas share no island link (their NICs are not bounded)
            flows = 1
        stacked = stacked if apart or src != dst else 1
        key = (src, dst, tp, micro_batch, flows, apart, stacked)
        if key not in self._sends:
            inst = self.inst
            nbytes = inst.format.act_bytes * micro_batch * inst.seq_len * inst.model.hidden
            w = self.profiles.for_gpu(inst.gpu_types[src[0]], inst.spec.training.framework).w
            pairs = self.node_pairs(src, dst)
            if apart and any(a != b for a, b in pairs):
                pairs = [(a, b) for a, b in pairs if a != b]
            self._sends[key] = min(
                float(self._send_features(cluster, a, b, nbytes, tp, flows, stacked) @ w)
                for cluster in self.clusters
                for a, b in pairs
            )
        return self._sends[key]

    def node_pairs(self, src: tuple[str, str], dst: tuple[str, str]) -> list[tuple[str, str]]:
        """Node pairs standing for every pair of a node of class `src` and one of `dst`: the nodes
        of a node group are identical, so the first of each group stands for it, and within one
        group also its first two (a pair of distinct nodes); a node with itself where `src` is
        `dst`."""
        nodes = self.inst.cluster.nodes
        groups: dict[str, list[str]] = {}
        for node in nodes.values():
            groups.setdefault(node.group, []).append(node.name)
        reps = {
            cls: [
                names
                for names in groups.values()
                if (nodes[names[0]].gpu, nodes[names[0]].island) == cls
            ]
            for cls in (src, dst)
        }
        pairs = []
        for a_names in reps[src]:
            for b_names in reps[dst]:
                pairs.append((a_names[0], b_names[0]))
                if a_names is b_names and len(a_names) > 1:
                    pairs.append((a_names[0], a_names[1]))
        return pairs

    @staticmethod
    def _send_features(
        cluster, a: str, b: str, nbytes: float, tp: int, flows: int, stacked: int = 1
    ):
        route = cluster.route(a, b)
        load: Counter = Counter()
        if flows > 1 and len(route.edges) > 2:
            # the edges between the two NIC edges are island links, which every replica's send
            # crosses
            load.update({e: flows for e in route.edges[1:-1]})
        if stacked > 1 and not route.intra_node:
            load[route.edges[0]] = stacked  # the sender's NIC, out
        if not load:  # alone, or inside one island: NICs are not shared
            return p2p_features(cluster, [a], [b], nbytes, tp)
        return slowest_transfer([(route, nbytes)], load)

    def zero_per_layer(self, seg, replicas: int, zero: int) -> tuple[float, float]:
        """(k^f, k^b): seconds per layer of a stage's ZeRO-2/3 collectives in one micro-batch's
        forward and backward pass, K^p(L) ≥ k^p·L wherever the stage goes (0 without ZeRO-2/3 or
        with one replica).

        Per pass (features.zero_stage): ZeRO-2 reduce-scatters the gradients in the backward pass,
        ZeRO-3 also all-gathers the 16-bit weights in both passes; over the stage's R replicas.
        Where R ≤ g/t (g GPUs per node) they may share one node: the collective on the fastest
        interconnect of the class's nodes; else — or where that is slower — they span ≥ ⌈R/(g/t)⌉ ≥
        2 nodes, and each node pushes (N−1)/N of its t columns' bytes across at no more than the
        widest route between two nodes of the class under the fastest planning cluster
        (comm.hierarchical_reduce_scatter: the intra-node phase only adds). Per layer: the
        collectives' cost at 2 layers less at 1 (latency and the embedding or head only add)."""
        if zero < 2 or replicas <= 1:
            return 0.0, 0.0
        # ZeRO-3 all-gathers the weights in both passes
        gather = self.inst.format.weight_bytes if zero >= 3 else 0.0
        return (
            self.collective_per_layer(seg, replicas, gather),
            self.collective_per_layer(seg, replicas, grad_comm_bytes(self.inst) + gather),
        )

    def collective_per_layer(self, seg, replicas: int, bytes_per_param: float) -> float:
        """Seconds per layer of a reduce-scatter (or all-gather: the same cost) of `bytes_per_param`
        per parameter of a stage of `seg`'s class among its R replicas, wherever they go
        (`zero_per_layer`)."""
        if replicas <= 1 or bytes_per_param <= 0:
            return 0.0
        key = (seg.gpu, seg.island, seg.tp, replicas, bytes_per_param)
        if key not in self._zero:
            inst = self.inst
            here = (seg.gpu, seg.island)
            nodes = [n for n in inst.cluster.nodes.values() if (n.gpu, n.island) == here]
            per_node = max(n.gpus // seg.tp for n in nodes)
            rank_bytes = layer_params(inst.model) / seg.tp * bytes_per_param
            w = self.profiles.for_gpu(inst.gpu_types[seg.gpu], inst.spec.training.framework).w
            options = []
            if replicas <= per_node:  # one node per node group stands for its identical nodes
                for node in {a for a, b in self.node_pairs(here, here) if a == b}:
                    route = inst.cluster.route(node, node)
                    gbps = group_gbps(route, replicas)
                    options.append(
                        float(
                            (
                                reduce_scatter(2 * rank_bytes, replicas, gbps, route.intra_node)
                                - reduce_scatter(rank_bytes, replicas, gbps, route.intra_node)
                            )
                            @ w
                        )
                    )
            if (ring := self.class_ring(here, seg.tp, replicas)) is not None:
                ring_nodes, gbps = ring[:2]
                volume = seg.tp * rank_bytes  # the node's t columns
                options.append(
                    float(
                        (
                            reduce_scatter(2 * volume, ring_nodes, gbps, False)
                            - reduce_scatter(volume, ring_nodes, gbps, False)
                        )
                        @ w
                    )
                )
            self._zero[key] = max(0.0, min(options, default=0.0))
        return self._zero[key]

    def class_ring(
        self, here: tuple[str, str], tp: int, replicas: int, spread: int = 1
    ) -> tuple[int, float, float, float] | None:
        """The ring of a stage's R replicas (class `here`, TP t) over nodes: at least ⌈R/k⌉ ≥ 2 of
        them (k = ⌊g/t⌋ stages per node), joined at no more than the widest route between two
        distinct nodes of the class and no less than its least latencies, under the fastest planning
        cluster: (nodes, Gbit/s, latency s, fabric latency s); None where the class has one node.
        `spread` s ≥ 2 (`spread`, the replica order): s rings share a NIC on the ring, which holds
        at most ⌈k/s⌉ replicas a node, so spans ⌈R/⌈k/s⌉⌉ nodes."""
        nodes = [n for n in self.inst.cluster.nodes.values() if (n.gpu, n.island) == here]
        per_node = max(n.gpus // tp for n in nodes)
        # the ring joins distinct nodes
        pairs = [(a, b) for a, b in self.node_pairs(here, here) if a != b]
        if not pairs or per_node < 1:
            return None
        routes = [c.route(a, b) for c in self.clusters for a, b in pairs]
        if spread > 1:
            return (
                max(2, -(-replicas // -(-per_node // spread))),
                max(shared_gbps(r, Counter({r.edges[0]: spread})) for r in routes),
                min(r.latency_us for r in routes) * 1e-6,
                min(r.alpha_s for r in routes),
            )
        return (
            max(2, -(-replicas // per_node)),
            max(r.effective_gbps for r in routes),
            min(r.latency_us for r in routes) * 1e-6,
            min(r.alpha_s for r in routes),
        )

    def template_nodes(
        self, segments: tuple, replicas: int, tp_in_node: bool = True, packed: tuple = ()
    ) -> int:
        """The most distinct nodes a template of `replicas` replicas of `segments` can use
        (features.template_nodes counts them): each rank of a stage (one per CP rank) is a TP group
        inside one node, or, wider than every node of its class, ⌈t/g⌉ whole nodes of one size g
        ≥ the class's smallest (placement rules); never more GPUs than it has, nor more nodes than
        its class holds. `tp_in_node` False (Megatron's rank order, which may cut a group at a node
        boundary): a node per GPU at most. `packed` (with `tp_in_node`): the classes the plan packs
        (`packed`), where the template's n groups take a run of them, starting at most k − 1 into
        a node: ⌈(n + k − 1)/k⌉ nodes at most. Memoised."""
        key = (segments, replicas, tp_in_node, packed)
        if key not in self._template_nodes:
            classes = self.inst.cluster.device_classes
            k_of = {cls: k for cls, k, _ in packed} if tp_in_node else {}
            groups: Counter = Counter()
            per_class: Counter = Counter()
            for seg in segments:
                groups[seg.gpu, seg.island] += replicas * seg.stages
                narrow, wide = self.node_sizes(seg.gpu, seg.island)
                group = seg.tp
                if tp_in_node:
                    group = 1 if seg.tp <= wide else min(seg.tp, -(-seg.tp // narrow))
                per_class[seg.gpu, seg.island] += replicas * seg.stages * seg.cp * group
            for cls, k in k_of.items():
                if cls in per_class:
                    per_class[cls] = min(per_class[cls], -(-(groups[cls] + k - 1) // k))
            self._template_nodes[key] = sum(
                min(n, len(classes[k].nodes)) for k, n in per_class.items()
            )
        return self._template_nodes[key]

    def stages_apart(self, gpu: str, island: str, tp: int) -> bool:
        """Whether two consecutive stages of one class at TP `tp` never send inside one node: no
        node of the class has more than t GPUs, so a TP group fills its node or takes whole nodes
        (placement rules) and leaves no room for the next stage's; in Megatron's rank order (tp,
        cp, dp, pp) a stage's replica r and the next stage's are t·cp·R ≥ t ranks apart, and ranks
        that far apart are never on one node of at most t GPUs. The evaluator sends from a stage's
        first node to the next one's (transfers.boundary_sends)."""
        return self.node_sizes(gpu, island)[1] <= tp

    def stages_paired(self, gpu: str, island: str, tp: int) -> bool:
        """Whether no node of a class holds three consecutive stages of one replica at TP `tp`: no
        node has more than 2t GPUs, so under the placement rules it holds two TP groups at most;
        in Megatron's rank order stages i − 1 and i + 1 of a replica are 2·t·cp·R ≥ 2t ranks apart.
        Then a stage whose neighbours are both of its class sends to one of them over NICs."""
        return self.node_sizes(gpu, island)[1] <= 2 * tp

    def node_sizes(self, gpu: str, island: str) -> tuple[int, int]:
        """The fewest and the most GPUs a node of a class has, memoised."""
        if (gpu, island) not in self._node_sizes:
            sizes = [n.gpus for n in self.inst.cluster.device_classes[gpu, island].nodes]
            self._node_sizes[gpu, island] = (min(sizes), max(sizes))
        return self._node_sizes[gpu, island]

    def nodes_at(self, sides: tuple, replicas: tuple) -> tuple[int, ...]:
        """`template_nodes` of each template (its segments, at most its replicas; the classes the
        sides pack): a cap that only rises with the replicas, so a box of replica counts takes its
        top corner's."""
        packed = self.packed(sides)
        return tuple(
            self.template_nodes(s, r, True, packed) for s, r in zip(sides, replicas, strict=True)
        )

    def apart(self, side_a: tuple, side_b: tuple) -> bool:
        """Whether no node can hold a stage of each of two templates (segments `side_a`, `side_b`):
        each TP group sits inside one node or takes whole nodes (placement rules), so a node of g
        GPUs holds groups of both only if g ≥ t_a + t_b for their narrowest groups in its class.
        False for sides of device classes (no TP degree yet)."""
        if not all(hasattr(s, "tp") for s in (*side_a, *side_b)):
            return False
        if (side_a, side_b) not in self._apart:
            apart = True
            for key in {(s.gpu, s.island) for s in side_a} & {(s.gpu, s.island) for s in side_b}:
                ta = min(s.tp for s in side_a if (s.gpu, s.island) == key)
                tb = min(s.tp for s in side_b if (s.gpu, s.island) == key)
                apart = apart and self.node_sizes(*key)[1] < ta + tb
            self._apart[side_a, side_b] = apart
        return self._apart[side_a, side_b]

    def filled_apart(self, sides: tuple, least: tuple[int, ...] | None, i: int, j: int) -> bool:
        """Whether templates i and j of a plan whose templates' segments are `sides` share at most
        one node and each use two at least, so that a hop between them has a flow over NICs (c ≥ 2
        node pairs, at most one of them a node with itself): both on one class K alone, K's nodes
        all of one size g and one NIC speed, every stage on K of the plan (`sides`) of one width w
        (TP·CP) dividing g, and each of the two more than g GPUs at `least` replicas (their fewest;
        None: unknown, False).

        Under the placement rules (placement.FreeGPUs.pick: one NIC speed, best fit; a stage stays
        on its neighbour's node only where that has room) at most one node of K is ever partly
        taken, and each group goes to it where there is one, else to a free node: induction on the
        groups placed, each a multiple of w. So the nodes of K fill one after another, a template's
        groups on K take a run of them, and two templates share only the node where one ended and
        the next began. False for sides of device classes (no TP degree yet)."""
        a, b = sides[i], sides[j]
        if least is None or not all(hasattr(seg, "tp") for side in sides for seg in side):
            return False
        classes = {(seg.gpu, seg.island) for seg in (*a, *b)}
        if len(classes) != 1:
            return False
        (key,) = classes
        sizes, nics = self.like_nodes(key)
        widths = {seg.width for side in sides for seg in side if (seg.gpu, seg.island) == key}
        if len(sizes) != 1 or len(nics) != 1 or len(widths) != 1:
            return False
        (g,), (w,) = sizes, widths
        if g % w:
            return False
        return all(least[k] * sum(seg.stages * seg.width for seg in sides[k]) > g for k in (i, j))

    def like_nodes(self, key: tuple[str, str]) -> tuple[set, set]:
        """The node sizes and the NIC speeds of a class, memoised."""
        if key not in self._like_nodes:
            nodes = self.inst.cluster.device_classes[key].nodes
            self._like_nodes[key] = ({n.gpus for n in nodes}, {n.nic_gbps for n in nodes})
        return self._like_nodes[key]

    def packed(self, sides: tuple) -> tuple[tuple[tuple[str, str], int, int], ...]:
        """The classes whose nodes a plan (its templates' segments `sides`) fills one after another
        with k ≥ 2 of its TP groups each, as (class, k, the templates on it): the class's nodes all
        of one size g and one NIC speed, and every stage of the plan on it of one width w (TP, no
        CP) with g = k·w.

        Under the placement rules (`filled_apart`'s proof) at most one node of such a class is ever
        partly taken and each group goes to it where there is one, else to a free node: the groups
        on it, in placement order, fill its nodes k at a time, and a template's groups take a run of
        them. `stacked` and `spread` read off what that does to a template's sends and rings in
        each placement order. Empty for sides of device classes (no TP degree yet). Memoised: every
        skeleton, share run and box asks."""
        if sides not in self._packed:
            self._packed[sides] = self._pack(sides)
        return self._packed[sides]

    def _pack(self, sides: tuple) -> tuple[tuple[tuple[str, str], int, int], ...]:
        if not all(hasattr(seg, "tp") for side in sides for seg in side):
            return ()
        widths: dict[tuple[str, str], set[int]] = {}
        on: Counter = Counter()
        for side in sides:
            on.update({(seg.gpu, seg.island) for seg in side})
            for seg in side:
                widths.setdefault((seg.gpu, seg.island), set()).add(
                    seg.width if seg.cp == 1 else -1
                )
        out = []
        for key, ws in sorted(widths.items()):
            sizes, nics = self.like_nodes(key)
            if len(sizes) == 1 and len(nics) == 1 and len(ws) == 1:
                (g,), (w,) = sizes, ws
                if w > 0 and g % w == 0 and g // w >= 2:
                    out.append((key, g // w, on[key]))
        return tuple(out)

    @staticmethod
    def stacked(replicas: int, k: int) -> int:
        """The stage order on a packed class (k groups a node, `packed`): the fewest sends of one
        stage boundary that leave one node at once. A stage's R ≥ k replicas are R consecutive
        groups, on at most ⌈(R + k − 1)/k⌉ ≤ (R + 2k − 2)/k nodes, so one node holds at least
        ⌈R·k/(R + 2k − 2)⌉ of them (a count that rises with R); its next stage's replica r is R ≥ k
        groups on, never on the same node, so every one of them sends through that node's NIC at
        once (the replicas cross a boundary together: send_features). 1 where R < k."""
        if replicas < k:
            return 1
        return -(-replicas * k // (replicas + 2 * k - 2))

    @staticmethod
    def spread(replicas: int, k: int, stages_on: int, alone: bool) -> int:
        """The replica order on a packed class (k groups a node, `packed`), a template of R
        replicas with P = `stages_on` stages on it (`alone`: no other template on the class): how
        many gradient rings share a NIC on the ring of each of those stages (1: nothing known).

        The template's groups on the class are a run in (replica, stage) order, stage i of replica
        r at r·P + i; a node the run fills holds k consecutive positions, and one exists wherever
        the run has 2k − 1 groups (k alone: the run then starts a node). P ≥ k, R ≥ 3 (R ≥ 2
        alone): replica 1's group is at least P ≥ k from either end of the run (alone, replica 0's
        is at most P + k − 2 < R·P from its start), so on a node the run fills, with k distinct
        stages, each with its replicas P ≥ k apart on R distinct nodes: k rings. 2 ≤ P < k: a node
        the run fills holds every one of the P stages, at most ⌈k/P⌉ replicas of each, and each
        ring spans more than one node where R > ⌈k/P⌉: P rings. So that node sends out that many
        rings (features.dp_ring_load), and each of those stages' rings runs at most at that
        share of the NIC (`class_ring`)."""
        if stages_on >= k:
            return k if replicas >= 3 or (alone and replicas >= 2) else 1
        per_node = -(-k // stages_on)
        if stages_on >= 2 and replicas > per_node and (alone or replicas * stages_on >= 2 * k - 1):
            return stages_on
        return 1

    def exchange_s(
        self,
        side_a: tuple,
        side_b: tuple,
        others: tuple = (),
        nodes: tuple | None = None,
        tp_in_node: bool = True,
        least: tuple[int, int] | None = None,
    ) -> float:
        """T_cross ≥ this for two templates whose segments are `side_a` and `side_b`: the templates'
        exchange (features.cross_template_exchange) sends the model's gradients G from each template
        to the other over at most c = min(nodes of a's classes, nodes of b's) node pairs, so some
        flow carries G/c bytes. It takes no less than alone on its route, and no less than over the
        fastest pair of nodes of the two sides' classes (a node with itself where a class is on both
        sides) under the fastest planning cluster, priced with the least of the two sides' GPU
        types' weights (the exchange is priced with one template's first stage's; every weight of a
        transfer is ≥ 0, else no bound: 0). `others`: the segments of the plan's other templates,
        whose GPU types' weights are counted too (a ring of three is priced with whichever template
        comes first). `nodes`: the most nodes each of the two templates can use (`template_nodes`),
        which also caps c: the evaluator spreads a hop over as many node pairs as the smaller
        template has nodes. Where no node can hold a stage of each template (`apart`; with
        `tp_in_node`, False for Megatron's rank order, which may cut a group at a node boundary) a
        node is never paired with itself; so too where the two fill nodes of one class one after
        the other (`filled_apart`, at `least` replicas each: a flow crosses NICs, and every flow
        carries G/c at least)."""
        keys = tuple(
            tuple(sorted({(seg.gpu, seg.island) for seg in side})) for side in (side_a, side_b)
        )
        weighed = tuple(sorted({seg.gpu for side in (side_a, side_b, *others) for seg in side}))
        apart = tp_in_node and (
            self.apart(side_a, side_b) or self.filled_apart((side_a, side_b, *others), least, 0, 1)
        )
        return self._exchange_parts(keys, weighed, min(nodes) if nodes else None, apart)[0]

    def _exchange_parts(
        self,
        keys: tuple,
        weighed: tuple[str, ...],
        most_channels: int | None = None,
        apart: bool = False,
    ) -> tuple[float, float, float, float]:
        """(`exchange_s`, its flow's least raw seconds — bytes over bandwidth plus latency, what
        features.slowest_transfer ranks flows by —, the least of the weights of those terms and the
        least step weight over the GPU types `weighed`); all 0 where a weight of a transfer is
        negative. `most_channels`: the most node pairs the hop can use, if fewer than its
        classes' nodes; `apart`: no node holds both ends of a flow."""
        if keys not in self._channels:
            classes = self.inst.cluster.device_classes
            self._channels[keys] = min(sum(len(classes[k].nodes) for k in side) for side in keys)
        channels = self._channels[keys]
        if most_channels is not None:
            channels = min(channels, most_channels)
        memo = (keys, weighed, channels, apart)
        if memo not in self._exchange:
            inst = self.inst
            total_bytes = total_params(inst.model) * grad_comm_bytes(inst)
            nbytes = total_bytes / channels
            weights = [
                self.profiles.for_gpu(inst.gpu_types[gpu], inst.spec.training.framework).w
                for gpu in weighed
            ]
            best, raw = math.inf, math.inf
            for cluster in self.clusters:
                # a hop each way round the ring
                for here, there in ((keys[0], keys[1]), (keys[1], keys[0])):
                    pairs = [
                        pair for src in here for dst in there for pair in self.node_pairs(src, dst)
                    ]
                    if apart and any(a != b for a, b in pairs):
                        pairs = [(a, b) for a, b in pairs if a != b]
                    routes = [cluster.route(a, b) for a, b in pairs]
                    cut_gbps = _shared_island_gbps(routes, here, there)
                    for route in routes:
                        features = transfer(
                            nbytes,
                            shared_gbps(route, Counter()),
                            route.intra_node,
                            latency_s=route.latency_us * 1e-6,
                            alpha_s=route.alpha_s,
                        )
                        if cut_gbps is not None:
                            features = np.maximum(
                                features,
                                transfer(
                                    total_bytes,
                                    cut_gbps,
                                    False,
                                    latency_s=route.latency_us * 1e-6,
                                    alpha_s=route.alpha_s,
                                ),
                            )
                        best = min(best, min(float(features @ w) for w in weights))
                        raw = min(raw, float(features[LINK] + features[NET] + features[LAT]))
            transfer_terms = [LINK, NET, STEP, LAT]
            if all(min(w[transfer_terms]) >= 0 for w in weights):
                self._exchange[memo] = (
                    best,
                    raw,
                    min(min(w[[LINK, NET, LAT]]) for w in weights),
                    min(w[STEP] for w in weights),
                )
            else:
                self._exchange[memo] = (0.0, 0.0, 0.0, 0.0)
        return self._exchange[memo]

    def ring_exchange_s(
        self,
        sides: tuple,
        nodes: tuple | None = None,
        tp_in_node: bool = True,
        least: tuple[int, ...] | None = None,
    ) -> float:
        """T_cross ≥ this for the templates whose segments are `sides`: with two, `exchange_s`; with
        three (a ring a → b → c → a in any order, so every pair of them is a hop, each flow carrying
        4G/3 ≥ G of gradients over at most as many channels as `exchange_s` counts) the evaluator
        prices the one flow of most raw seconds (features.slowest_transfer) with one template's
        weights. That flow is a hop's: T_cross ≥ the least pair's `exchange_s`. And its raw seconds
        are the most of all flows', so at least every hop's least: T_cross ≥ ω·max_pairs raw + σ (ω
        the least weight of the seconds' terms, σ the least step weight, over all three templates'
        GPU types). The larger of the two; 0 with one template, or more than three (no pair need be
        a hop). `nodes`: the most nodes each template can use, `tp_in_node` and `least` (the
        fewest replicas of each: `exchange_s`)."""
        if len(sides) == 2:
            return self.exchange_s(*sides, nodes=nodes, tp_in_node=tp_in_node, least=least)
        if len(sides) != 3:
            return 0.0
        weighed = tuple(sorted({seg.gpu for side in sides for seg in side}))
        parts = [
            self._exchange_parts(
                tuple(
                    tuple(sorted({(seg.gpu, seg.island) for seg in side}))
                    for side in (sides[i], sides[j])
                ),
                weighed,
                min(nodes[i], nodes[j]) if nodes else None,
                tp_in_node
                and (self.apart(sides[i], sides[j]) or self.filled_apart(sides, least, i, j)),
            )
            for i, j in ((0, 1), (0, 2), (1, 2))
        ]
        slowest = max(raw for _, raw, _, _ in parts)
        omega, sigma = parts[0][2], parts[0][3]
        return max(min(best for best, _, _, _ in parts), omega * slowest + sigma)


def _shared_island_gbps(routes: list, here: tuple, there: tuple) -> float | None:
    """What a hop of the templates' exchange from classes `here` to classes `there` gets at most
    of the island links every one of its flows crosses (`routes`: one per pair of nodes that
    stands for them), or None where there is none: the sides' islands apart, the edges between
    the two NIC edges of a route are island links (Cluster.island_path, one path per pair of
    islands), taken the same way by every flow. The hop's c flows carry at least G/c bytes each
    (2(K−1)/K·G ≥ G in all) and share such a link C evenly (`shared_gbps`), so each takes at least
    (G/c)/(C/c) = G/C on the wire, whatever c is: the hop runs at no more than the narrowest
    shared link."""
    if {k[1] for k in here} & {k[1] for k in there} or not routes:
        return None
    common = set.intersection(*(set(r.edges[1:-1]) for r in routes))
    if not common:
        return None
    return min(
        c for r in routes for e, c in zip(r.edges, r.edge_effective, strict=True) if e in common
    )
