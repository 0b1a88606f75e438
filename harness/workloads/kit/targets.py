"""The device or file behind a gate's target, for every kind of target an inventory declares.

A ``file`` or ``block`` target (or any target with a ``path``) is its path on the node; a ``kind: nvmeof``
target is the namespace found by its NQN and checked (``base.nvmeof_device``); a ``kind: nvmeof-loopback``
target without a path is the /dev/nvmeXnY its loopback connected (``rigs.loopback.resolve_loopback_device``).
The table is here, with the target kinds, so a workload resolves a target whatever else was imported.
"""

from __future__ import annotations

from typing import Any, Callable

from ...rigs.loopback import resolve_loopback_device
from .base import GateContext, nvmeof_device, target_path

# kind -> fn(transport, steps, target) -> the device path, for targets found on the node rather than named by path
TARGET_RESOLVERS: dict[str, Callable[[Any, Any, Any], str]] = {
    "nvmeof-loopback": resolve_loopback_device,
}


def target_device(ctx: GateContext, node: Any, target: Any, transport: Any) -> tuple[str, dict[str, Any] | None]:
    """(the path kvgate reads or writes for ``target`` on ``node``, the NVMe-oF check's record or None)."""
    if target.kind == "nvmeof":
        return nvmeof_device(ctx, node, target, transport)
    if target.kind in TARGET_RESOLVERS and not target.path:
        return TARGET_RESOLVERS[target.kind](transport, ctx.steps, target), None
    return target_path(node, target), None
