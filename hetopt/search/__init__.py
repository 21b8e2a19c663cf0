"""The exact planner: plan space, skeleton enumeration and pruning, per-skeleton integer
programs."""
