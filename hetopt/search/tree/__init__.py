"""The search space as a tree of nodes, each a set of skeletons with a lower bound on all of them.

Every node answers two questions. `bound`: no split of any skeleton in it beats this
(hetopt.search.bounds says why each holds). `expand`: its children, each keyed by a bound at least
its parent's. Leaves are single skeletons, solved by a formulation. The best-first search
(hetopt.search.orchestrate) pops the node of smallest bound. A node whose bound reaches the
incumbent is pruned with everything under it (`Node.count_pruned`).

    ChoiceNode         one-template families of one micro-batch size, a root: each class in
    │                  the cluster's order left out or in at one TP degree (choices.py)
    └─ FamilyNode      device classes × TP degrees × micro-batch (space.Family); a pair
    │                  family is a root of its own
    ├─ BucketNode      one template at one replica count R, the first classes' stage counts fixed
    │  └─ BucketNode   … the next class's count fixed, down to the last class
    │     └─ GroupNode    stages per class at R (space.SkeletonGroup)
    │        └─ SkeletonNode
    └─ PairGroupNode   two templates side by side (space.PairGroup), made only where the
       │               family's table of group bounds (PairBounds.table) leaves them open
       └─ PairRangeNode      replica counts (ra', rb') ≤ (ra, rb), peeled a row or a cell at a time
          └─ PairSubgroupNode   fixed (ra, rb) and recompute: the micro-batch shares
             └─ SkeletonNode
    SkeletonNode       a root leaf: a skeleton with shards (hetopt.search.shards), keyed by
                       SkeletonBounds.shard_bound, or a uniform layout's (hetopt.search.uniform),
                       keyed by SkeletonBounds.lockstep_bound
    TripleFamilyNode   three single-class runs (triples.TripleFamily), groups made only where its
    │                  table of group bounds (TripleBounds.table) leaves them open
    └─ TripleGroupNode    three templates over a box of replica counts, keyed by TripleBounds.bound,
       │                  halved down to single (R_a, R_b, R_c); a box whose templates cannot take
       │                  the M micro-batches below the incumbent is dropped (`triples.reaches`)
       └─ TripleSharesNode   fixed (R_a, R_b, R_c) and recompute, keyed by the least bound over
          │                  the shares
          └─ SkeletonNode    (`TripleShares`: only the shares below the incumbent are made)

What cannot hold the model in memory even at its most ZeRO sharding is dropped on expansion and
counted (`MEMORY_RULE`, `MEMORY_GROUPS_RULE`).

The modules: `base` (Tree, Node, SkeletonNode, the rules), `choices`, `families`, `pairs`,
`triples` (the nodes of each kind) and `roots` (the roots as nodes).
"""
