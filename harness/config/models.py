"""Inventory and gate-suite models, strictly validated (loading and cross-checks: harness.config.loading).

Values that later reach a command line are either validated against a strict pattern here (node names,
host names, user names, device paths, NIC names) or passed on as one literal argv element (file paths).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..endurance import DriveRating
from ..redact import add_secret_names, env_name_ok
from ..units import Threshold, UnitError, parse_quantity, parse_size_bytes, parse_threshold

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
HOST_RE = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$|^\[?[0-9A-Fa-f:]+\]?$")
USER_RE = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")
DEV_RE = re.compile(r"^/dev/[A-Za-z0-9._/-]+$")
IFNAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,15}$")
NQN_RE = re.compile(r"^nqn\.\d{4}-\d{2}\.[A-Za-z0-9.:_-]+$")
UUID_RE = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
NGUID_RE = re.compile(r"^(?:[0-9a-fA-F]-?){31}[0-9a-fA-F]$")
GATE_ID_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def _safe_path(v: str) -> str:
    if not v:
        raise ValueError("empty path")
    if "\x00" in v or "\n" in v or "\r" in v:
        raise ValueError("path contains a NUL or newline (expected a plain path)")
    return v


class Gpu(Strict):
    index: int = Field(ge=0)
    numa_node: int | None = Field(default=None, ge=0)
    model: str | None = None


class Nic(Strict):
    name: str
    line_rate_gbit_s: float = Field(gt=0)
    mtu: int | None = Field(default=None, ge=68, le=65536)

    @field_validator("name")
    @classmethod
    def _ifname(cls, v: str) -> str:
        if not IFNAME_RE.match(v):
            raise ValueError(f"invalid interface name {v!r} (expected letters, digits, . _ -; at most 15)")
        return v


TargetKind = Literal["file", "directory", "block", "nvmeof", "nvmeof-loopback"]


class LoopbackPort(Strict):
    """A further nvmet port of an ``nvmeof-loopback`` target: the same namespace exported at another address
    (multipath: each port is a path, with its own ANA group state)."""

    traddr: str
    trsvcid: str

    @field_validator("traddr")
    @classmethod
    def _traddr(cls, v: str) -> str:
        if not HOST_RE.match(v):
            raise ValueError(f"invalid transport address {v!r} (expected an IP address or host name)")
        return v

    @field_validator("trsvcid", mode="before")
    @classmethod
    def _svc(cls, v: Any) -> str:
        if not re.fullmatch(r"\d{1,5}", str(v)):
            raise ValueError(f"invalid service id {v!r} (expected a port number)")
        return str(v)


class Target(Strict):
    """A storage target on a node. File/directory paths may be relative to the node's work_dir."""

    name: str
    kind: TargetKind
    path: str | None = None
    size_bytes: int | None = Field(default=None, alias="size")
    allow_destructive: bool = False
    serial: str | None = None
    # NVMe-oF
    nqn: str | None = None
    transport: Literal["tcp", "rdma", "fc"] | None = None
    traddr: str | None = None
    trsvcid: str | None = None
    backing: Literal["null_blk", "brd", "file", "block"] | None = None
    backing_path: str | None = None
    # nvmeof-loopback over rdma: the NIC the soft-RoCE device goes on (rdma link add ... netdev NIC)
    soft_roce_netdev: str | None = None
    # nvmeof-loopback that connects its own host side: a filesystem kvgate makes on the namespace (through the
    # write guard) and mounts at mount_path, for gates that need a directory on the NVMe-oF tier (kv-read)
    filesystem: Literal["ext4"] | None = None
    mount_path: str | None = None
    # nvmeof-loopback: the same namespace on further nvmet ports (multipath; same transport, one path each)
    extra_ports: list[LoopbackPort] = []
    # nvmeof (the host side of an array): how kvgate finds, or makes, the connection and the namespace
    connect: Literal["existing", "managed"] | None = None
    nsid: int | None = Field(default=None, ge=1)
    ns_uuid: str | None = None
    nguid: str | None = None
    host_nqn: str | None = None
    host_id: str | None = None
    nr_io_queues: int | None = Field(default=None, ge=1, le=1024)
    queue_size: int | None = Field(default=None, ge=16, le=4096)
    ctrl_loss_tmo_s: int | None = Field(default=None, ge=-1, le=86400)
    reconnect_delay_s: int | None = Field(default=None, ge=1, le=3600)  # nvme connect --reconnect-delay
    connect_timeout_s: float = Field(default=30.0, gt=0, le=600)
    discovery_trsvcid: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError(f"invalid target name {v!r} (expected letters, digits, . _ -)")
        return v

    @field_validator("soft_roce_netdev")
    @classmethod
    def _netdev(cls, v: str | None) -> str | None:
        if v is not None and not IFNAME_RE.match(v):
            raise ValueError(f"invalid interface name {v!r} (expected letters, digits, . _ -; at most 15)")
        if v == "lo":
            raise ValueError("soft-RoCE on lo does not carry NVMe/RDMA (nvme connect -t rdma fails with "
                             "rdma_resolve_route failed (-110)); expected the NIC that holds traddr, e.g. eth0")
        return v

    @field_validator("host_nqn")
    @classmethod
    def _host_nqn(cls, v: str | None) -> str | None:
        if v is not None and not NQN_RE.match(v):
            raise ValueError(f"invalid host NQN {v!r} (expected nqn.YYYY-MM.reverse.domain:name)")
        return v

    @field_validator("host_id", "ns_uuid")
    @classmethod
    def _uuid(cls, v: str | None) -> str | None:
        if v is not None and not UUID_RE.match(v):
            raise ValueError(f"invalid UUID {v!r} (expected 8-4-4-4-12 hex digits)")
        return v

    @field_validator("nguid")
    @classmethod
    def _nguid(cls, v: str | None) -> str | None:
        if v is not None and not NGUID_RE.match(v):
            raise ValueError(f"invalid NGUID {v!r} (expected 32 hex digits, dashes allowed)")
        return v

    @field_validator("size_bytes", mode="before")
    @classmethod
    def _size(cls, v: Any) -> Any:
        return None if v is None else parse_size_bytes(v)

    @field_validator("path", "backing_path")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        return None if v is None else _safe_path(v)

    @field_validator("mount_path")
    @classmethod
    def _mount_path(cls, v: str | None) -> str | None:
        if v is not None and (not re.fullmatch(r"/[A-Za-z0-9._/-]*[A-Za-z0-9._-]", v) or ".." in v.split("/")):
            raise ValueError(f"invalid mount_path {v!r} (expected an absolute directory path other than /: "
                             "letters, digits, . _ - / only)")
        return v

    @field_validator("nqn")
    @classmethod
    def _nqn(cls, v: str | None) -> str | None:
        if v is not None and not NQN_RE.match(v):
            raise ValueError(f"invalid NQN {v!r} (expected nqn.YYYY-MM.reverse.domain:name)")
        return v

    @field_validator("traddr")
    @classmethod
    def _traddr(cls, v: str | None) -> str | None:
        if v is not None and not HOST_RE.match(v):
            raise ValueError(f"invalid transport address {v!r} (expected an IP address or host name)")
        return v

    @field_validator("trsvcid", "discovery_trsvcid")
    @classmethod
    def _svc(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"\d{1,5}", str(v)):
            raise ValueError(f"invalid service id {v!r} (expected a port number)")
        return v

    @model_validator(mode="after")
    def _by_kind(self) -> "Target":
        if self.kind in ("file", "directory", "block") and not self.path:
            raise ValueError(f"target kind {self.kind!r} needs a path")
        if self.kind == "block" and self.path and not DEV_RE.match(self.path):
            raise ValueError(f"block target path {self.path!r} must be a device path like /dev/nvme0n1 "
                             "(letters, digits, . _ - / only)")
        if self.kind == "file" and self.size_bytes is None:
            raise ValueError("file target needs a size (e.g. size: 1 GiB) so kvgate can create and fill it")
        if self.allow_destructive and not self.serial:
            raise ValueError("allow_destructive: true needs the device's serial number (serial: ...)")
        if self.kind in ("nvmeof", "nvmeof-loopback") and not self.nqn:
            raise ValueError(f"target kind {self.kind!r} needs an nqn")
        if self.kind == "nvmeof":
            self._check_nvmeof()
        else:
            host_side = [k for k in _NVMEOF_HOST_FIELDS if k in self.model_fields_set]
            if host_side:
                raise ValueError(f"{', '.join(host_side)}: only for kind nvmeof (the host side of an NVMe-oF "
                                 f"target), not {self.kind}")
        if (self.filesystem is None) != (self.mount_path is None):
            raise ValueError("filesystem and mount_path go together: the filesystem kvgate makes on the namespace "
                             "and where it mounts it (e.g. filesystem: ext4, mount_path: /mnt/kvgate-kv)")
        if self.filesystem is not None and self.kind != "nvmeof-loopback":
            raise ValueError("filesystem, mount_path: only for kind nvmeof-loopback (a filesystem kvgate makes on "
                             "the namespace it provisions)")
        if self.extra_ports and self.kind != "nvmeof-loopback":
            raise ValueError("extra_ports: only for kind nvmeof-loopback (further nvmet ports of the namespace)")
        if self.soft_roce_netdev is not None and not (self.kind == "nvmeof-loopback" and self.transport == "rdma"):
            raise ValueError("soft_roce_netdev: only for kind nvmeof-loopback with transport rdma")
        if self.kind == "nvmeof-loopback" and self.transport == "rdma":
            if not self.soft_roce_netdev:
                raise ValueError("an nvmeof-loopback target over rdma needs soft_roce_netdev: the NIC that holds "
                                 "traddr (kvgate adds a soft-RoCE device on it; not lo)")
            if not self.traddr or self.traddr.startswith("127.") or self.traddr in ("::1", "[::1]", "localhost"):
                raise ValueError(f"an nvmeof-loopback target over rdma needs traddr: an address of "
                                 f"{self.soft_roce_netdev} (got {self.traddr!r}; loopback addresses do not route "
                                 "over soft-RoCE)")
        return self

    def _check_nvmeof(self) -> None:
        if self.connect is None:
            raise ValueError("target kind 'nvmeof' needs connect: existing (the node is already connected; kvgate "
                             "finds the namespace by NQN) or managed (kvgate connects and disconnects)")
        if self.transport not in ("tcp", "rdma"):
            raise ValueError(f"target kind 'nvmeof' needs transport: tcp or rdma (got {self.transport!r})")
        if not self.traddr:
            raise ValueError("target kind 'nvmeof' needs traddr: the array's address (checked against the live "
                             "controller; managed: where kvgate connects)")
        if self.path is not None:
            raise ValueError("path: a kind nvmeof target has no path: its /dev/nvmeXnY is found by NQN when the "
                             "gate runs (the kernel picks the name)")
        if self.backing is not None or self.backing_path is not None:
            raise ValueError("backing: only for kind nvmeof-loopback (the target side kvgate provisions)")
        if self.ns_uuid and self.nguid:
            raise ValueError("ns_uuid and nguid: name the namespace by one of them (or by nsid)")
        if self.connect == "existing":
            managed_only = [k for k in _MANAGED_FIELDS if k in self.model_fields_set]
            if managed_only:
                raise ValueError(f"{', '.join(managed_only)}: only for connect: managed (with connect: existing "
                                 "the connection is the node's own)")


# Fields of the host side of an NVMe-oF target (kind nvmeof); the other kinds refuse them.
_MANAGED_FIELDS = ("host_id", "nr_io_queues", "queue_size", "ctrl_loss_tmo_s", "connect_timeout_s",
                   "discovery_trsvcid", "reconnect_delay_s")
_NVMEOF_HOST_FIELDS = ("connect", "nsid", "ns_uuid", "nguid", "host_nqn") + _MANAGED_FIELDS


class PoolDrive(Strict):
    """The drive behind a node's KV pool as its datasheet rates it (docs/endurance.md): ``capacity`` in decimal
    units as vendors state it (``3.84 TB``), ``rated_dwpd`` full drive writes per day over ``warranty_years``.
    Optional: without it the serving gates report bytes written per million tokens, but no days to rating."""

    name: str | None = None
    capacity_bytes: int = Field(alias="capacity")
    rated_dwpd: float = Field(gt=0, le=1000, allow_inf_nan=False)
    warranty_years: float = Field(default=5.0, gt=0, le=50, allow_inf_nan=False)

    @field_validator("capacity_bytes", mode="before")
    @classmethod
    def _capacity(cls, v: Any) -> Any:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            raise ValueError(f"expected a size with its unit such as '3.84 TB', got {v!r}")
        return parse_size_bytes(v, what="drive capacity")

    def rating(self) -> DriveRating:
        return DriveRating(self.capacity_bytes, self.rated_dwpd, self.warranty_years, self.name)


class Node(Strict):
    name: str
    transport: Literal["local", "ssh"] = "ssh"
    host: str | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    user: str | None = None
    identity_file: str | None = None
    proxy_jump: str | None = None
    work_dir: str = "/tmp/kvgate-work"
    # The interpreter of the node's engine environment (a venv with torch/LMCache/vLLM), used by the
    # engine workloads when the gate does not name one; default: kvgate's own interpreter on a local
    # node, python3 on an SSH node.
    engine_python: str | None = None
    gpus: list[Gpu] = Field(default_factory=list)
    read_streams: int | None = Field(default=None, ge=1, le=1024)
    nics: list[Nic] = Field(default_factory=list)
    targets: list[Target] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    # the drive the node's KV pool lives on, for the serving gates' days to its rating (docs/endurance.md)
    pool_drive: PoolDrive | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError(f"invalid node name {v!r} (expected letters, digits, . _ -)")
        return v

    @field_validator("host")
    @classmethod
    def _host(cls, v: str | None) -> str | None:
        if v is not None and not HOST_RE.match(v):
            raise ValueError(f"invalid host {v!r} (expected a host name, ~/.ssh/config alias or IP address)")
        return v

    @field_validator("user")
    @classmethod
    def _user(cls, v: str | None) -> str | None:
        if v is not None and not USER_RE.match(v):
            raise ValueError(f"invalid user name {v!r}")
        return v

    @field_validator("proxy_jump")
    @classmethod
    def _jump(cls, v: str | None) -> str | None:
        if v is None:
            return v
        for hop in v.split(","):
            hostpart = hop.rsplit("@", 1)[-1]
            hostpart = re.sub(r":\d+$", "", hostpart)
            if not HOST_RE.match(hostpart):
                raise ValueError(f"invalid proxy_jump hop {hop!r} (expected [user@]host[:port])")
        return v

    @field_validator("identity_file", "work_dir")
    @classmethod
    def _paths(cls, v: str | None) -> str | None:
        return None if v is None else _safe_path(v)

    @model_validator(mode="after")
    def _checks(self) -> "Node":
        if self.transport == "ssh" and not self.host:
            raise ValueError("ssh node needs a host")
        seen: set[int] = set()
        for g in self.gpus:
            if g.index in seen:
                raise ValueError(f"duplicate GPU index {g.index}")
            seen.add(g.index)
        names = [t.name for t in self.targets]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"duplicate target name(s): {', '.join(sorted(dup))}")
        return self

    def target(self, name: str) -> Target | None:
        return next((t for t in self.targets if t.name == name), None)

    @property
    def stream_count(self) -> int:
        return len(self.gpus) if self.gpus else (self.read_streams or 1)


def check_secret_env(names: list[str]) -> list[str]:
    """``secret_env``: environment variable names whose values are secrets, on top of the default patterns
    (names containing TOKEN, KEY, PASSWORD, PASSWD, SECRET, CREDENTIAL, AUTH); each must be a variable name,
    listed once. The names are marked secret for the whole run (harness.redact), so their values never
    reach a file, a plan or a command line."""
    bad = [n for n in names if not env_name_ok(n)]
    if bad:
        raise ValueError(f"invalid environment variable name(s) {', '.join(map(repr, bad))} "
                         "(expected letters, digits and _, not starting with a digit)")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"listed twice: {', '.join(dup)}")
    add_secret_names(names)
    return names


class SlurmConfig(Strict):
    """``slurm:`` in the inventory: the cluster a gate with ``launcher: slurm`` submits its node-side step to
    (harness/execute/slurm.py; docs/launchers.md). Node names are the cluster's node names."""

    partition: str | None = None
    account: str | None = None
    job_dir: str = Field(min_length=1, description="a directory every node and the control host see at this path")
    python: str = "python3"
    gres_per_task: str | None = None  # e.g. "gpu:1"
    time_margin_s: float = Field(default=60.0, ge=0)  # added to the step's own time budget for --time
    extra_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)  # for srun/scontrol/scancel, e.g. SLURM_CONF

    @field_validator("job_dir")
    @classmethod
    def _abs(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"expected an absolute path, got {v!r}")
        return v


class K8sConfig(Strict):
    """``k8s:`` in the inventory: what ``kvgate render k8s`` writes into a gate's Indexed Job (harness/execute/k8s.py;
    docs/launchers.md). Node names are the cluster's node names (``kubernetes.io/hostname``)."""

    namespace: str = "default"
    image: str = Field(min_length=1, description="a container image with python3 (stdlib only is needed)")
    python: str = "python3"
    results_claim: str = Field(min_length=1, description="a ReadWriteMany PersistentVolumeClaim every pod mounts")
    pool_claim: str | None = None  # the shared pool as a PVC; default: each node's pool directory as a hostPath
    node_selector: dict[str, str] = Field(default_factory=dict)
    gpu_resource: str = "nvidia.com/gpu"
    gpus_per_pod: int = Field(default=0, ge=0)
    privileged: bool = False  # a pod drops its node's page cache only when privileged (else recorded as not dropped)
    go_lead_s: float = Field(default=2.0, gt=0, le=60)  # the common start: this long after the last rank armed
    time_margin_s: float = Field(default=60.0, ge=0)  # added to arm + read timeouts for activeDeadlineSeconds

    @field_validator("namespace", "results_claim", "pool_claim")
    @classmethod
    def _dns_name(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", v):
            raise ValueError(f"expected a Kubernetes name (lower-case letters, digits and '-'), got {v!r}")
        return v


class Inventory(Strict):
    nodes: list[Node] = Field(min_length=1)
    slurm: SlurmConfig | None = None
    k8s: K8sConfig | None = None
    # Environment variables whose values are secret wherever kvgate passes them (engine profiles' env, any
    # command's), on top of the default name patterns: redacted in everything kvgate writes.
    secret_env: list[str] = Field(default_factory=list)

    @field_validator("secret_env")
    @classmethod
    def _secret_env(cls, v: list[str]) -> list[str]:
        return check_secret_env(v)

    def node(self, name: str) -> Node | None:
        return next((n for n in self.nodes if n.name == name), None)


def _threshold(v: Any) -> Threshold:
    if isinstance(v, Threshold):
        return v
    try:
        return parse_threshold(v)
    except UnitError as exc:
        raise ValueError(str(exc)) from None


class Reference(Strict):
    value: str
    source: str | None = None
    note: str | None = None

    @field_validator("value")
    @classmethod
    def _qty(cls, v: str) -> str:
        try:
            parse_quantity(v)
        except UnitError as exc:
            raise ValueError(str(exc)) from None
        return v


class SuiteMeta(Strict):
    name: str
    version: str | int
    description: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError(f"invalid suite name {v!r} (expected letters, digits, . _ -)")
        return v


class Gate(Strict):
    id: str
    title: str
    workload: str
    params: dict[str, Any] = Field(default_factory=dict)
    nodes: list[str] | None = None
    metric: str
    pass_: Threshold = Field(alias="pass")
    stop_loss: Threshold | None = None
    reference: Reference | None = None
    informational: bool = False
    timeout_s: float = Field(default=3600.0, gt=0)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, arbitrary_types_allowed=True)

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not GATE_ID_RE.match(v):
            raise ValueError(f"invalid gate id {v!r} (expected e.g. G1)")
        return v

    @field_validator("pass_", "stop_loss", mode="before")
    @classmethod
    def _thr(cls, v: Any) -> Any:
        return None if v is None else _threshold(v)

    @model_validator(mode="after")
    def _stop_vs_pass(self) -> "Gate":
        p, s = self.pass_, self.stop_loss
        if s is None:
            return self
        if s.dimension != p.dimension:
            raise ValueError(f"stop_loss {s} is a {s.dimension} but pass {p} is a {p.dimension}")
        if p.higher_is_better:
            if s.higher_is_better:
                raise ValueError(f"stop_loss {s} must be a lower bound ('<' or '<=') when pass is {p}")
            if s.quantity.base > p.quantity.base:
                raise ValueError(f"stop_loss {s} is stricter than pass {p} (expected a stop-loss at or below the pass threshold)")
        else:
            if not s.higher_is_better:
                raise ValueError(f"stop_loss {s} must be an upper bound ('>' or '>=') when pass is {p}")
            if s.quantity.base < p.quantity.base:
                raise ValueError(f"stop_loss {s} is stricter than pass {p} (expected a stop-loss at or above the pass threshold)")
        return self


class GateSuite(Strict):
    suite: SuiteMeta
    gates: list[Gate] = Field(min_length=1)
