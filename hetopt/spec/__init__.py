"""Instances: schema, model presets, GPU catalog, cluster device graph."""

from hetopt.spec.cluster import Cluster, DeviceClass, Node, Route
from hetopt.spec.gpus import CATALOG, GPUType
from hetopt.spec.instance import DEMO_INSTANCE, Instance, bundled_instances, load_instance
from hetopt.spec.presets import PRESETS, ModelArch

__all__ = [
    "CATALOG", "DEMO_INSTANCE", "PRESETS", "Cluster", "DeviceClass", "GPUType", "Instance", "ModelArch", "Node",
    "Route", "bundled_instances", "load_instance",
]
