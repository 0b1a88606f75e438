"""Loopback-to-namespace TCP forwarder used by the test rig (stdlib only, runs as a script).

The rig's node sshds listen on addresses that exist only inside the rig's network namespaces.
kvgate (in the root namespace) may only use loopback, so `kvgate rig up` opens one listening
socket per node on 127.0.0.1 in the root namespace and starts this script inside the rig's hub
namespace with those sockets inherited: a socket keeps the namespace it was created in, so the
script accepts loopback connections and dials the node address from inside the hub.

Usage: rig_forward.py FD=HOST:PORT [FD=HOST:PORT ...]
"""

from __future__ import annotations

import socket
import sys
import threading


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(1 << 16)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        # Half-close so the other direction can drain, then let the peer thread finish.
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _serve_connection(client: socket.socket, target: tuple[str, int]) -> None:
    try:
        upstream = socket.create_connection(target, timeout=10.0)
    except OSError as exc:
        print(f"rig_forward: connect {target[0]}:{target[1]} failed: {exc}", file=sys.stderr, flush=True)
        client.close()
        return
    upstream.settimeout(None)
    for s in (client, upstream):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    back.start()
    _pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def _accept_loop(listener: socket.socket, target: tuple[str, int]) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError as exc:
            print(f"rig_forward: accept failed: {exc}", file=sys.stderr, flush=True)
            return
        threading.Thread(target=_serve_connection, args=(client, target), daemon=True).start()


def parse_mapping(arg: str) -> tuple[int, tuple[str, int]]:
    """Parse `FD=HOST:PORT` into (fd, (host, port))."""
    fd_s, _, dest = arg.partition("=")
    host, _, port_s = dest.rpartition(":")
    if not fd_s.isdigit() or not host or not port_s.isdigit():
        raise ValueError(f"bad mapping {arg!r}: expected FD=HOST:PORT")
    return int(fd_s), (host, int(port_s))


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    threads = []
    for arg in argv:
        fd, target = parse_mapping(arg)
        listener = socket.socket(fileno=fd)
        t = threading.Thread(target=_accept_loop, args=(listener, target), daemon=True)
        t.start()
        threads.append(t)
    print(f"rig_forward: serving {len(threads)} mappings", file=sys.stderr, flush=True)
    for t in threads:
        t.join()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
