"""Planners to compare with (DESIGN 7); `exhaustive` is the ground truth on small instances."""
