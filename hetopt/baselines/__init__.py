"""Planners to compare with (docs/baselines.md); `exhaustive` is the ground truth on small
instances."""
