"""Solver backends, one module each, in the style of PuLP's `apis/` and cvxpy's solver interfaces:
a backend declares its capabilities and availability, runs a model a formulation built for it, and
maps its solver's own status to `SolveStatus` (the map is in each module's docstring).

`base` holds what every backend shares (statuses, options, results, the `Backend` interface);
`registry` names them; hetopt.search.dispatch runs a skeleton on one, falling back to the next.
"""
