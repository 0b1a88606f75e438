"""The SSH backend (paramiko): ~/.ssh/config, agent and key files, ProxyJump, strict host keys, port forwards."""

from __future__ import annotations

import base64
import hashlib
import os
import select
import shlex
import socket
import stat
import threading
import time
from pathlib import Path
from typing import Mapping, Sequence

from ..errors import HostKeyError, TransportError
from ..redact import scrub_file
from .base import KEEP_STDIN_OPEN, Process, Transport

# The remote wrapper: report the shell's pid and process group on stderr's first line, then exec the
# command. sshd starts each session command as a session leader, so killing -PGID ends every child.
_PGID_PREFIX = "KVGATE-PGID "
_WRAP = ('read -r _ _ _ _ g _ < /proc/$$/stat 2>/dev/null || g=$$; '
         'printf "' + _PGID_PREFIX + '%s %s\\n" "$$" "$g" >&2; ')


# The environment never goes on the command line (other users of the node read it in ps, and audit logs keep
# it): the wrapper reads NAME=VALUE lines from the command's stdin up to an empty line and exports each, then
# the command gets the rest of stdin. sh's read takes one byte at a time from a pipe, so nothing after the
# empty line is consumed. (sshd's AcceptEnv is off by default, so the channel's own env requests are no way.)
_ENV_FROM_STDIN = 'while IFS= read -r _kvgate_kv && [ -n "$_kvgate_kv" ]; do export "$_kvgate_kv"; done; ' \
                  'unset _kvgate_kv; '


def remote_command(argv: Sequence[str], env: Mapping[str, str], log_path: str | None) -> str:
    """The one shell string sent to sshd: pid report, the environment read from stdin (:func:`env_block`),
    optional log redirect, argv quoted once. No value of ``env`` is in it."""
    cmd = _WRAP
    if env:
        cmd += _ENV_FROM_STDIN
    if log_path is not None:
        cmd += f"exec >>{shlex.quote(log_path)} 2>&1 </dev/null; "
    cmd += "exec " + shlex.join(list(argv))
    return cmd


def env_block(env: Mapping[str, str]) -> bytes:
    """What goes first on the command's stdin for :func:`remote_command`: one NAME=VALUE line per variable and
    an empty line. A value with a newline or NUL cannot be one line (nor an environment value): refused."""
    if not env:
        return b""
    for k, v in env.items():
        if "\n" in v or "\x00" in v or "\r" in v:
            raise TransportError(f"environment variable {k}: a value with a newline, carriage return or NUL "
                                 "cannot be passed to an SSH node")
    return "".join(f"{k}={v}\n" for k, v in env.items()).encode() + b"\n"


# After the exit status, how long the output may still take to reach its EOF (seconds).
EOF_GRACE_S = 5.0

class _SSHProcess(Process):
    def __init__(self, transport: "SSHTransport", channel, stdin: bytes | None, preamble: bytes = b""):
        self.t = transport
        self.ch = channel
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._err = bytearray()
        self._err_chunks: list[bytes] = []
        self.pgid: int | None = None
        self._pid_seen = threading.Event()
        self._done = threading.Event()
        self._out_cond = threading.Condition()
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()
        if stdin is KEEP_STDIN_OPEN:
            if preamble:  # the environment first; then send() writes, close_stdin() ends it
                self.send(preamble)
        elif stdin is not None or preamble:
            threading.Thread(target=self._feed, args=(preamble + (stdin or b""),), daemon=True).start()
        else:
            try:
                channel.shutdown_write()
            except Exception:  # noqa: BLE001 - channel may already be closed
                pass

    def send(self, data: bytes) -> None:
        try:
            self.ch.sendall(data)
        except Exception as exc:  # noqa: BLE001 - the channel or connection is gone
            raise TransportError(f"{self.t.name}: cannot write to the command's stdin: {exc}") from None

    def close_stdin(self) -> None:
        try:
            self.ch.shutdown_write()
        except Exception:  # noqa: BLE001 - already closed
            pass

    def wait_stdout_bytes(self, n: int, timeout_s: float) -> bool:
        with self._out_cond:
            return self._out_cond.wait_for(lambda: self._out_bytes >= n or self._done.is_set(), timeout_s) \
                and self._out_bytes >= n

    def _feed(self, data: bytes):
        try:
            self.ch.sendall(data)
            self.ch.shutdown_write()
        except Exception:  # noqa: BLE001
            pass

    def _take_ready(self, ch, header: bytearray) -> bool:
        """Take what the channel holds now: stdout, then stderr (``header`` until the pid line); True if any came."""
        got = False
        if ch.recv_ready():
            data = ch.recv(65536)
            if data:
                with self._out_cond:
                    self._out.append(data)
                    self._out_bytes += len(data)
                    self._out_cond.notify_all()
                got = True
        if ch.recv_stderr_ready():
            data = ch.recv_stderr(65536)
            if data:
                got = True
                if self._pid_seen.is_set():
                    self._err_chunks.append(data)
                else:
                    header += data
                    self._scan_header(header)
        return got

    def _pump(self):
        ch = self.ch
        header = bytearray()
        exit_seen: float | None = None
        try:
            wake_fd = ch.fileno()  # readable while either stream holds data, and at EOF or close
        except Exception:  # noqa: BLE001 - no pipe: poll as before
            wake_fd = None
        while True:
            if self._take_ready(ch, header):
                continue
            if not ch.recv_ready() and not ch.recv_stderr_ready():
                if ch.exit_status_ready():
                    # sshd may send the exit status before the last of the output (seen under load: a probe's
                    # stdout lost, exit 0): the output is complete at the channel's EOF. A command that left a
                    # process holding its output open sends no EOF: then the grace ends the wait.
                    if exit_seen is None:
                        exit_seen = time.monotonic()
                    if ch.eof_received or ch.closed or time.monotonic() - exit_seen > EOF_GRACE_S:
                        if not ch.recv_ready() and not ch.recv_stderr_ready():
                            break
                        continue
                elif ch.closed:
                    break  # connection lost: no exit status will come
            # Sleep until data arrives instead of polling: one thread per running command, and a run has
            # a reader per node. After EOF the pipe stays readable, so wait for the exit status instead.
            if wake_fd is None:
                time.sleep(0.005)
            elif ch.eof_received:
                ch.status_event.wait(0.1)
            else:
                try:
                    select.select([wake_fd], [], [], 0.25)
                except (OSError, ValueError):  # the channel closed its pipe under us
                    time.sleep(0.005)
        if not self._pid_seen.is_set():
            if header:
                self._err_chunks.append(bytes(header))
            self._pid_seen.set()
        if wake_fd is not None:
            try:
                ch.close()  # the command is over (or its connection is): frees the wake pipe's two fds
            except Exception:  # noqa: BLE001
                pass
        with self._out_cond:
            self._done.set()
            self._out_cond.notify_all()

    def _scan_header(self, header: bytearray) -> None:
        """Find the wrapper's pid line; anything a login shell printed before it is ordinary stderr."""
        while b"\n" in header:
            line, _, rest = bytes(header).partition(b"\n")
            header[:] = rest
            text = line.decode(errors="replace")
            if text.startswith(_PGID_PREFIX):
                parts = text[len(_PGID_PREFIX):].split()
                try:
                    self.pid, self.pgid = int(parts[0]), int(parts[1])
                except (IndexError, ValueError):
                    pass
                self._pid_seen.set()
                if header:
                    self._err_chunks.append(bytes(header))
                    header.clear()
                return
            self._err_chunks.append(line + b"\n")

    def poll(self):
        if self.ch.exit_status_ready():
            return self.ch.recv_exit_status()
        return None

    def wait(self, timeout_s=None):
        if not self._done.wait(timeout_s):
            return None
        rc = self.ch.recv_exit_status()
        return rc

    def kill_group(self, grace_s=5.0):
        # The remote shell reports its process group first thing; a slow login shell (rc files) can delay
        # that line, and without it there is nothing to kill, so wait for it rather than give up.
        self._pid_seen.wait(timeout=max(30.0, self.t.connect_timeout_s))
        target = self.pgid or self.pid
        if target is None:
            self.ch.close()
            return
        script = (f"kill -TERM -- -{target} 2>/dev/null || exit 0; "
                  f"i=0; while [ $i -lt {int(grace_s * 10)} ]; do kill -0 -- -{target} 2>/dev/null || exit 0; "
                  f"sleep 0.1; i=$((i+1)); done; kill -KILL -- -{target} 2>/dev/null; exit 0")
        try:
            self.t._exec_simple(script, timeout_s=grace_s + 15)
        except TransportError:
            pass
        self._done.wait(5.0)
        if not self._done.is_set():
            self.ch.close()

    def output(self):
        self._done.wait(10.0)
        return b"".join(self._out), b"".join(self._err_chunks)


def check_identity_file(path: str, node: str) -> None:
    """Refuse a private key file that group or others may read or write, as ssh does ("UNPROTECTED PRIVATE
    KEY FILE"), with the chmod to run. A missing file is left to the connection to report."""
    try:
        st = os.stat(path)
    except OSError:
        return
    if stat.S_ISREG(st.st_mode) and st.st_mode & 0o077:
        raise TransportError(f"{node}: identity file {path} is accessible by group or others (mode "
                             f"{stat.S_IMODE(st.st_mode):04o}); ssh refuses such a key, and so does kvgate: "
                             f"run chmod 600 {shlex.quote(path)}")


def host_key_fingerprint(key) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class SSHTransport(Transport):
    """paramiko backend: ~/.ssh/config, agent and key files, ProxyJump, strict host keys, keepalive."""

    supports_sessions = True

    def __init__(self, host: str, port: int | None = None, user: str | None = None,
                 identity_file: str | None = None, proxy_jump: str | None = None,
                 trust_new_hosts: bool = False, known_hosts_path: str | None = None,
                 connect_timeout_s: float = 10.0, keepalive_s: int = 15, name: str | None = None,
                 ssh_config_path: str | None = None, _depth: int = 0):
        import paramiko

        self.name = name or host
        self.connect_timeout_s = connect_timeout_s
        cfg_path = Path(ssh_config_path or Path.home() / ".ssh" / "config")
        resolved: dict = {}
        if cfg_path.exists():
            sshcfg = paramiko.SSHConfig.from_path(str(cfg_path))
            resolved = sshcfg.lookup(host)
        self.host = resolved.get("hostname", host)
        self.port = int(port or resolved.get("port", 22))
        self.user = user or resolved.get("user") or os.environ.get("USER") or "root"
        keys = [os.path.expanduser(identity_file)] if identity_file else [os.path.expanduser(p) for p in resolved.get("identityfile", [])]
        for key_file in keys:
            check_identity_file(key_file, self.name)
        proxy_jump = proxy_jump or resolved.get("proxyjump")
        if proxy_jump and proxy_jump.lower() == "none":
            proxy_jump = None
        self.known_hosts_path = known_hosts_path or str(Path.home() / ".ssh" / "known_hosts")
        self.trust_new_hosts = trust_new_hosts
        self._jump: SSHTransport | None = None
        sock = None
        if proxy_jump:
            sock = self._open_jump(host, proxy_jump, known_hosts_path, ssh_config_path, _depth)

        client = paramiko.SSHClient()
        if os.path.exists(self.known_hosts_path):
            try:
                client.load_host_keys(self.known_hosts_path)
            except Exception as exc:  # noqa: BLE001
                raise TransportError(f"cannot read known_hosts {self.known_hosts_path}: {exc}") from None
        client.set_missing_host_key_policy(_HostKeyPolicy(self))
        self._connect(client, keys, sock)
        client.get_transport().set_keepalive(keepalive_s)
        self.client = client
        self._sftp = None
        self._forwards: list[socket.socket] = []

    def _open_jump(self, host: str, proxy_jump: str, known_hosts_path: str | None, ssh_config_path: str | None,
                   depth: int):
        """Connect the ProxyJump chain's first hop (the rest behind it) and open its tunnel to this host."""
        if depth > 8:
            raise TransportError(f"{host}: ProxyJump chain too long")
        hops = proxy_jump.split(",")
        first, rest = hops[0], ",".join(hops[1:]) or None
        juser, _, jhostport = first.rpartition("@")
        jhost, _, jport = jhostport.partition(":")
        self._jump = SSHTransport(jhost, int(jport) if jport else None, juser or None,
                                  proxy_jump=rest, trust_new_hosts=self.trust_new_hosts,
                                  known_hosts_path=known_hosts_path, connect_timeout_s=self.connect_timeout_s,
                                  ssh_config_path=ssh_config_path, _depth=depth + 1)
        try:
            return self._jump.client.get_transport().open_channel(
                "direct-tcpip", (self.host, self.port), ("127.0.0.1", 0), timeout=self.connect_timeout_s)
        except Exception as exc:  # noqa: BLE001
            self._jump.close()
            raise TransportError(f"{self.name}: ProxyJump via {first} to {self.host}:{self.port} failed: {exc}") from None

    def _connect(self, client, keys: list[str], sock) -> None:
        """Connect and authenticate ``client``; on a failure, close the jump host and raise kvgate's error for it."""
        import paramiko

        try:
            client.connect(self.host, port=self.port, username=self.user,
                           key_filename=keys or None, timeout=self.connect_timeout_s,
                           banner_timeout=self.connect_timeout_s, auth_timeout=self.connect_timeout_s,
                           sock=sock, allow_agent=True, look_for_keys=not keys)
        except HostKeyError:
            self._close_jump()
            raise
        except paramiko.BadHostKeyException as exc:
            self._close_jump()
            raise HostKeyError(
                f"{self.name}: host key for {self._known_name()} CHANGED (got {host_key_fingerprint(exc.key)}, "
                f"known_hosts has {host_key_fingerprint(exc.expected_key)}); refusing to connect. If the host was "
                f"reinstalled, remove the old entry with: ssh-keygen -R '{self._known_name()}' -f {self.known_hosts_path}"
            ) from None
        except paramiko.AuthenticationException as exc:
            self._close_jump()
            raise TransportError(f"{self.name}: authentication failed for {self.user}@{self.host}:{self.port}: {exc}") from None
        except (OSError, socket.timeout, paramiko.SSHException) as exc:
            self._close_jump()
            raise TransportError(f"{self.name}: cannot connect to {self.host}:{self.port}: {exc}") from None

    def _known_name(self) -> str:
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"

    def _close_jump(self):
        if self._jump is not None:
            self._jump.close()

    def _channel(self):
        tr = self.client.get_transport()
        if tr is None or not tr.is_active():
            raise TransportError(f"{self.name}: SSH connection is closed")
        try:
            return tr.open_session(timeout=self.connect_timeout_s)
        except Exception as exc:  # noqa: BLE001
            raise TransportError(f"{self.name}: cannot open SSH session: {exc}") from None

    def _exec_simple(self, script: str, timeout_s: float) -> int | None:
        ch = self._channel()
        ch.settimeout(timeout_s)
        ch.exec_command(script)
        deadline = time.monotonic() + timeout_s
        while not ch.exit_status_ready() and time.monotonic() < deadline:
            time.sleep(0.05)
        rc = ch.recv_exit_status() if ch.exit_status_ready() else None
        ch.close()
        return rc

    def _start(self, argv, env, stdin, log_path):
        preamble = env_block(env)  # before a channel is opened: a refused value opens nothing
        ch = self._channel()
        ch.exec_command(remote_command(argv, env, log_path))
        return _SSHProcess(self, ch, stdin, preamble)

    def _sftp_client(self):
        if self._sftp is None:
            try:
                self._sftp = self.client.open_sftp()
            except Exception as exc:  # noqa: BLE001
                raise TransportError(f"{self.name}: SFTP unavailable: {exc}") from None
        return self._sftp

    def put(self, local_path, remote_path):
        try:
            self._sftp_client().put(str(local_path), remote_path)
        except OSError as exc:
            raise TransportError(f"{self.name}: put {local_path} -> {remote_path}: {exc}") from None

    def get(self, remote_path, local_path):
        """Copy a node's file here; known secret values in it are redacted (the copy is kvgate's record)."""
        Path(local_path).parent.mkdir(parents=True, exist_ok=True)
        try:
            self._sftp_client().get(remote_path, str(local_path))
        except OSError as exc:
            raise TransportError(f"{self.name}: get {remote_path}: {exc}") from None
        scrub_file(local_path)

    def forward_port(self, remote_host: str, remote_port: int) -> tuple[str, int]:
        """Listen on 127.0.0.1:<free port> here and carry each connection over this SSH connection
        (direct-tcpip) to ``remote_host:remote_port`` as the node sees it, e.g. an engine bound to the
        node's loopback. The listener lives until ``close()``."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        self._forwards.append(listener)
        tr = self.client.get_transport()

        def pipe(a, b):
            try:
                while True:
                    data = a.recv(65536)
                    if not data:
                        break
                    b.sendall(data)
            except OSError:
                pass
            finally:
                for x in (a, b):
                    try:
                        x.close()
                    except OSError:
                        pass

        def accept_loop():
            while True:
                try:
                    conn, peer = listener.accept()
                except OSError:
                    return  # listener closed
                try:
                    ch = tr.open_channel("direct-tcpip", (remote_host, remote_port), peer,
                                         timeout=self.connect_timeout_s)
                except Exception:  # noqa: BLE001 - nothing listens there (yet): the client sees a reset
                    conn.close()
                    continue
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                threading.Thread(target=pipe, args=(conn, ch), daemon=True).start()
                threading.Thread(target=pipe, args=(ch, conn), daemon=True).start()

        threading.Thread(target=accept_loop, daemon=True, name=f"fwd-{self.name}-{remote_port}").start()
        return "127.0.0.1", listener.getsockname()[1]

    def close(self):
        for listener in self._forwards:
            try:
                listener.close()
            except OSError:
                pass
        self._forwards = []
        if self._sftp is not None:
            self._sftp.close()
            self._sftp = None
        self.client.close()
        self._close_jump()


class _HostKeyPolicy:
    """Unknown host keys are refused unless trust_new_hosts; then they are appended to known_hosts."""

    def __init__(self, transport: SSHTransport):
        self.t = transport

    def missing_host_key(self, client, hostname, key):
        fp = host_key_fingerprint(key)
        if not self.t.trust_new_hosts:
            raise HostKeyError(
                f"{self.t.name}: unknown host key for {hostname} ({key.get_name()} {fp}); refusing to connect. "
                f"Check the fingerprint on the host (ssh-keygen -lf /etc/ssh/ssh_host_{key.get_name().split('-')[-1]}_key.pub), "
                f"then add it to {self.t.known_hosts_path} or rerun with --trust-new-hosts"
            )
        client.get_host_keys().add(hostname, key.get_name(), key)
        path = Path(self.t.known_hosts_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
