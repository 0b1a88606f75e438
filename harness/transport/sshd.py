"""A private OpenSSH server on a loopback port, for tests, CI and the dev rig.

It has its own temporary host key, client key, authorized_keys and known_hosts, listens only on the
address given (127.0.0.1 by default), and is stopped by PID. Nothing on the system's sshd changes.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import HarnessError
from .local import free_port
from .procgroup import group_exists, terminate


def find_sshd() -> str:
    for cand in (shutil.which("sshd"), "/usr/sbin/sshd"):
        if cand and os.path.exists(cand):
            return cand
    raise HarnessError("sshd not found: install the Debian package openssh-server")


@dataclass
class PrivateSshd:
    """Start with ``start()``, stop with ``stop()``; ``known_hosts`` trusts only this server's key."""

    workdir: Path
    host: str = "127.0.0.1"
    port: int = 0
    user: str = ""
    proc: subprocess.Popen | None = None
    netns: str | None = None  # run inside `ip netns exec NAME` when set
    extra_config: str = ""  # more sshd_config lines (a test's ForceCommand, say)

    def __post_init__(self):
        self.workdir = Path(self.workdir)
        self.user = self.user or os.environ.get("USER") or "root"

    @property
    def client_key(self) -> Path:
        return self.workdir / "client_ed25519"

    @property
    def host_key(self) -> Path:
        return self.workdir / "host_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.workdir / "known_hosts"

    @property
    def log_path(self) -> Path:
        return self.workdir / "sshd.log"

    def _keygen(self, path: Path, comment: str):
        if not path.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                           check=True, capture_output=True)

    def prepare(self, authorized_pubkeys: list[Path] | None = None):
        self.workdir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.workdir, 0o700)
        self._keygen(self.host_key, "kvgate-test-host")
        self._keygen(self.client_key, "kvgate-test-client")
        keys = [self.client_key.with_suffix(".pub")] + list(authorized_pubkeys or [])
        (self.workdir / "authorized_keys").write_text("".join(Path(k).read_text() for k in keys))
        os.chmod(self.workdir / "authorized_keys", 0o600)
        if not self.port:
            self.port = free_port(self.host)
        hostkey_pub = self.host_key.with_suffix(".pub").read_text().split()
        name = self.host if self.port == 22 else f"[{self.host}]:{self.port}"
        self.known_hosts.write_text(f"{name} {hostkey_pub[0]} {hostkey_pub[1]}\n")
        Path("/run/sshd").mkdir(exist_ok=True)  # privilege separation directory
        cfg = self.workdir / "sshd_config"
        cfg.write_text(
            f"Port {self.port}\nListenAddress {self.host}\nHostKey {self.host_key}\n"
            f"PidFile {self.workdir / 'sshd.pid'}\nAuthorizedKeysFile {self.workdir / 'authorized_keys'}\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\n"
            "PermitRootLogin yes\nStrictModes no\nUsePAM no\nSubsystem sftp internal-sftp\n"
            "LogLevel ERROR\nMaxStartups 100:30:200\nMaxSessions 100\nClientAliveInterval 15\n"
            + self.extra_config
        )
        return cfg

    def start(self, timeout_s: float = 15.0, authorized_pubkeys: list[Path] | None = None) -> "PrivateSshd":
        cfg = self.prepare(authorized_pubkeys)
        argv = [find_sshd(), "-D", "-e", "-f", str(cfg)]
        if self.netns:
            argv = ["ip", "netns", "exec", self.netns] + argv
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise HarnessError(f"sshd exited with {self.proc.returncode}: {self.log_path.read_text()[-500:]}")
            if self.netns or _port_open(self.host, self.port):
                if not self.netns:
                    return self
                time.sleep(0.3)
                return self
            time.sleep(0.05)
        self.stop()
        raise HarnessError(f"sshd did not listen on {self.host}:{self.port} within {timeout_s} s")

    def stop(self):
        proc = self.proc
        if proc is not None and proc.poll() is None:
            terminate([proc.pid], group=True, grace_s=5.0,
                      alive=lambda pgid: proc.poll() is None or group_exists(pgid))
        self.proc = None

    def node_yaml(self, name: str = "sshnode") -> dict:
        return {"name": name, "transport": "ssh", "host": self.host, "port": self.port, "user": self.user,
                "identity_file": str(self.client_key)}


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False
