"""An N-node test cluster on one Linux machine: network namespaces, real sshds, one shaped storage port.

Layout (names carry the rig prefix, default `kvg-`):

- `<prefix>hub`: a bridge `br0` (address .254) that every other namespace plugs into with a veth pair;
  it also runs `rig_forward.py`, which makes each sshd reachable from the root namespace on 127.0.0.1.
- `<prefix>st`: the storage namespace. Its one port `st0` (address .100) is shaped with tc tbf to
  `port_rate_mbit` in both directions; its sshd serves the pool directory over SFTP.
- `<prefix>n1..nN`: node namespaces, interface `eth0` (addresses .11, .12, ...). Each node's sshd runs
  in a private mount namespace holding a FUSE sshfs mount of the storage pool at the same path on every
  node, so every byte a node reads from the pool crosses the shaped storage port.

Addresses exist only inside these namespaces (a private /24, default 10.77.0.0/24). kvgate reaches the
nodes exactly like real nodes: SSH with a key, host keys pinned in a known_hosts file, an inventory YAML.

Teardown works by name and PID: every process inside the rig's namespaces is signalled by PID
(`ip netns pids`), then the namespaces are deleted; it is idempotent and works without a state file.
"""

from __future__ import annotations

import ipaddress
import json
import os
import pwd
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import yaml

from ..errors import HarnessError
from ..node import program_path
from ..transport.procgroup import pid_alive, terminate
from .host import CommandLog


SSHD = "/usr/sbin/sshd"
FORWARDER = program_path("rig_forward.py")
STORAGE_NODE = "storage"
STORAGE_HOST_OCTET = 100
HUB_HOST_OCTET = 254
NODE_HOST_OCTET_BASE = 10
STATE_FILE = "rig.json"
REQUIRED_TOOLS = ("ip", "tc", "ssh", "ssh-keygen", "sshfs", "fusermount3", "unshare", SSHD)


class RigError(HarnessError):
    """The rig could not be built, inspected or torn down."""


@dataclass(frozen=True)
class RigSpec:
    """What to build. Everything derives from the prefix, so teardown needs only the prefix."""

    prefix: str = "kvg-"
    node_count: int = 8
    subnet: str = "10.77.0.0/24"
    port_rate_mbit: int = 1000
    tbf_burst: str = "256kb"
    tbf_latency: str = "50ms"
    state_dir: Path = Path("/var/tmp/kvgate-rig/kvg")
    ready_timeout_s: float = 30.0
    # The nodes are namespaces of this machine and see its files: their engine environment defaults to
    # the interpreter running kvgate (the venv scripts/setup.sh made), written into the inventory.
    engine_python: str = field(default_factory=lambda: sys.executable)
    # What a node's login shell reads before every command kvgate sends. sshd runs each command (and the
    # SFTP subsystem) as `$SHELL -c ...`, and bash then sources ~/.bashrc: this machine's root's, set up for
    # people (pyenv init alone forks dozens of processes, ~0.1 CPU-s per command). "empty": each node's
    # sshd sees an empty ~/.bashrc (a bind mount in its private mount namespace), as on a fresh node;
    # "host": this machine's, as it is.
    shell_rc: str = "empty"

    def __post_init__(self) -> None:
        if not self.prefix or len(self.prefix) > 8 or not all(c.isalnum() or c == "-" for c in self.prefix):
            raise RigError(f"rig prefix {self.prefix!r}: use 1-8 characters [A-Za-z0-9-]")
        if not 1 <= self.node_count <= 64:
            raise RigError(f"rig node_count {self.node_count}: must be 1..64")
        net = ipaddress.ip_network(self.subnet, strict=True)
        if net.version != 4 or net.prefixlen != 24 or not net.is_private or net.is_loopback:
            raise RigError(f"rig subnet {self.subnet}: must be a private IPv4 /24 (e.g. 10.77.0.0/24)")
        if self.port_rate_mbit <= 0:
            raise RigError(f"rig port_rate_mbit {self.port_rate_mbit}: must be > 0")
        if self.shell_rc not in ("empty", "host"):
            raise RigError(f"rig shell_rc {self.shell_rc!r}: expected 'empty' or 'host'")

    # --- names and addresses -------------------------------------------------------------------
    @property
    def hub_ns(self) -> str:
        return f"{self.prefix}hub"

    @property
    def storage_ns(self) -> str:
        return f"{self.prefix}st"

    def node_names(self) -> list[str]:
        return [f"n{i}" for i in range(1, self.node_count + 1)]

    def node_ns(self, node: str) -> str:
        return f"{self.prefix}{node}"

    def all_namespaces(self) -> list[str]:
        return [self.node_ns(n) for n in self.node_names()] + [self.storage_ns, self.hub_ns]

    def _addr(self, octet: int) -> str:
        return str(ipaddress.ip_network(self.subnet)[octet])

    @property
    def storage_addr(self) -> str:
        return self._addr(STORAGE_HOST_OCTET)

    @property
    def hub_addr(self) -> str:
        return self._addr(HUB_HOST_OCTET)

    def node_addr(self, node: str) -> str:
        return self._addr(NODE_HOST_OCTET_BASE + int(node[1:]))

    # --- paths ---------------------------------------------------------------------------------
    @property
    def pool_dir(self) -> Path:
        """The pool as stored on the storage side (served by the storage sshd)."""
        return self.state_dir / "storage" / "pool"

    @property
    def pool_mount(self) -> Path:
        """Where every node sees the pool (a FUSE mount inside each node's mount namespace)."""
        return self.state_dir / "mnt" / "pool"

    @property
    def identity_file(self) -> Path:
        return self.state_dir / "keys" / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        """Pinned host keys of every sshd as kvgate sees it ([127.0.0.1]:PORT)."""
        return self.state_dir / "known_hosts"

    @property
    def inventory_path(self) -> Path:
        return self.state_dir / "inventory.yaml"

    @property
    def ssh_config_path(self) -> Path:
        return self.state_dir / "ssh_config"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "log"

    @property
    def work_dir(self) -> Path:
        """Every node's work_dir in the inventory. The nodes share this machine's file system, so each rig
        has its own: two rigs (a test's and a benchmark's) never touch each other's reader, go and armed files."""
        return self.state_dir / "work"


@dataclass
class RigState:
    """What `rig_up` built: written to `<state_dir>/rig.json`."""

    spec: dict
    ssh_ports: dict[str, int] = field(default_factory=dict)  # node name (and "storage") -> loopback port
    pids: dict[str, int] = field(default_factory=dict)  # process role -> PID
    inventory_path: str = ""
    known_hosts: str = ""
    identity_file: str = ""
    pool_mount: str = ""
    ssh_config: str = ""
    started_at: float = 0.0


def _rig_error(message: str) -> RigError:
    return RigError(f"rig: {message}")


def _host_log(log_dir: Path | None) -> CommandLog:
    """The rig's host runner: every command in ``<state_dir>/log/commands.jsonl`` (when given), RigError."""
    return CommandLog(log_dir, error=_rig_error,
                      install_hint=lambda tool: f"install iproute2, openssh-server, sshfs, fuse3 ({tool})")


_UNLOGGED = _host_log(None)


# ----------------------------------------------------------------------------------------------
# inspection helpers
# ----------------------------------------------------------------------------------------------

def existing_namespaces() -> set[str]:
    cp = _UNLOGGED.run(["ip", "netns", "list"], check=False)
    return {line.split()[0] for line in cp.stdout.splitlines() if line.strip()}


def namespace_pids(ns: str) -> list[int]:
    """PIDs of processes whose network namespace is `ns` (empty when it does not exist)."""
    cp = _UNLOGGED.run(["ip", "netns", "pids", ns], check=False)
    if cp.returncode != 0:
        return []
    return [int(x) for x in cp.stdout.split() if x.isdigit()]


def process_cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def kill_pids(pids: list[int], grace_s: float = 3.0) -> list[int]:
    """SIGTERM each PID, wait up to grace_s, SIGKILL survivors. Returns the PIDs that were signalled."""
    return terminate(pids, group=False, grace_s=grace_s)


def _abort_fuse_connections_of(pids: list[int]) -> None:
    """Unstick readers blocked on a FUSE mount whose daemon is gone (best effort, root only)."""
    conn_dir = Path("/sys/fs/fuse/connections")
    if not conn_dir.is_dir():
        return
    devs = set()
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
                parts = line.split(" - ")
                if len(parts) == 2 and parts[1].startswith("fuse.sshfs"):
                    major, minor = line.split()[2].split(":")
                    if major == "0":
                        devs.add(minor)
        except OSError:
            continue
    for minor in devs:
        abort = conn_dir / minor / "abort"
        try:
            abort.write_text("1")
        except OSError:
            pass


# ----------------------------------------------------------------------------------------------
# up / down / status
# ----------------------------------------------------------------------------------------------

def load_state(state_dir: Path) -> RigState | None:
    path = Path(state_dir) / STATE_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return RigState(**data)


def recorded_spec(spec: RigSpec) -> tuple[RigSpec, RigState | None]:
    """The rig ``rig_up`` recorded in ``spec.state_dir`` (its node count, subnet, ...: what was built), else
    ``spec`` as given: ``down``, ``status`` and the fault commands act on the rig that is there, whatever flags
    they were given."""
    state = load_state(spec.state_dir)
    if state is None:
        return spec, None
    names = {f.name for f in fields(RigSpec)}
    kw = {k: v for k, v in state.spec.items() if k in names}
    kw["state_dir"] = Path(kw.get("state_dir", spec.state_dir))
    return RigSpec(**kw), state


def rig_namespaces(spec: RigSpec, present: set[str]) -> list[str]:
    """Pure: the namespaces of the rig with ``spec``'s prefix among ``present``: its hub, storage and nodes, and any
    further node of that prefix (``<prefix>n<k>``, left by a rig of more nodes whose record is gone)."""
    node = re.compile(re.escape(spec.prefix) + r"n[1-9][0-9]*")
    extra = sorted((ns for ns in present if node.fullmatch(ns) and ns not in spec.all_namespaces()),
                   key=lambda ns: int(ns[len(spec.prefix) + 1:]))
    return [ns for ns in spec.all_namespaces() if ns in present] + extra


def rig_down(spec: RigSpec, remove_state: bool = False) -> dict:
    """Tear the rig down by name and PID: the rig ``up`` recorded in the state dir (its node count, whatever
    ``spec`` says), and every namespace of its prefix. Idempotent: a rig that is half built or gone is fine.

    Returns {"node_count": N, "recorded": bool, "killed_pids": [...], "deleted_namespaces": [...],
    "state_dir_kept": path or None}; RigError naming what is left when a namespace survives.
    """
    spec, state = recorded_spec(spec)
    present = existing_namespaces()
    ours = rig_namespaces(spec, present)
    pids: list[int] = []
    for ns in ours:
        pids.extend(namespace_pids(ns))
    # Recorded PIDs too (e.g. a process that left the namespace is impossible, but a crashed
    # `rig up` may have recorded a PID before the namespace existed): only if still in our namespaces.
    if state is not None:
        for pid in state.pids.values():
            if pid not in pids and pid_alive(pid) and _pid_in_namespaces(pid, ours):
                pids.append(pid)
    killed = kill_pids(pids) if pids else []
    # Readers stuck on a FUSE mount whose sshfs died first: abort the connection and retry.
    leftovers = [p for ns in ours for p in namespace_pids(ns)]
    if leftovers:
        _abort_fuse_connections_of(leftovers)
        killed += kill_pids(leftovers, grace_s=1.0)
    deleted = []
    for ns in ours:
        cp = _UNLOGGED.run(["ip", "netns", "del", ns], check=False)
        if cp.returncode == 0:
            deleted.append(ns)
    still = rig_namespaces(spec, existing_namespaces())
    if still:
        raise RigError(f"rig down: left {len(still)} namespace(s) that would not go: {', '.join(still)} "
                       f"(processes: {sum(len(namespace_pids(ns)) for ns in still)}); rig.json kept")
    if remove_state and spec.state_dir.exists():
        shutil.rmtree(spec.state_dir, ignore_errors=True)
    elif (spec.state_dir / STATE_FILE).exists():
        (spec.state_dir / STATE_FILE).unlink()
    return {"node_count": spec.node_count, "recorded": state is not None, "killed_pids": killed,
            "deleted_namespaces": deleted,
            "state_dir_kept": str(spec.state_dir) if spec.state_dir.exists() else None}


def _pid_in_namespaces(pid: int, namespaces: list[str]) -> bool:
    try:
        mine = os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return False
    for ns in namespaces:
        try:
            if os.stat(f"/run/netns/{ns}").st_ino == mine:
                return True
        except OSError:
            continue
    return False


def _sshd_config(spec: RigSpec, listen: str, host_key: Path) -> str:
    return "\n".join([
        f"ListenAddress {listen}",
        "Port 22",
        f"HostKey {host_key}",
        f"AuthorizedKeysFile {spec.state_dir / 'keys' / 'authorized_keys'}",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",
        "UseDNS no",
        "PidFile none",
        "MaxSessions 64",
        "MaxStartups 64:30:128",
        "ClientAliveInterval 5",
        "ClientAliveCountMax 3",
        "Subsystem sftp internal-sftp",
        "",
    ])


def _shell_rc_mounts(spec: RigSpec) -> str:
    """Shell commands, run in a node's private mount namespace before its sshd starts, that hide root's
    ~/.bashrc behind an empty file (spec.shell_rc "empty"); nothing for "host" or where there is none."""
    if spec.shell_rc == "host":
        return ""
    rc = Path(pwd.getpwnam("root").pw_dir) / ".bashrc"
    empty = spec.state_dir / "sshd" / "empty-rc"
    empty.write_text("")
    return (f"if [ -f {shlex.quote(str(rc))} ]; then "
            f"mount --bind {shlex.quote(str(empty))} {shlex.quote(str(rc))}; fi; ")


def _keygen(log: CommandLog, path: Path, comment: str) -> str:
    if path.exists():
        path.unlink()
    pub = path.with_suffix(".pub") if path.suffix else Path(str(path) + ".pub")
    if pub.exists():
        pub.unlink()
    log.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
    return " ".join(Path(str(path) + ".pub").read_text().split()[:2])


def check_prerequisites() -> list[str]:
    """Names of missing tools / kernel features (empty when the rig can be built)."""
    missing = [t for t in REQUIRED_TOOLS if shutil.which(t) is None and not Path(t).exists()]
    if not Path("/dev/fuse").exists():
        missing.append("/dev/fuse")
    if os.geteuid() != 0:
        missing.append("root")
    return missing


def _wait_for_log(path: Path, needle: str, proc: subprocess.Popen, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""
        if needle in text:
            return
        if proc.poll() is not None:
            raise RigError(f"rig: {what} exited rc={proc.returncode}: {text.strip()[-600:]}")
        time.sleep(0.05)
    raise RigError(f"rig: {what} not ready after {timeout_s}s (log {path})")


def _ssh_argv(spec: RigSpec, port: int, remote: list[str]) -> list[str]:
    return [
        "ssh", "-p", str(port), "-i", str(spec.identity_file),
        "-o", f"UserKnownHostsFile={spec.known_hosts}", "-o", "StrictHostKeyChecking=yes",
        "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR",
        "root@127.0.0.1", "--", shlex.join(remote),
    ]


def rig_up(spec: RigSpec) -> RigState:
    """Build the rig (tearing down leftovers of the same prefix first) and write inventory + state.

    On any failure everything built so far is torn down again and RigError is raised.
    """
    missing = check_prerequisites()
    if missing:
        raise RigError(f"rig: missing prerequisites: {', '.join(missing)} (apt: iproute2 openssh-server sshfs fuse3)")
    rig_down(spec)
    try:
        return _build(spec)
    except BaseException:
        try:
            rig_down(spec)
        except RigError:
            pass
        raise


def _build(spec: RigSpec) -> RigState:
    """Build the rig in order: keys, namespaces and the shaped port, the storage sshd, the node sshds (each with
    its sshfs mount of the pool), the loopback forwarder, the files for kvgate and people, then ready checks."""
    sd = spec.state_dir
    for sub in ("keys", "hostkeys", "sshd", "storage/pool", "mnt/pool", "log", "work"):
        (sd / sub).mkdir(parents=True, exist_ok=True)
    # what is being built, recorded before anything is: `down` of a half-built rig takes all of it
    (sd / STATE_FILE).write_text(json.dumps(asdict(RigState(
        spec={k: str(v) if isinstance(v, Path) else v for k, v in asdict(spec).items()})), indent=2))
    os.chmod(sd / "keys", 0o700)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    log = _host_log(spec.log_dir)
    state = RigState(spec={k: str(v) if isinstance(v, Path) else v for k, v in asdict(spec).items()},
                     started_at=time.time())
    host_pub = _build_keys(spec, log)
    _build_network(spec, log)
    _start_storage_sshd(spec, state)
    _start_node_sshds(spec, state)
    targets = _start_forwarder(spec, state)
    _write_access_files(spec, state, host_pub, targets)
    _check_ready(spec, state, targets)
    (sd / STATE_FILE).write_text(json.dumps(asdict(state), indent=2))
    return state


def _build_keys(spec: RigSpec, log: CommandLog) -> dict[str, str]:
    """One client key, one host key per sshd; nothing outside the state dir. The host public keys by node."""
    sd = spec.state_dir
    client_pub = _keygen(log, spec.identity_file, "kvgate-rig")
    (sd / "keys" / "authorized_keys").write_text(client_pub + "\n")
    host_pub: dict[str, str] = {}
    for who in [STORAGE_NODE] + spec.node_names():
        host_pub[who] = _keygen(log, sd / "hostkeys" / f"{who}_ed25519", f"kvgate-rig-{who}")
    # The storage host key as every node's sshfs sees it.
    (sd / "keys" / "storage_known_hosts").write_text(f"{spec.storage_addr} {host_pub[STORAGE_NODE]}\n")
    return host_pub


def _build_network(spec: RigSpec, log: CommandLog) -> None:
    """The namespaces, the hub's bridge, a veth per namespace, and the one storage port shaped both ways."""
    for ns in spec.all_namespaces():
        log.run(["ip", "netns", "add", ns])
    hub = spec.hub_ns
    log.run(["ip", "-n", hub, "link", "set", "lo", "up"])
    log.run(["ip", "-n", hub, "link", "add", "br0", "type", "bridge"])
    log.run(["ip", "-n", hub, "addr", "add", f"{spec.hub_addr}/24", "dev", "br0"])
    log.run(["ip", "-n", hub, "link", "set", "br0", "up"])

    def plug(ns: str, hub_if: str, ifname: str, addr: str) -> None:
        log.run(["ip", "-n", hub, "link", "add", hub_if, "type", "veth", "peer", "name", ifname, "netns", ns])
        log.run(["ip", "-n", hub, "link", "set", hub_if, "master", "br0", "up"])
        log.run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", ifname])
        log.run(["ip", "-n", ns, "link", "set", ifname, "up"])
        log.run(["ip", "-n", ns, "link", "set", "lo", "up"])

    plug(spec.storage_ns, "v-st", "st0", spec.storage_addr)
    for node in spec.node_names():
        plug(spec.node_ns(node), f"v-{node}", "eth0", spec.node_addr(node))
    # The one storage port, shaped in both directions: egress of st0 (reads) and of its hub peer (writes).
    tbf = ["tbf", "rate", f"{spec.port_rate_mbit}mbit", "burst", spec.tbf_burst, "latency", spec.tbf_latency]
    log.run(["tc", "-n", spec.storage_ns, "qdisc", "add", "dev", "st0", "root", *tbf])
    log.run(["tc", "-n", hub, "qdisc", "add", "dev", "v-st", "root", *tbf])


def _start_storage_sshd(spec: RigSpec, state: RigState) -> None:
    sd = spec.state_dir
    st_cfg = sd / "sshd" / "storage.conf"
    st_cfg.write_text(_sshd_config(spec, spec.storage_addr, sd / "hostkeys" / f"{STORAGE_NODE}_ed25519"))
    st_log = spec.log_dir / "sshd-storage.log"
    with st_log.open("wb") as fh:
        st_script = f"set -e; {_shell_rc_mounts(spec)}exec {SSHD} -D -e -f {shlex.quote(str(st_cfg))}"
        st_proc = subprocess.Popen(["ip", "netns", "exec", spec.storage_ns, "unshare", "--mount", "--propagation",
                                    "private", "--", "/bin/sh", "-c", st_script],
                                   stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    state.pids["sshd-storage"] = st_proc.pid
    _wait_for_log(st_log, "Server listening", st_proc, 10.0, "storage sshd")


def _start_node_sshds(spec: RigSpec, state: RigState) -> None:
    """Node sshds, each in a private mount namespace that holds the sshfs mount of the pool; started at once,
    then waited for."""
    sd = spec.state_dir
    sshfs_opts = ",".join([
        f"IdentityFile={spec.identity_file}",
        f"UserKnownHostsFile={sd / 'keys' / 'storage_known_hosts'}",
        "StrictHostKeyChecking=yes", "BatchMode=yes", "ConnectTimeout=5",
        "Ciphers=aes128-gcm@openssh.com", "Compression=no",
        "ServerAliveInterval=5", "ServerAliveCountMax=3",
    ])
    node_procs: dict[str, tuple[subprocess.Popen, Path]] = {}
    for node in spec.node_names():
        cfg = sd / "sshd" / f"{node}.conf"
        cfg.write_text(_sshd_config(spec, spec.node_addr(node), sd / "hostkeys" / f"{node}_ed25519"))
        script = (
            "set -e; "
            f"sshfs -o {shlex.quote(sshfs_opts)} root@{spec.storage_addr}:{shlex.quote(str(spec.pool_dir))} "
            f"{shlex.quote(str(spec.pool_mount))}; "
            f"{_shell_rc_mounts(spec)}echo 'rig: pool mounted'; exec {SSHD} -D -e -f {shlex.quote(str(cfg))}"
        )
        nlog = spec.log_dir / f"sshd-{node}.log"
        with nlog.open("wb") as fh:
            p = subprocess.Popen(
                ["ip", "netns", "exec", spec.node_ns(node), "unshare", "--mount", "--propagation", "private",
                 "--", "/bin/sh", "-c", script],
                stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        state.pids[f"sshd-{node}"] = p.pid
        node_procs[node] = (p, nlog)
    for node, (p, nlog) in node_procs.items():
        _wait_for_log(nlog, "Server listening", p, spec.ready_timeout_s, f"node {node} (sshfs + sshd)")


def _start_forwarder(spec: RigSpec, state: RigState) -> dict[str, str]:
    """Loopback listeners in the root namespace, forwarded from inside the hub namespace. The address each
    forwards to, by node."""
    listeners: dict[str, socket.socket] = {}
    targets: dict[str, str] = {STORAGE_NODE: spec.storage_addr}
    targets.update({n: spec.node_addr(n) for n in spec.node_names()})
    for who in targets:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        listeners[who] = s
        state.ssh_ports[who] = s.getsockname()[1]
    mapping = [f"{s.fileno()}={targets[who]}:22" for who, s in listeners.items()]
    fwd_log = spec.log_dir / "forwarder.log"
    with fwd_log.open("wb") as fh:
        fwd = subprocess.Popen(["ip", "netns", "exec", spec.hub_ns, sys.executable, str(FORWARDER), *mapping],
                               stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                               pass_fds=[s.fileno() for s in listeners.values()], start_new_session=True)
    state.pids["forwarder"] = fwd.pid
    for s in listeners.values():
        s.close()  # the forwarder holds its own copies
    _wait_for_log(fwd_log, "serving", fwd, 10.0, "loopback forwarder")
    return targets


def _write_access_files(spec: RigSpec, state: RigState, host_pub: dict[str, str], targets: dict[str, str]) -> None:
    """Pinned host keys as kvgate sees them, an ssh_config for people, the inventory for kvgate."""
    spec.known_hosts.write_text("".join(f"[127.0.0.1]:{state.ssh_ports[w]} {host_pub[w]}\n" for w in targets))
    spec.ssh_config_path.write_text("".join(
        f"Host {w}\n  HostName 127.0.0.1\n  Port {state.ssh_ports[w]}\n  User root\n"
        f"  IdentityFile {spec.identity_file}\n  UserKnownHostsFile {spec.known_hosts}\n"
        f"  StrictHostKeyChecking yes\n\n" for w in targets))
    spec.inventory_path.write_text(render_inventory(spec, state.ssh_ports))
    state.inventory_path = str(spec.inventory_path)
    state.known_hosts = str(spec.known_hosts)
    state.identity_file = str(spec.identity_file)
    state.pool_mount = str(spec.pool_mount)
    state.ssh_config = str(spec.ssh_config_path)


def _check_ready(spec: RigSpec, state: RigState, targets: dict[str, str]) -> None:
    """Ready means: every sshd answers over the loopback port and every node sees the pool mounted."""
    def probe(who: str) -> str | None:
        remote = ["true"] if who == STORAGE_NODE else ["mountpoint", "-q", str(spec.pool_mount)]
        cp = _UNLOGGED.run(_ssh_argv(spec, state.ssh_ports[who], remote), check=False, timeout_s=20)
        return None if cp.returncode == 0 else f"{who}: rc={cp.returncode} {cp.stderr.strip()[-300:]}"

    with ThreadPoolExecutor(max_workers=len(targets)) as ex:
        problems = [p for p in ex.map(probe, list(targets)) if p]
    if problems:
        raise RigError("rig: nodes not ready: " + "; ".join(problems))


def render_inventory(spec: RigSpec, ssh_ports: dict[str, int]) -> str:
    """The rig's inventory: N ssh nodes plus the storage node that owns the shaped port `st0`."""
    line_rate_gbit_s = spec.port_rate_mbit / 1000.0
    nodes = []
    for node in spec.node_names():
        nodes.append({
            "name": node,
            "transport": "ssh",
            "host": "127.0.0.1",
            "port": ssh_ports[node],
            "user": "root",
            "identity_file": str(spec.identity_file),
            "work_dir": str(spec.work_dir),
            "engine_python": spec.engine_python,
            # veth reports 10000 Mb/s; the node side is not the bottleneck in the rig.
            "nics": [{"name": "eth0", "line_rate_gbit_s": 10.0}],
            "targets": [{"name": "kvpool", "kind": "directory", "path": str(spec.pool_mount)}],
        })
    nodes.append({
        "name": STORAGE_NODE,
        "transport": "ssh",
        "host": "127.0.0.1",
        "port": ssh_ports[STORAGE_NODE],
        "user": "root",
        "identity_file": str(spec.identity_file),
        "work_dir": str(spec.work_dir),
        # The one shared port, shaped with tc tbf to this rate.
        "nics": [{"name": "st0", "line_rate_gbit_s": line_rate_gbit_s}],
        "targets": [{"name": "kvpool", "kind": "directory", "path": str(spec.pool_dir)}],
    })
    header = (
        f"# Generated by `kvgate rig up` (prefix {spec.prefix}, {spec.node_count} nodes, "
        f"storage port st0 shaped to {spec.port_rate_mbit} Mbit/s with tc tbf).\n"
        f"# Host keys are pinned in {spec.known_hosts}.\n"
    )
    return header + yaml.safe_dump({"nodes": nodes}, sort_keys=False)


def rig_status(spec: RigSpec) -> dict:
    """What exists now of the rig ``up`` recorded (its node count, whatever ``spec`` says; ``spec`` when there is
    no record): namespaces (and any further node namespace of its prefix), processes per namespace, and (if up)
    whether each sshd answers."""
    spec, state = recorded_spec(spec)
    present = existing_namespaces()
    out: dict = {"prefix": spec.prefix, "state_dir": str(spec.state_dir), "node_count": spec.node_count,
                 "recorded": state is not None, "up": False, "namespaces": {}}
    for ns in dict.fromkeys(spec.all_namespaces() + rig_namespaces(spec, present)):
        if ns in present:
            pids = namespace_pids(ns)
            out["namespaces"][ns] = {"pids": pids, "commands": [process_cmdline(p)[:120] for p in pids]}
        else:
            out["namespaces"][ns] = None
    if state is not None and all(out["namespaces"].values()):
        reach = {}
        for who, port in state.ssh_ports.items():
            try:
                reach[who] = _UNLOGGED.run(_ssh_argv(spec, port, ["true"]), check=False, timeout_s=20).returncode == 0
            except RigError:  # no answer within the limit: not reachable
                reach[who] = False
        out["ssh_reachable"] = reach
        out["up"] = all(reach.values())
        out["inventory"] = state.inventory_path
    return out


def kill_node(spec: RigSpec, node: str) -> list[int]:
    """Fault injection: kill every process of one node (its sshd, sessions, readers, sshfs) by PID."""
    spec, _ = recorded_spec(spec)
    if node not in spec.node_names():
        raise RigError(f"rig: no node {node!r} (have {', '.join(spec.node_names())})")
    pids = namespace_pids(spec.node_ns(node))
    return kill_pids(pids, grace_s=0.5)


def node_processes(spec: RigSpec, node: str) -> list[tuple[int, str]]:
    """(PID, command line) of every process in a node's namespace."""
    return [(p, process_cmdline(p)) for p in namespace_pids(spec.node_ns(node))]


def set_port_rate(spec: RigSpec, rate_mbit: int) -> None:
    """Reshape the storage port (both directions) to ``rate_mbit`` in place, nodes and mounts untouched:
    one rig serves runs with different port rates (the benchmark keeps each node's share of the port the
    same at every node count). The inventory's declared line rate is the caller's to match."""
    if rate_mbit <= 0:
        raise RigError(f"rig port rate {rate_mbit}: must be > 0")
    tbf = ["tbf", "rate", f"{rate_mbit}mbit", "burst", spec.tbf_burst, "latency", spec.tbf_latency]
    for argv in (["tc", "-n", spec.storage_ns, "qdisc", "change", "dev", "st0", "root", *tbf],
                 ["tc", "-n", spec.hub_ns, "qdisc", "change", "dev", "v-st", "root", *tbf]):
        _UNLOGGED.run(argv)


def set_node_link(spec: RigSpec, node: str, up: bool) -> None:
    """Fault injection: take a node's only link (eth0 in its namespace) down or bring it back up.

    With the link down the node's processes live on, but nothing reaches it and it reaches nothing:
    kvgate's SSH session to it falls silent and its sshfs mount of the pool stalls, as when a real
    node's cable or switch port fails."""
    spec, _ = recorded_spec(spec)
    if node not in spec.node_names():
        raise RigError(f"rig: no node {node!r} (have {', '.join(spec.node_names())})")
    cp = _UNLOGGED.run(["ip", "-n", spec.node_ns(node), "link", "set", "eth0", "up" if up else "down"], check=False)
    if cp.returncode != 0:
        raise RigError(f"rig: link {'up' if up else 'down'} on {node} failed: {cp.stderr.strip()}")
