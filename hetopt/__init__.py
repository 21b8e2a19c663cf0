"""hetopt: exact hybrid-parallel training plans for heterogeneous GPU clusters with dynamic
bandwidth."""

__version__ = "0.1.0"
