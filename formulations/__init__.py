"""Plan formulations as plug-ins (docs/planner.md): one module each, the mathematics in its
docstring.

A formulation module defines `FORMULATION`, a :class:`hetopt.search.formulation.Formulation` naming
the backends it is written for and its `solve(problem, backend, options)`. `hetopt formulations`
lists every module found here and every one registered under the entry-point group
`hetopt.formulations`.
"""
