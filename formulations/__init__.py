"""Plan formulations as plug-ins (DESIGN 4): one module each, the mathematics in its docstring."""
