"""Transports: one command contract (``base``), a local and an SSH backend, the step log every command
leaves on disk, and test doubles (a scripted transport, a private sshd)."""

from __future__ import annotations

from .base import CommandResult, Process, ScopedTransport, Transport
from .local import LocalTransport, free_port
from .ssh import SSHTransport

__all__ = ["CommandResult", "LocalTransport", "Process", "SSHTransport", "ScopedTransport", "Transport", "free_port",
           "open_transport"]


def open_transport(node, trust_new_hosts: bool = False, known_hosts_path: str | None = None,
                   connect_timeout_s: float = 10.0) -> Transport:
    """Open the transport an inventory node asks for."""
    if node.transport == "local":
        return LocalTransport(node.name)
    return SSHTransport(node.host, node.port, node.user, node.identity_file, node.proxy_jump,
                        trust_new_hosts=trust_new_hosts, known_hosts_path=known_hosts_path,
                        connect_timeout_s=connect_timeout_s, name=node.name)
