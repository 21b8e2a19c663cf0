"""Lower bounds and memory tests that order and prune the search, each with its statement.

A bound holds for every skeleton in the set it keys (a family, a replica count, a group, a range of
replica counts, one skeleton): no split of any of them is faster. Bounds need no placement. Every
stage's time per micro-batch is τ_i(L) ≥ a_i·L + c_i (`TemplateBounds.stage_line`), plus the sends
it must make wherever it goes (`SendBounds.send_s`: the fastest pair of nodes, under the fastest
planning cluster). So the bounds hold under every scenario. Memory tests use the evaluator's own
memory model, affine in a stage's layers. Every node's bound is checked against the skeletons under
it (tests/test_bounds.py), and the skeleton bounds against every split of sampled skeletons, robust
objectives included (tests/test_planner.py).

The modules mirror the enumerators and the search tree's nodes:

- `lines`: pure functions of stage lines (water levels, least sums, a pipeline's bound);
- `memory`: the most layers each stage holds (`MemoryBounds`);
- `sends`: sends, ZeRO-2/3 collectives and the templates' exchange (`SendBounds`);
- `templates`: one template's lines, pipeline and drain (`TemplateBounds`);
- `families`: one-template families and buckets (`FamilyBounds`);
- `choices`: the one-template families with their first classes decided (`ChoiceBounds`);
- `pairs`: two templates side by side (`PairBounds`);
- `triples`: three templates side by side (`TripleBounds`);
- `reach`: what single-class templates side by side take below a level (`TemplateReach`);
- `skeletons`: one skeleton, a leaf (`SkeletonBounds`);
- `placed`: a placed and linearised skeleton (`placed_bound`, `every_stage_drain`);
- `run`: `Bounds`, every kind of one search run together.

Each bound, the set it keys, and its statement:

- `FamilyBounds.bound` (a family, classes × TP): T ≥ M·N / Σ_k G_k/(t_k·a_k)
- `ChoiceBounds.bound` (the families of a choice node): least over R of T ≥ N / Σ_k n_k/w_k,
  w_k = max(m·a_k, e_k), n_k ≥ 1 per class in, Σ n_k ≤ P; two classes in or more, also the
  fill and the sends of the cheapest order (a least spanning tree; with classes open, the least
  edge into each class and island in but one)
- `FamilyBounds.bucket_bound` (a family at R, counts fixed): T ≥ (m − 1)·λ + max(λ, N·min a),
  λ = N/max Σ n_k/a_k
- `TemplateBounds.group_bound` (a one-template group): T ≥ (m − 1)·λ* + S (real water level λ*)
- `PairBounds.table` (every group of a pair family): `range_bound` of each, vectorised
- `PairBounds.range_bound` (a two-template range): M / Σ_j R_j/λ_j ∨ `bound`, least at a vertex
- `PairBounds.bound` (two templates at R_a, R_b): M ≤ Σ_j R_j·((T − S_j)/λ_j + 1)
- `SkeletonBounds.bound` (one skeleton): T ≥ max_j [(m_j − 1)·λ_j + g_j(λ_j + Δ_j)] + T_opt
- `TemplateBounds.drain_excess` (one template at R, in the least levels' drained bound): T ≥ P +
  E, E the least over splits of max_i [D̂_i − Σ_{k≤i} (τ̂_k − f̂_k)] (every stage's all-reduce
  past the pipeline, `least_drain`)
- `SkeletonBounds.shard_bound` (one skeleton with shards): T ≥ (m − 1)·λ + S, each stage its
  steepest rank's line
- `SkeletonBounds.lockstep_bound` (a uniform layout's skeleton): T ≥ (m − 1)·λ + min_j S_j, τ_i
  the largest of its lines
- `TripleBounds.family_bound` (three runs, class × TP): T ≥ M / Σ_k G_k/(t·a_k·N), then the ring
  exchange
- `TripleBounds.table` (a triple family's groups): `bound` of each, at once (numpy)
- `TripleBounds.bound` (three templates, a box of R): M / Σ_j R_j/λ_j ∨ the next, least at a corner
- `TripleBounds.replicas_bound` (three templates at R_j): M ≤ Σ_j R_j·((T − S_j)/λ_j + 1)
- `PairBounds.least`, `TripleBounds.least` (a box of replica counts) and `family_least` (a pair
  or triple family): the least T at which Σ_j R_j·cap_j(R_j; T) ≥ M, cap_j the most micro-batches
  whose drained bound (with the all-reduce no replica sheds) lies below T
- `SendBounds.send_s` (one send between stages): the fastest pair of nodes, alone (between islands
  1/R of the island link); two stages of one class at TP t on nodes of at most t GPUs never on one
  node (`stages_apart`); on nodes of at most 2t, a stage between two of its class sends to one of
  them over NICs (`stages_paired`)
- `SendBounds.exchange_s` (two templates' classes): T_cross ≥ G/c over the fastest node pair, alone;
  c at most the nodes the smaller template can use (`template_nodes`), no node paired with itself
  where none holds a TP group of each (`apart`) or the two fill nodes of one class one after the
  other (`filled_apart`); each side on an island of its own, T_cross ≥ G/C
  over the narrowest island link C all its flows cross (they share it, `_shared_island_gbps`)
- `SendBounds.ring_exchange_s` (three templates): each pair a hop of the ring: the slowest
  exchange
- `SendBounds.packed` (a class whose nodes a plan packs k ≥ 2 groups each): in the stage order a
  stage's sends leave a node `stacked` at once, sharing its NIC; in the replica order k rings
  share a NIC on every stage's ring (`spread`), over R nodes. A skeleton takes its own order's
  (`drained_bound`'s `packing`), a set of both orders each template's lesser

A `Bounds` belongs to one search run (one instance, one set of profiles): its caches live and die
with it, so no two runs ever share an entry.
"""
