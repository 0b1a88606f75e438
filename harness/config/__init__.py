"""Configuration: the inventory and gate-suite models, YAML with a line index, and loading with every
error reported at once as ``FILE:LINE: path: message``."""

from __future__ import annotations

from .loading import Config, load_config, load_inventory
from .models import Gate, GateSuite, Gpu, Inventory, Nic, Node, Reference, SuiteMeta, Target
from .yamlload import LineIndex, load_yaml, validate

__all__ = ["Config", "Gate", "GateSuite", "Gpu", "Inventory", "LineIndex", "Nic", "Node", "Reference", "SuiteMeta",
           "Target", "load_config", "load_inventory", "load_yaml", "validate"]
