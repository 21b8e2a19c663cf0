"""Instances: the schema, model presets, the GPU and fabric catalogs, bandwidth scenarios, and the
cluster as a device graph."""
