"""Human-facing output: rich tables and plots."""
