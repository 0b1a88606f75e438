"""Single-node NVMe-oF loopback: kernel nvmet target + NVMe/TCP or NVMe/RDMA initiator on one node.

Over RDMA the port is soft-RoCE: ``rdma_rxe`` on a real NIC of the node (``soft_roce_netdev``; never ``lo``,
where ``nvme connect -t rdma`` fails with ``rdma_resolve_route failed (-110)``), added as
``rdma link add kvgate-<nic> type rxe netdev <nic>`` unless an RDMA device is already on that NIC.

When the node also declares a ``kind: nvmeof`` target with the same NQN, the loopback is the target side only
(the array, as it were): ``up`` provisions nvmet and leaves the connect to that target (``connect: managed`` in
``kvgate run``), and it allows that target's host NQN. ``down`` always disconnects a host left connected.

Provisioning is agentless: plain argv commands through a Transport (modprobe, mkdir/ln/rm/rmdir
in configfs, ``sh -c 'printf ...'`` to write an attribute, nvme-cli). The flow is

    probe (commands) -> parse (pure) -> plan (pure, from the observed state) -> execute

so ``up`` twice is a no-op the second time and ``down`` after a half-done ``up`` removes
only what exists, in reverse order. Each phase re-probes because later objects depend on
earlier ones (the backing device name, the /dev/nvmeXnY the kernel picks).

kvgate undoes only what it did: every object ``up`` creates (a configfs item, the brd module it loaded, the
soft-RoCE device, the connect, the link at ``target.path``, the filesystem and its mount) is recorded in the
node's loopback state (``/run/kvgate/loopback/state.json``: tmpfs, so it goes with the kernel objects at a
reboot, and stamped with the boot id), and ``down`` undoes exactly what is recorded and still there. A brd RAM
disk, a configfs item, a link or a mount that was there before is left alone. ``up`` replaces nothing it did
not make: a ``target.path`` holding a file, a directory or a link kvgate did not record is refused before
anything is done, naming the inventory line of ``path``.

Runner seam: every command goes through ``run(name, argv, timeout_s) -> CommandResult`` so the
CLI and workloads can route it through the step log (``harness.transport.steps``) (argv/stdout/stderr/rc on disk).
"""

from __future__ import annotations

import json
import posixpath
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..errors import HarnessError
from ..parsers import nvme as P
from ..parsers.blockdev import parse_blkid_export
from ..parsers.rdma import RDMA_LINK_ARGV, RdmaLink, parse_rdma_links
from ..writeguard import CREATED_SUFFIX, WriteDecision, check_write

Runner = Callable[[str, Sequence[str], float | None], Any]  # returns a CommandResult

DEFAULT_SIZE_BYTES = 256 * 1024 * 1024
INTEGRITY_CHUNK = 65536
INTEGRITY_LEN_BYTES = 1024 * 1024
TARGET_MODULES = {"tcp": ("nvmet", "nvmet-tcp", "nvme-tcp"), "rdma": ("rdma_rxe", "nvmet", "nvmet-rdma", "nvme-rdma")}
MKE2FS = "/usr/sbin/mke2fs"
RDMA_LINK_PREFIX = "kvgate-"  # soft-RoCE devices kvgate added (and so may delete): kvgate-<nic>
STATE_DIR = "/run/kvgate/loopback"  # what up did, on the node (tmpfs: gone with the kernel objects at a reboot)
STATE_FILE = f"{STATE_DIR}/state.json"
STATE_FORMAT = 1


class LoopbackError(HarnessError):
    """The loopback could not be provisioned, inspected or torn down."""


# ------------------------------------------------------------------------------------------ spec


@dataclass(frozen=True)
class LoopbackSpec:
    """What one loopback target is: NQN, address, backing store. Built from an inventory Target."""

    name: str
    nqn: str
    host_nqn: str
    host_id: str
    traddr: str = "127.0.0.1"
    trsvcid: str = "4420"
    transport: str = "tcp"
    backing: str = "null_blk"
    backing_path: str | None = None
    size_bytes: int = DEFAULT_SIZE_BYTES
    nsid: int = 1
    link_path: str | None = None
    allow_destructive: bool = False
    serial: str | None = None  # the backing device's serial (see harness.writeguard), checked before writes
    soft_roce_netdev: str | None = None  # rdma: the NIC the soft-RoCE device sits on
    connect_host: bool = True  # False: target side only (a kind nvmeof target of the node connects)
    filesystem: str | None = None  # ext4: kvgate makes it on the namespace (write guard) and mounts it
    mount_path: str | None = None
    path_where: str | None = None  # FILE:LINE of target.path in the inventory, for a refusal naming it
    extra_ports: tuple[tuple[str, str], ...] = ()  # (traddr, trsvcid): the namespace on further ports (multipath)

    def __post_init__(self):
        if self.transport not in TARGET_MODULES:
            raise LoopbackError(f"target {self.name}: loopback supports transport tcp or rdma, got {self.transport!r}")
        if self.transport == "rdma" and (not self.soft_roce_netdev or self.soft_roce_netdev == "lo"):
            raise LoopbackError(f"target {self.name}: rdma needs soft_roce_netdev, a NIC other than lo "
                                "(got {self.soft_roce_netdev!r})")
        if self.backing not in ("null_blk", "brd", "file", "block"):
            raise LoopbackError(f"target {self.name}: unknown backing {self.backing!r}")
        if self.backing in ("file", "block") and not self.backing_path:
            raise LoopbackError(f"target {self.name}: backing {self.backing} needs backing_path")
        if self.backing in ("null_blk", "brd", "file") and self.size_bytes % (1024 * 1024):
            raise LoopbackError(f"target {self.name}: size must be a whole number of MiB, got {self.size_bytes}")
        if self.size_bytes < 4 * INTEGRITY_LEN_BYTES:
            raise LoopbackError(f"target {self.name}: size must be at least 4 MiB, got {self.size_bytes}")
        if (self.filesystem is None) != (self.mount_path is None):
            raise LoopbackError(f"target {self.name}: filesystem and mount_path go together")
        if self.filesystem is not None and self.filesystem != "ext4":
            raise LoopbackError(f"target {self.name}: filesystem ext4 only, got {self.filesystem!r}")
        if self.filesystem is not None and not self.connect_host:
            raise LoopbackError(f"target {self.name}: a filesystem needs the loopback to connect its own host side; "
                                f"a kind: nvmeof target of the node names {self.nqn} (the target side only)")
        ids = [p[0] for p in self.ports]
        if len(set(ids)) != len(ids):
            raise LoopbackError(f"target {self.name}: extra_ports need trsvcids of their own (nvmet port ids "
                                f"{', '.join(ids)})")
        if len(self.nullb_name) > 31:
            raise LoopbackError(f"target {self.name}: name too long for a null_blk disk name (max 24 chars)")

    @property
    def port_id(self) -> str:
        # One configfs port per TCP service id: several subsystems may share it.
        return str(int(self.trsvcid))

    @property
    def ports(self) -> tuple[tuple[str, str, str], ...]:
        """(port id, traddr, trsvcid) of every nvmet port the namespace is exported on: the target's own first,
        then its ``extra_ports`` (each a path of a multipath namespace)."""
        return ((self.port_id, self.traddr, self.trsvcid),
                *((str(int(svc)), addr, svc) for addr, svc in self.extra_ports))

    def port_dir_of(self, port_id: str) -> str:
        return f"{P.NVMET_ROOT}/ports/{port_id}"

    @property
    def nullb_name(self) -> str:
        return f"kvgate-{self.name}"

    @property
    def subsys_dir(self) -> str:
        return f"{P.NVMET_ROOT}/subsystems/{self.nqn}"

    @property
    def ns_dir(self) -> str:
        return f"{self.subsys_dir}/namespaces/{self.nsid}"

    @property
    def port_dir(self) -> str:
        return f"{P.NVMET_ROOT}/ports/{self.port_id}"

    @property
    def host_dir(self) -> str:
        return f"{P.NVMET_ROOT}/hosts/{self.host_nqn}"

    @property
    def rdma_link_name(self) -> str:
        return f"{RDMA_LINK_PREFIX}{self.soft_roce_netdev}"

    @classmethod
    def from_target(cls, target: Any, node_name: str, node: Any = None, where: str | None = None
                    ) -> "LoopbackSpec":
        """From an inventory ``Target`` of kind ``nvmeof-loopback``. With its ``node``: a ``kind: nvmeof`` target
        of the node naming the same NQN makes this the target side only, allowing that target's host NQN.
        ``where``: FILE:LINE of the target's ``path`` in the inventory (refusals name it)."""
        if getattr(target, "kind", None) != "nvmeof-loopback":
            raise LoopbackError(f"target {target.name} on node {node_name} has kind {target.kind!r}, "
                                "expected nvmeof-loopback")
        served = [t for t in (getattr(node, "targets", None) or []) if t.kind == "nvmeof" and t.nqn == target.nqn]
        host_nqn = next((t.host_nqn for t in served if t.host_nqn), None) or f"nqn.2024-01.io.kvgate:host-{node_name}"
        return cls(
            name=target.name, nqn=target.nqn, host_nqn=host_nqn,
            host_id=str(uuid.uuid5(uuid.NAMESPACE_URL, host_nqn)),
            traddr=target.traddr or "127.0.0.1", trsvcid=str(target.trsvcid or "4420"),
            transport=target.transport or "tcp", backing=target.backing or "null_blk",
            backing_path=target.backing_path, size_bytes=target.size_bytes or DEFAULT_SIZE_BYTES,
            link_path=target.path, allow_destructive=bool(target.allow_destructive),
            serial=getattr(target, "serial", None), soft_roce_netdev=getattr(target, "soft_roce_netdev", None),
            connect_host=not served, filesystem=getattr(target, "filesystem", None),
            mount_path=getattr(target, "mount_path", None), path_where=where,
            extra_ports=tuple((p.traddr, str(p.trsvcid)) for p in (getattr(target, "extra_ports", None) or ())),
        )


# ----------------------------------------------------------------------------------------- state


@dataclass
class LoopbackRecord:
    """What kvgate's loopback made on a node (the node's loopback state): object id -> detail.

    Ids: ``brd`` (kvgate loaded the module), ``nullb:NAME``, ``file:PATH``, ``rdma-link:NAME``,
    ``nvmet-host:HOSTNQN``, ``nvmet-subsystem:NQN``, ``nvmet-allowed-host:NQN:HOSTNQN``,
    ``nvmet-namespace:NQN:NSID``, ``nvmet-port:ID``, ``nvmet-port-link:ID:NQN``, ``connect:NQN``,
    ``link:PATH`` (detail: the device it points to), ``filesystem:NQN:NSID`` (detail: its UUID), ``mount:PATH``
    (detail: the device mounted). ``boot_id`` is the kernel's boot the record belongs to."""

    boot_id: str | None = None
    created: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"format": STATE_FORMAT, "boot_id": self.boot_id, "created": self.created},
                          sort_keys=True, separators=(",", ":"))


def state_probe_argv() -> tuple[str, ...]:
    """The kernel's boot id, then the node's loopback state (nothing when there is none)."""
    return ("sh", "-c", 'cat /proc/sys/kernel/random/boot_id; cat -- "$1" 2>/dev/null; true',
            "kvgate-loopback-state", STATE_FILE)


def state_write_action(record: LoopbackRecord) -> "Action":
    """Write the record atomically (temporary file, then rename); the JSON is an argument, never shell text."""
    return Action("state-write", ("sh", "-c", 'mkdir -p -- "$1" && printf "%s" "$2" > "$1/state.json.tmp" && '
                                              'mv -f -- "$1/state.json.tmp" "$1/state.json"',
                                  "kvgate-loopback-state", STATE_DIR, record.to_json()),
                  "what kvgate made, so that down undoes exactly that")


def parse_record(text: str) -> LoopbackRecord:
    """Pure: the state probe's output. A record of another boot, or one that does not parse, names nothing:
    kvgate then owns nothing it did not make in this boot (down leaves it, up replaces none of it)."""
    boot, _, rest = text.partition("\n")
    boot = boot.strip() or None
    try:
        d = json.loads(rest) if rest.strip() else {}
    except (ValueError, RecursionError):
        d = {}
    if not isinstance(d, dict) or d.get("boot_id") != boot or d.get("format") != STATE_FORMAT:
        return LoopbackRecord(boot_id=boot)
    created = d.get("created")
    ok = isinstance(created, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in created.items())
    return LoopbackRecord(boot_id=boot, created=dict(created) if ok else {})


@dataclass
class LoopbackState:
    """Everything probe() saw, parsed."""

    configfs_mounted: bool = False
    nvmet: P.NvmetState = field(default_factory=P.NvmetState)
    nullb: dict[str, P.NullbDevice] = field(default_factory=dict)
    block_devices: set[str] = field(default_factory=set)
    brd_rd_size_kib: int | None = None
    file_size_bytes: int | None = None
    file_created_by_kvgate: bool = False
    subsystems: list[P.NvmeSubsystem] = field(default_factory=list)
    namespaces: list[P.NvmeNamespace] = field(default_factory=list)
    link_target: str | None = None
    link_kind: str = "missing"  # what target.path is: missing, link, file, directory or other
    rdma_links: list[RdmaLink] = field(default_factory=list)
    mounts: dict[str, tuple[str, str]] = field(default_factory=dict)  # mount point -> (source, fs type)
    record: LoopbackRecord = field(default_factory=LoopbackRecord)  # what kvgate made (the node's state)
    record_stale: bool = False  # the node's record names objects of this spec that are gone (pruned here)


def probe_commands(spec: LoopbackSpec) -> dict[str, tuple[str, ...]]:
    """The read-only commands whose outputs make up a LoopbackState (name -> argv)."""
    cmds = {
        "mounts": ("cat", "/proc/mounts"),
        "nvmet-find": ("find", P.NVMET_ROOT),
        "nvmet-attrs": ("grep", "-rs", ".", P.NVMET_ROOT),
        "block-devices": ("ls", "/sys/block"),
        "list-subsys": P.LIST_SUBSYS_ARGV,
        "list-namespaces": P.LIST_VERBOSE_ARGV,
    }
    if spec.transport == "rdma":
        cmds["rdma-links"] = RDMA_LINK_ARGV
    if spec.backing == "null_blk":
        cmds["nullb-attrs"] = ("grep", "-rs", ".", P.NULLB_ROOT)
    if spec.backing == "brd":
        cmds["brd-size"] = ("cat", "/sys/module/brd/parameters/rd_size")
    if spec.backing == "file":
        cmds["file-size"] = ("stat", "-c", "%s", spec.backing_path)
        cmds["file-marker"] = ("stat", "-c", "%s", spec.backing_path + CREATED_SUFFIX)
    if spec.link_path:
        cmds["link"] = ("readlink", spec.link_path)
        cmds["link-kind"] = ("stat", "-c", "%F", "--", spec.link_path)  # the path itself, not what it points to
    cmds["state"] = state_probe_argv()
    return cmds


def parse_state(outputs: dict[str, tuple[int | None, str]]) -> LoopbackState:
    """Pure: probe outputs (name -> (rc, stdout)) -> LoopbackState. Missing/failed reads mean absent."""
    def out(name: str) -> str:
        rc, text = outputs.get(name, (None, ""))
        return text if rc == 0 else ""

    def out_any(name: str) -> str:  # grep -rs exits 2 when some attributes are unreadable
        rc, text = outputs.get(name, (None, ""))
        return text if rc in (0, 2) else ""

    st = LoopbackState()
    st.configfs_mounted = any(line.split()[2:3] == ["configfs"] for line in out("mounts").splitlines())
    st.mounts = parse_mounts(out("mounts"))
    st.nvmet = P.parse_nvmet_configfs(out("nvmet-find"), out_any("nvmet-attrs"))
    st.nullb = P.parse_nullb_configfs(out_any("nullb-attrs"))
    st.block_devices = P.parse_block_list(out("block-devices"))
    brd = out("brd-size").strip()
    st.brd_rd_size_kib = int(brd) if brd.isdigit() else None
    fsz = out("file-size").strip()
    st.file_size_bytes = int(fsz) if fsz.isdigit() else None
    st.file_created_by_kvgate = outputs.get("file-marker", (None, ""))[0] == 0
    try:
        st.subsystems = P.parse_list_subsys(out("list-subsys"))
        st.namespaces = P.parse_list_verbose(out("list-namespaces"))
    except P.ParseError:
        raise
    link = out("link").strip()
    st.link_target = link or None
    st.link_kind = parse_link_kind(outputs.get("link-kind"), st.link_target)
    st.rdma_links = parse_rdma_links(out("rdma-links"))
    st.record = parse_record(out("state"))
    return st


def parse_link_kind(probe: tuple[int | None, str] | None, link_target: str | None) -> str:
    """Pure: ``stat -c %F`` of target.path: missing, link, file, directory or other (a device, a socket ...).
    Without the probe's output (captures from before it existed), a path readlink resolved is a link."""
    if probe is None:
        return "link" if link_target else "missing"
    rc, text = probe
    if rc != 0:
        return "missing"
    kind = text.strip()
    if kind == "symbolic link":
        return "link"
    if kind in ("regular file", "regular empty file"):
        return "file"
    return "directory" if kind == "directory" else "other"


def parse_mounts(text: str) -> dict[str, tuple[str, str]]:
    """Pure: /proc/mounts -> mount point -> (source, fs type); the last mount on a point wins (octal escapes
    such as ``\\040`` for a blank are decoded)."""
    out: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 3:
            unesc = lambda x: re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), x)  # noqa: E731
            out[unesc(f[1])] = (unesc(f[0]), f[2])
    return out


def mounted_filesystem(spec: LoopbackSpec, st: LoopbackState) -> tuple[str, str] | None:
    """(source, fs type) mounted at the spec's mount_path now, if anything is."""
    return st.mounts.get(spec.mount_path) if spec.mount_path else None


def backing_device(spec: LoopbackSpec, st: LoopbackState) -> str | None:
    """The path the namespace should serve, if the backing store exists now."""
    if spec.backing == "null_blk":
        nb = st.nullb.get(spec.nullb_name)
        if nb is None or not nb.powered:
            return None
        if spec.nullb_name in st.block_devices:  # 6.x names the disk after the configfs item
            return f"/dev/{spec.nullb_name}"
        if nb.index is not None and f"nullb{nb.index}" in st.block_devices:
            return f"/dev/nullb{nb.index}"
        return None
    if spec.backing == "brd":
        return "/dev/ram0" if "ram0" in st.block_devices else None
    if spec.backing == "file":
        return spec.backing_path if st.file_size_bytes is not None else None
    return spec.backing_path


def nvme_device(spec: LoopbackSpec, st: LoopbackState) -> str | None:
    return P.find_namespace_device(st.subsystems, st.namespaces, spec.nqn, spec.nsid)


def rdma_link(spec: LoopbackSpec, st: LoopbackState) -> RdmaLink | None:
    """The RDMA device on the spec's NIC (kvgate's or one that was there), if any."""
    return next((link for link in st.rdma_links if link.netdev == spec.soft_roce_netdev), None)


def summarize(spec: LoopbackSpec, st: LoopbackState) -> dict[str, Any]:
    """Status as data: each layer present or not, and the overall state up / down / partial."""
    sub = st.nvmet.subsystems.get(spec.nqn)
    ns = sub.namespaces.get(spec.nsid) if sub else None
    ports = [st.nvmet.ports.get(pid) for pid, _, _ in spec.ports]
    conn = P.find_subsystem(st.subsystems, spec.nqn)
    layers = {
        "backing": backing_device(spec, st) is not None if spec.backing != "block" else True,
        **({"rdma_link": rdma_link(spec, st) is not None} if spec.transport == "rdma" else {}),
        "host": spec.host_nqn in st.nvmet.hosts,
        "subsystem": sub is not None,
        "allowed_host": bool(sub and spec.host_nqn in sub.allowed_hosts),
        "namespace_enabled": bool(ns and ns.enabled),
        "port": all(port is not None for port in ports),
        "port_link": all(port is not None and spec.nqn in port.subsystems for port in ports),
    }
    if spec.connect_host:
        layers.update(connected=bool(conn and conn.live), device=nvme_device(spec, st) is not None)
        if spec.link_path:
            layers["link"] = st.link_target is not None
    # A block device, or a file kvgate did not create, belongs to the user: not ours to count or remove.
    foreign_backing = spec.backing == "block" or (spec.backing == "file" and not st.file_created_by_kvgate)
    # an RDMA device on the NIC that kvgate did not add is the node's: present or not, not ours to count
    foreign_rdma = spec.transport == "rdma" and (rdma_link(spec, st) is not None and
                                                  rdma_link(spec, st).device != spec.rdma_link_name)
    owned = {k: v for k, v in layers.items() if not (k == "backing" and foreign_backing)
             and not (k == "rdma_link" and foreign_rdma)}
    if all(owned.values()):
        overall = "up"
    elif not any(owned.values()):
        overall = "down"
    else:
        overall = "partial"
    return {
        "target": spec.name, "nqn": spec.nqn, "state": overall, "layers": layers,
        "device": nvme_device(spec, st), "backing_device": backing_device(spec, st),
        "address": f"{spec.transport}://{spec.traddr}:{spec.trsvcid}",
        "multipath_paths": sorted({p for ns_ in st.namespaces if ns_.nqn == spec.nqn for p in ns_.paths}),
        "link_path": spec.link_path,
        "owned_layers": sorted(owned),
        "host_side": "connected by this loopback" if spec.connect_host else
        "left to the node's kind: nvmeof target with this NQN",
        "rdma_device": (lambda link: f"{link.device} port {link.port} on {link.netdev} ({link.state})"
                        if link else None)(rdma_link(spec, st)) if spec.transport == "rdma" else None,
        "filesystem": None if not spec.filesystem else {
            "type": spec.filesystem, "mount_path": spec.mount_path,
            "mounted": (lambda m: {"source": m[0], "type": m[1]} if m else None)(mounted_filesystem(spec, st))},
    }


# ------------------------------------------------------------------------------------------ plans


@dataclass(frozen=True)
class Action:
    """One provisioning command: a step name, its argv, and why it is needed; ``creates`` the record id of the
    object it makes (with ``detail``), ``removes`` the ids of those it undoes (LoopbackRecord)."""

    name: str
    argv: tuple[str, ...]
    why: str = ""
    creates: str | None = None
    detail: str = ""
    removes: tuple[str, ...] = ()


def record_ids(spec: LoopbackSpec) -> dict[str, Callable[[LoopbackState], bool]]:
    """The record ids a spec's objects have, each with whether the object is there now (in a probed state)."""
    nv = lambda st: st.nvmet  # noqa: E731
    sub = lambda st: nv(st).subsystems.get(spec.nqn)  # noqa: E731
    ids: dict[str, Callable[[LoopbackState], bool]] = {
        f"nvmet-host:{spec.host_nqn}": lambda st: spec.host_nqn in nv(st).hosts,
        f"nvmet-subsystem:{spec.nqn}": lambda st: sub(st) is not None,
        f"nvmet-allowed-host:{spec.nqn}:{spec.host_nqn}":
            lambda st: bool(sub(st) and spec.host_nqn in sub(st).allowed_hosts),
        f"nvmet-namespace:{spec.nqn}:{spec.nsid}": lambda st: bool(sub(st) and spec.nsid in sub(st).namespaces),
        f"connect:{spec.nqn}": lambda st: P.find_subsystem(st.subsystems, spec.nqn) is not None,
    }
    for pid, _, _ in spec.ports:
        ids[f"nvmet-port:{pid}"] = lambda st, pid=pid: pid in nv(st).ports
        ids[f"nvmet-port-link:{pid}:{spec.nqn}"] = \
            lambda st, pid=pid: bool(nv(st).ports.get(pid) and spec.nqn in nv(st).ports[pid].subsystems)
    if spec.backing == "null_blk":
        ids[f"nullb:{spec.nullb_name}"] = lambda st: spec.nullb_name in st.nullb
    if spec.backing == "brd":
        ids["brd"] = lambda st: st.brd_rd_size_kib is not None
    if spec.backing == "file":
        ids[f"file:{spec.backing_path}"] = lambda st: st.file_size_bytes is not None
    if spec.transport == "rdma":
        ids[f"rdma-link:{spec.rdma_link_name}"] = lambda st: any(
            link.device == spec.rdma_link_name for link in st.rdma_links)
    if spec.link_path:
        ids[f"link:{spec.link_path}"] = lambda st: st.link_kind == "link"
    if spec.mount_path:
        ids[f"mount:{spec.mount_path}"] = lambda st: mounted_filesystem(spec, st) is not None
    return ids


def pruned(spec: LoopbackSpec, st: LoopbackState) -> LoopbackRecord:
    """Pure: the record without this spec's objects that are gone (removed by hand, say): a later object of the
    same name, made by someone else, is then not taken for kvgate's."""
    gone = {i for i, there in record_ids(spec).items() if i in st.record.created and not there(st)}
    return LoopbackRecord(st.record.boot_id, {k: v for k, v in st.record.created.items() if k not in gone})


def _made(st: LoopbackState, rid: str) -> bool:
    return rid in st.record.created


def write_attr(name: str, path: str, value: str, why: str = "") -> Action:
    """Write ``value`` to a configfs/sysfs attribute. The value is a positional parameter, never parsed."""
    return Action(name, ("sh", "-c", 'printf "%s" "$1" > "$2"', "kvgate-write", value, path), why)


def plan_backing(spec: LoopbackSpec, st: LoopbackState) -> list[Action]:
    """Modules, configfs mount and the backing store."""
    acts: list[Action] = []
    for mod in TARGET_MODULES[spec.transport]:
        acts.append(Action(f"modprobe-{mod}", ("modprobe", mod),
                           f"kernel NVMe/{spec.transport.upper()} target and initiator"))
    if not st.configfs_mounted:
        acts.append(Action("mount-configfs", ("mount", "-t", "configfs", "none", "/sys/kernel/config")))
    if spec.transport == "rdma" and rdma_link(spec, st) is None:
        acts.append(Action("rdma-link-add", ("rdma", "link", "add", spec.rdma_link_name, "type", "rxe", "netdev",
                                             spec.soft_roce_netdev),
                           f"soft-RoCE on {spec.soft_roce_netdev}: the nvmet RDMA port listens on its address",
                           creates=f"rdma-link:{spec.rdma_link_name}"))
    if spec.backing == "null_blk":
        acts.append(Action("modprobe-null_blk", ("modprobe", "null_blk", "nr_devices=0"),
                           "no default nullb0; devices are made in configfs"))
        nb = st.nullb.get(spec.nullb_name)
        d = f"{P.NULLB_ROOT}/{spec.nullb_name}"
        if nb is None:
            acts.append(Action("nullb-mkdir", ("mkdir", d), creates=f"nullb:{spec.nullb_name}"))
        if nb is None or not nb.powered:
            acts += [
                write_attr("nullb-size", f"{d}/size", str(spec.size_bytes // (1024 * 1024)), "MiB"),
                write_attr("nullb-memory_backed", f"{d}/memory_backed", "1", "reads return what was written"),
                write_attr("nullb-blocksize", f"{d}/blocksize", "4096"),
                write_attr("nullb-power", f"{d}/power", "1"),
            ]
    elif spec.backing == "brd":
        if "ram0" not in st.block_devices and st.brd_rd_size_kib is None:
            acts.append(Action("modprobe-brd", ("modprobe", "brd", "rd_nr=1",
                                                f"rd_size={spec.size_bytes // 1024}", "max_part=0"),
                               "no brd loaded: kvgate loads it (and down unloads it)", creates="brd"))
    elif spec.backing == "file":
        if st.file_size_bytes is None:
            acts.append(Action("file-mkdir", ("mkdir", "-p", posixpath.dirname(spec.backing_path) or "/")))
            acts.append(Action("file-create", ("truncate", "-s", str(spec.size_bytes), spec.backing_path),
                               creates=f"file:{spec.backing_path}"))
            acts.append(Action("file-mark-created", ("touch", spec.backing_path + CREATED_SUFFIX),
                               "down deletes only files kvgate created"))
    return acts


def plan_target(spec: LoopbackSpec, st: LoopbackState) -> list[Action]:
    """configfs objects (host, subsystem, namespace, port, links) and the initiator's connect."""
    dev = backing_device(spec, st)
    if dev is None:
        raise LoopbackError(f"target {spec.name}: backing {spec.backing} device not present after setup")
    if spec.backing == "brd" and st.brd_rd_size_kib is not None and st.brd_rd_size_kib * 1024 < spec.size_bytes:
        raise LoopbackError(f"target {spec.name}: brd is loaded with rd_size={st.brd_rd_size_kib} KiB, smaller "
                            f"than {spec.size_bytes} bytes; run 'rmmod brd' or lower size")
    acts: list[Action] = []
    nv = st.nvmet
    if spec.host_nqn not in nv.hosts:
        acts.append(Action("host-mkdir", ("mkdir", spec.host_dir), creates=f"nvmet-host:{spec.host_nqn}"))
    sub = nv.subsystems.get(spec.nqn)
    if sub is None:
        acts.append(Action("subsys-mkdir", ("mkdir", spec.subsys_dir), creates=f"nvmet-subsystem:{spec.nqn}"))
    if sub is None or sub.allow_any_host is not False:
        acts.append(write_attr("subsys-allow_any_host", f"{spec.subsys_dir}/attr_allow_any_host", "0",
                               "only the named host may connect"))
    if sub is None or spec.host_nqn not in sub.allowed_hosts:
        acts.append(Action("subsys-allow-host",
                           ("ln", "-s", spec.host_dir, f"{spec.subsys_dir}/allowed_hosts/{spec.host_nqn}"),
                           creates=f"nvmet-allowed-host:{spec.nqn}:{spec.host_nqn}"))
    ns = sub.namespaces.get(spec.nsid) if sub else None
    if ns is None:
        acts.append(Action("ns-mkdir", ("mkdir", spec.ns_dir), creates=f"nvmet-namespace:{spec.nqn}:{spec.nsid}"))
    if ns is not None and ns.enabled:
        if ns.device_path != dev:
            raise LoopbackError(f"target {spec.name}: namespace {spec.nsid} of {spec.nqn} already serves "
                                f"{ns.device_path}, expected {dev}; run 'kvgate loopback down' first")
    else:
        if ns is None or ns.device_path != dev:
            acts.append(write_attr("ns-device_path", f"{spec.ns_dir}/device_path", dev))
        if spec.backing == "file":
            acts.append(write_attr("ns-buffered_io", f"{spec.ns_dir}/buffered_io", "1",
                                   "file backing: page cache, works on filesystems without O_DIRECT"))
        acts.append(write_attr("ns-enable", f"{spec.ns_dir}/enable", "1"))
    for i, (pid, traddr, trsvcid) in enumerate(spec.ports):
        acts += _plan_port(spec, nv, pid, traddr, trsvcid, "port" if i == 0 else f"port{pid}")
    conn = P.find_subsystem(st.subsystems, spec.nqn)
    if conn is None and spec.connect_host:
        acts.append(Action("nvme-connect", (
            "nvme", "connect", "-t", spec.transport, "-a", spec.traddr, "-s", spec.trsvcid, "-n", spec.nqn,
            "--hostnqn", spec.host_nqn, "--hostid", spec.host_id), creates=f"connect:{spec.nqn}"))
    return acts


def _plan_port(spec: LoopbackSpec, nv: P.NvmetState, pid: str, traddr: str, trsvcid: str, step: str
               ) -> list[Action]:
    """One nvmet port of the namespace: made (or its address set), and the subsystem linked to it."""
    acts: list[Action] = []
    port = nv.ports.get(pid)
    port_dir = spec.port_dir_of(pid)
    want = {"trtype": spec.transport, "adrfam": "ipv6" if ":" in traddr else "ipv4",
            "traddr": traddr, "trsvcid": trsvcid}
    if port is None:
        acts.append(Action(f"{step}-mkdir", ("mkdir", port_dir), creates=f"nvmet-port:{pid}"))
    if port is None or any(getattr(port, k) != v for k, v in want.items()):
        if port is not None and port.subsystems - {spec.nqn}:
            raise LoopbackError(f"target {spec.name}: nvmet port {pid} serves "
                                f"{port.trtype}://{port.traddr}:{port.trsvcid} for other subsystems; "
                                "choose another trsvcid")
        if port is not None and spec.nqn in port.subsystems:
            acts.append(Action(f"{step}-unlink-stale", ("rm", f"{port_dir}/subsystems/{spec.nqn}")))
            port = None
        for key in ("trtype", "adrfam", "traddr", "trsvcid"):
            acts.append(write_attr(f"{step}-{key}", f"{port_dir}/addr_{key}", want[key]))
    if port is None or spec.nqn not in port.subsystems:
        acts.append(Action(f"{step}-link", ("ln", "-s", spec.subsys_dir, f"{port_dir}/subsystems/{spec.nqn}"),
                           creates=f"nvmet-port-link:{pid}:{spec.nqn}"))
    return acts


def link_refusal(spec: LoopbackSpec, st: LoopbackState) -> str | None:
    """Pure: why ``up`` may not put its link at target.path, or None. kvgate replaces only its own link (one it
    recorded, pointing where it recorded); a regular file, a directory, anything else, or a link kvgate did not
    make is refused, with the inventory line of ``path``. A link that already points to the device needs no
    write and is left as it is."""
    if not spec.link_path or not spec.connect_host or st.link_kind == "missing":
        return None
    dev = nvme_device(spec, st)
    if st.link_kind == "link":
        mine = st.record.created.get(f"link:{spec.link_path}")
        if (mine is not None and st.link_target == mine) or (dev is not None and st.link_target == dev):
            return None
        what = f"a link to {st.link_target}"
    else:
        what = {"file": "a regular file", "directory": "a directory"}.get(st.link_kind, "something other than a link")
    where = spec.path_where or f"target {spec.name}: path"
    return (f"{where}: {spec.link_path} holds {what} that kvgate did not make; kvgate replaces only its own link "
            "(remove it, or name another path)")


def plan_link(spec: LoopbackSpec, st: LoopbackState) -> list[Action]:
    """The stable symlink (target.path) to the /dev/nvmeXnY the kernel picked: made where nothing is, or
    kvgate's own link re-pointed; anything else raises LoopbackError (link_refusal)."""
    dev = nvme_device(spec, st)
    if not spec.link_path or dev is None or (st.link_kind == "link" and st.link_target == dev):
        return []
    why = link_refusal(spec, st)
    if why:
        raise LoopbackError(why)
    rid = f"link:{spec.link_path}"
    if st.link_kind == "missing":
        # ln -s without -f: a path that appeared since the probe is not replaced
        return [Action("link-mkdir", ("mkdir", "-p", posixpath.dirname(spec.link_path))),
                Action("link-device", ("ln", "-s", dev, spec.link_path), "nothing at path", creates=rid, detail=dev)]
    return [Action("link-device", ("ln", "-sfn", dev, spec.link_path),
                   f"kvgate's own link (to {st.link_target}) re-pointed", creates=rid, detail=dev)]


def _plan_down_ports(spec: LoopbackSpec, st: LoopbackState, ours: bool) -> list[Action]:
    """Pure: plan_down's port steps: the subsystem unlinked from every port, then kvgate's own ports removed."""
    acts: list[Action] = []
    nv = st.nvmet
    for pid, port in sorted(nv.ports.items()):
        link_id = f"nvmet-port-link:{pid}:{spec.nqn}"
        if spec.nqn in port.subsystems and (ours or _made(st, link_id)):
            acts.append(Action(f"port{pid}-unlink", ("rm", f"{P.NVMET_ROOT}/ports/{pid}/subsystems/{spec.nqn}"),
                               removes=(link_id,)))
    for i, (pid, traddr, _) in enumerate(spec.ports):
        port = nv.ports.get(pid)
        port_id = f"nvmet-port:{pid}"
        if port is not None and _made(st, port_id) and not (port.subsystems - {spec.nqn}) and \
                port.traddr in (traddr, None):
            acts.append(Action("port-rmdir" if i == 0 else f"port{pid}-rmdir", ("rmdir", spec.port_dir_of(pid)),
                               removes=(port_id,)))
    return acts


def _plan_down_subsystem(spec: LoopbackSpec, st: LoopbackState, ours: bool) -> list[Action]:
    """Pure: plan_down's subsystem steps: its namespaces (disabled, removed), its allowed hosts, then itself."""
    acts: list[Action] = []
    sub = st.nvmet.subsystems.get(spec.nqn)
    if sub is None:
        return acts
    for nsid, ns in sorted(sub.namespaces.items()):
        ns_id = f"nvmet-namespace:{spec.nqn}:{nsid}"
        if not (ours or _made(st, ns_id)):
            continue
        d = f"{spec.subsys_dir}/namespaces/{nsid}"
        if ns.enabled is not False:
            acts.append(write_attr(f"ns{nsid}-disable", f"{d}/enable", "0"))
        acts.append(Action(f"ns{nsid}-rmdir", ("rmdir", d), removes=(ns_id,)))
    for host in sorted(sub.allowed_hosts):
        ah_id = f"nvmet-allowed-host:{spec.nqn}:{host}"
        if ours or _made(st, ah_id):
            acts.append(Action("subsys-disallow-host", ("rm", f"{spec.subsys_dir}/allowed_hosts/{host}"),
                               removes=(ah_id,)))
    if ours:
        acts.append(Action("subsys-rmdir", ("rmdir", spec.subsys_dir), removes=(f"nvmet-subsystem:{spec.nqn}",)))
    return acts


def _plan_down_backing(spec: LoopbackSpec, st: LoopbackState) -> list[Action]:
    """Pure: plan_down's last steps: the backing store kvgate made (null_blk, file, brd), then its soft-RoCE device."""
    acts: list[Action] = []
    nb_id = f"nullb:{spec.nullb_name}"
    if spec.backing == "null_blk" and spec.nullb_name in st.nullb and _made(st, nb_id):
        d = f"{P.NULLB_ROOT}/{spec.nullb_name}"
        if st.nullb[spec.nullb_name].powered:
            acts.append(write_attr("nullb-power-off", f"{d}/power", "0"))
        acts.append(Action("nullb-rmdir", ("rmdir", d), removes=(nb_id,)))
    file_id = f"file:{spec.backing_path}"
    if spec.backing == "file" and st.file_created_by_kvgate and _made(st, file_id):
        acts.append(Action("file-remove", ("rm", "-f", spec.backing_path, spec.backing_path + CREATED_SUFFIX),
                           removes=(file_id,)))
    if spec.backing == "brd" and "ram0" in st.block_devices and _made(st, "brd"):
        acts.append(Action("rmmod-brd", ("rmmod", "brd"), "the RAM disk kvgate loaded, and its memory",
                           removes=("brd",)))
    link = rdma_link(spec, st) if spec.transport == "rdma" else None
    # the RDMA device goes with the last RDMA port: none other, and this one removed above (no other subsystem)
    mine = {pid for pid, _, _ in spec.ports}
    other_rdma_ports = [pid for pid, p in st.nvmet.ports.items() if p.trtype == "rdma" and
                        (pid not in mine or p.subsystems - {spec.nqn})]
    rdma_id = f"rdma-link:{spec.rdma_link_name}"
    if link is not None and link.device == spec.rdma_link_name and _made(st, rdma_id) and not other_rdma_ports:
        acts.append(Action("rdma-link-delete", ("rdma", "link", "delete", link.device),
                           "the soft-RoCE device kvgate added (no other RDMA port needs it)", removes=(rdma_id,)))
    return acts


def plan_down(spec: LoopbackSpec, st: LoopbackState) -> list[Action]:
    """Reverse order of up, only for what kvgate made (its record, LoopbackRecord) and what exists: unmount,
    link, disconnect, port, namespace, subsystem, host, backing. What was there before ``up`` (a brd RAM disk,
    configfs items, a link, a mount) is left alone; a kvgate subsystem takes its namespaces, allowed hosts,
    port links and connected host with it."""
    acts: list[Action] = []
    made = lambda rid: _made(st, rid)  # noqa: E731
    m = mounted_filesystem(spec, st)
    rid = f"mount:{spec.mount_path}"
    if m is not None and made(rid) and st.record.created[rid] == m[0]:
        acts.append(Action("umount", ("umount", spec.mount_path), "the filesystem kvgate mounted on the namespace",
                           removes=(rid,)))
    rid = f"link:{spec.link_path}"
    if spec.link_path and st.link_kind == "link" and made(rid) and st.link_target == st.record.created[rid]:
        acts.append(Action("link-remove", ("rm", "-f", spec.link_path), removes=(rid,)))
    ours = made(f"nvmet-subsystem:{spec.nqn}")
    if P.find_subsystem(st.subsystems, spec.nqn) is not None and (ours or made(f"connect:{spec.nqn}")):
        acts.append(Action("nvme-disconnect", ("nvme", "disconnect", "-n", spec.nqn), removes=(f"connect:{spec.nqn}",)))
    acts += _plan_down_ports(spec, st, ours)
    acts += _plan_down_subsystem(spec, st, ours)
    nv = st.nvmet
    others = [s for n, s in nv.subsystems.items() if n != spec.nqn and spec.host_nqn in s.allowed_hosts]
    host_id = f"nvmet-host:{spec.host_nqn}"
    if spec.host_nqn in nv.hosts and made(host_id) and not others:
        acts.append(Action("host-rmdir", ("rmdir", spec.host_dir), removes=(host_id,)))
    acts += _plan_down_backing(spec, st)
    return acts


# ------------------------------------------------------------------------------------------ driver


@dataclass(frozen=True)
class ActionRecord:
    name: str
    argv: tuple[str, ...]
    rc: int | None
    ok: bool
    stderr: str

    @classmethod
    def of(cls, action: Action, res: Any) -> "ActionRecord":
        return cls(action.name, action.argv, res.rc, res.ok, (res.stderr or res.error or "").strip()[-500:])


@dataclass
class LoopbackResult:
    """What up/down did: the actions with their outcomes, and the state after."""

    summary: dict[str, Any]
    actions: list[ActionRecord] = field(default_factory=list)
    integrity: Any = None  # the check ``up(verify=...)`` ran: ok, checks, mismatched_bytes, as_dict()
    error: str | None = None
    write_guard: WriteDecision | None = None  # the decision before a filesystem was made on the namespace
    refused: bool = False  # the error is a refusal of what the inventory asks (bad input), nothing was done
    left_alone: list[str] = field(default_factory=list)  # down: objects there that kvgate did not make

    @property
    def ok(self) -> bool:
        return self.error is None and all(a.ok for a in self.actions) and (
            self.integrity is None or self.integrity.ok)

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "error": self.error, "refused": self.refused, "summary": self.summary,
                "actions": [dict(a.__dict__, argv=list(a.argv)) for a in self.actions],
                "integrity": self.integrity.as_dict() if self.integrity else None,
                "write_guard": self.write_guard.as_dict() if self.write_guard else None,
                "left_alone": list(self.left_alone)}


def _failed(records: list[ActionRecord]) -> ActionRecord:
    """The action that failed last (the state write that follows a failure is not it, unless it failed)."""
    return next((r for r in reversed(records) if not r.ok), records[-1])


# Probes whose command prints something whenever it exits 0 (cat, find, grep with a match, readlink, stat, nvme-cli
# and rdma JSON, the state probe's boot id): an empty answer with exit 0 is output lost on the way, not "absent".
_MAY_BE_EMPTY = frozenset({"block-devices"})
PROBE_ATTEMPTS = 3


def _integrity_error(integrity: Any) -> str:
    """Pure: the error of a failed data-integrity check: each direction's error, else how many bytes differ."""
    errs = [f"{c.direction}: {c.error}" for c in integrity.checks if c.error]
    return "data integrity check failed: " + (
        "; ".join(errs) if errs else f"{integrity.mismatched_bytes} bytes differ")


class Loopback:
    """Drives one loopback target on one node through a Transport.

    ``run`` defaults to ``transport.run``; pass a step-logging runner to keep every command on disk.
    """

    def __init__(self, transport: Any, spec: LoopbackSpec, run: Runner | None = None,
                 progress: Callable[[str], None] = lambda msg: None, clock=time.monotonic, sleep=time.sleep):
        self.transport = transport
        self.spec = spec
        self.run = run or (lambda name, argv, timeout_s: transport.run(list(argv), timeout_s=timeout_s))
        self.progress = progress
        self.clock = clock
        self.sleep = sleep

    # -- reading
    def probe(self) -> LoopbackState:
        outputs = {}
        for name, argv in probe_commands(self.spec).items():
            for _ in range(PROBE_ATTEMPTS):
                res = self.run(f"probe-{name}", argv, 120)
                if res.timed_out or res.error:
                    # Not "absent": a probe that did not answer (a loaded node) must not become a plan.
                    raise LoopbackError(f"probe {name} did not answer: {res.summary()}")
                if res.rc != 0 or name in _MAY_BE_EMPTY or res.stdout.strip():
                    break
            else:  # exit 0 and nothing printed, every time: the answer was lost, it does not mean "absent"
                raise LoopbackError(f"probe {name} exited 0 with no output {PROBE_ATTEMPTS} times (output lost on "
                                    "the way?); nothing was planned from it")
            outputs[name] = (res.rc, res.stdout)
        st = parse_state(outputs)
        on_node = st.record
        st.record = pruned(self.spec, st)
        st.record_stale = st.record.created != on_node.created
        return st

    def status(self) -> dict[str, Any]:
        return summarize(self.spec, self.probe())

    def device(self) -> str | None:
        return nvme_device(self.spec, self.probe())

    # -- writing
    def _execute(self, actions: list[Action], records: list[ActionRecord], stop_on_error: bool,
                 st: LoopbackState | None = None) -> bool:
        """Run the actions in order; with ``st`` (the state they were planned from), what they made or undid is
        written to the node's loopback state after them, whatever failed."""
        ok = True
        record = LoopbackRecord(st.record.boot_id, dict(st.record.created)) if st is not None else None
        changed = bool(st is not None and st.record_stale and actions)
        try:
            for act in actions:
                res = self.run(act.name, act.argv, 120)
                rec = ActionRecord.of(act, res)
                records.append(rec)
                if rec.ok and record is not None and (act.creates or act.removes):
                    if act.creates:
                        record.created[act.creates] = act.detail
                    for rid in act.removes:
                        record.created.pop(rid, None)
                    changed = True
                if not rec.ok:
                    ok = False
                    self.progress(f"{act.name} failed (rc={rec.rc}): {rec.stderr}")
                    if stop_on_error:
                        return False
            return ok
        finally:
            if changed:
                st.record, st.record_stale = record, False  # later actions planned from st see what these made
                self._save(record, records)

    def _save(self, record: LoopbackRecord, records: list[ActionRecord]) -> None:
        act = state_write_action(record)
        res = self.run(act.name, act.argv, 60)
        records.append(ActionRecord.of(act, res))
        if not res.ok:
            self.progress(f"could not write the loopback state {STATE_FILE}: {res.summary()}")

    def up(self, verify: Callable[["Loopback", LoopbackState], Any] | None = None,
           wait_s: float = 30.0) -> LoopbackResult:
        """Provision (idempotent), wait for the namespace device, and, given ``verify`` (the data-integrity check,
        ``harness.workloads.kit.integrity.loopback_integrity``), check the data on a blank namespace."""
        records: list[ActionRecord] = []
        st = self.probe()
        refusal = link_refusal(self.spec, st)
        if refusal:  # before anything is done: what sits at target.path is not kvgate's
            return LoopbackResult(summarize(self.spec, st), records, error=refusal, refused=True)
        try:
            if not self._execute(plan_backing(self.spec, st), records, stop_on_error=True, st=st):
                return LoopbackResult(summarize(self.spec, self.probe()), records,
                                      error=f"backing setup failed at {_failed(records).name}: {_failed(records).stderr}")
            st = self.probe()
            # a RAM-backed device the kernel was just asked for: wait for it rather than race it (seen once
            # under a loaded TCG guest: the null_blk device was not listed by the probe right after power=1)
            deadline = self.clock() + wait_s
            while (self.spec.backing in ("null_blk", "brd") and backing_device(self.spec, st) is None
                   and self.clock() < deadline):
                self.sleep(0.5)
                st = self.probe()
            if not self._execute(plan_target(self.spec, st), records, stop_on_error=True, st=st):
                return LoopbackResult(summarize(self.spec, self.probe()), records,
                                      error=f"target setup failed at {_failed(records).name}: {_failed(records).stderr}")
        except LoopbackError as exc:
            return LoopbackResult(summarize(self.spec, self.probe()), records, error=str(exc))
        deadline = self.clock() + wait_s
        st = self.probe()
        while self.spec.connect_host and nvme_device(self.spec, st) is None and self.clock() < deadline:
            self.sleep(0.5)
            st = self.probe()
        dev = nvme_device(self.spec, st)
        if dev is None and self.spec.connect_host:
            return LoopbackResult(summarize(self.spec, st), records,
                                  error=f"no /dev/nvme*n{self.spec.nsid} for {self.spec.nqn} after {wait_s:.0f} s")
        if self.spec.connect_host:
            try:
                self._execute(plan_link(self.spec, st), records, stop_on_error=False, st=st)
            except LoopbackError as exc:  # something appeared at target.path since the first probe
                return LoopbackResult(summarize(self.spec, st), records, error=str(exc), refused=True)
        # Every layer must be there before `up` says so: on a loaded node the controller can still be
        # connecting (or resetting) when the device node appears.
        st, summary = self._await_up(wait_s)
        result = LoopbackResult(summary, records)
        if summary["state"] != "up":
            missing = [k for k in summary["owned_layers"] if not summary["layers"][k]]
            result.error = f"{self.spec.nqn} not up after {wait_s:.0f} s: missing {', '.join(missing)}"
            return result
        if self.spec.filesystem:
            result.integrity, result.error, result.write_guard = self._filesystem(st, records, verify)
            result.summary = summarize(self.spec, self.probe())
        elif verify and self.spec.connect_host:  # target side only: the nvmeof target's gates check the data
            result.integrity = verify(self, st)
            if not result.integrity.ok:
                result.error = _integrity_error(result.integrity)
        return result

    def _await_up(self, wait_s: float) -> tuple[LoopbackState, dict[str, Any]]:
        """Probe every 0.5 s until every layer is up or ``wait_s`` has passed: the last state and its summary."""
        deadline = self.clock() + wait_s
        st = self.probe()
        summary = summarize(self.spec, st)
        while summary["state"] != "up" and self.clock() < deadline:
            self.sleep(0.5)
            st = self.probe()
            summary = summarize(self.spec, st)
        return st, summary

    def _filesystem(self, st: LoopbackState, records: list[ActionRecord],
                    verify: Callable[["Loopback", LoopbackState], Any] | None
                    ) -> tuple[Any, str | None, WriteDecision | None]:
        """The spec's filesystem on the connected namespace, mounted at its mount_path: (integrity, error, the
        write guard's decision when one was asked for).

        Mounted already: nothing to do. Holding the filesystem an earlier ``up`` made (its UUID in kvgate's record):
        mounted as it is, and the data-integrity check, which writes patterns on the device, is skipped. Blank:
        the integrity check, then the write guard on the namespace (mounted, holding a filesystem or partition
        table, or another serial than the target's: refused), then ``mke2fs -t ext4 -U <uuid>`` (the UUID
        recorded) and the mount (recorded). A filesystem kvgate did not make, of any type: an error, nothing
        written or mounted."""
        spec = self.spec
        dev = nvme_device(spec, st)
        assert dev is not None and spec.filesystem and spec.mount_path
        now = mounted_filesystem(spec, st)
        if now is not None:
            return None, (None if now[0] == dev else f"{spec.mount_path} holds {now[0]} ({now[1]}), not {dev}"), None
        res = self.run("fs-blkid", ("blkid", "-p", "-o", "export", dev), 60)
        if res.timed_out or res.error or res.rc not in (0, 2):  # 2: no signature found
            return None, f"blkid -p {dev} did not answer: {res.summary()}", None
        probe = parse_blkid_export(res.stdout) if res.rc == 0 else {}
        if res.rc == 0 and not (probe.get("TYPE") or probe.get("PTTYPE")):  # found something, said nothing
            return None, f"blkid -p {dev} found a signature but did not say which: {res.summary()}", None
        found = None if res.rc == 2 else (probe.get("TYPE") or f"partition table {probe.get('PTTYPE')}")
        fs_id = f"filesystem:{spec.nqn}:{spec.nsid}"
        integrity, decision = None, None
        if found is None:
            if verify:
                integrity = verify(self, st)
                if not integrity.ok:
                    return integrity, "data integrity check failed before mkfs", None
            decision = check_write(self.run, dev, expect="block", node=getattr(self.transport, "name", ""),
                                   purpose=f"mke2fs -t {spec.filesystem} on the namespace of loopback target "
                                           f"{spec.name}",
                                   allow_destructive=spec.allow_destructive, serial=spec.serial)
            if not decision.allowed:
                return integrity, decision.refusal(), decision
            # e2fsprogs' mke2fs by its path: a busybox shell prefers its own mke2fs applet (no -t, no ext4)
            fs_uuid = str(uuid.uuid4())  # kvgate's own filesystem is known by the UUID it gave it
            mkfs = Action("mkfs", (MKE2FS, "-q", "-F", "-t", spec.filesystem, "-L", f"kvgate-{spec.name}"[:16],
                                   "-U", fs_uuid, "-E", "lazy_itable_init=0,lazy_journal_init=0", dev),
                          f"the write guard allowed it: {decision.reason}", creates=fs_id, detail=fs_uuid)
            if not self._execute([mkfs], records, stop_on_error=True, st=st):
                return integrity, f"mke2fs on {dev} failed: {_failed(records).stderr}", decision
        elif found != spec.filesystem:
            what = f"a {found} filesystem" if probe.get("TYPE") else f"a {probe.get('PTTYPE')} partition table"
            return None, (f"{dev} holds {what}, not {spec.filesystem}: not formatted over "
                          "(kvgate loopback down, then up, starts from a blank namespace)"), None
        elif not probe.get("UUID") or st.record.created.get(fs_id) != probe.get("UUID"):
            return None, (f"{dev} holds a {found} filesystem (UUID {probe.get('UUID')}) that kvgate did not make: "
                          f"not mounted at {spec.mount_path} (kvgate loopback down, then up, starts from a blank "
                          "namespace)"), None
        acts = [Action("mount-dir", ("mkdir", "-p", spec.mount_path)),
                Action("mount", ("mount", "-t", spec.filesystem, dev, spec.mount_path), creates=f"mount:{spec.mount_path}",
                       detail=dev)]
        if not self._execute(acts, records, stop_on_error=True, st=st):
            return integrity, f"{_failed(records).name} failed: {_failed(records).stderr}", decision
        return integrity, None, decision

    def down(self) -> LoopbackResult:
        """Undo what kvgate made (its record) and what exists, in reverse order; keeps going past a failure and
        reports it. What kvgate did not make is left alone and listed (``left_alone``)."""
        records: list[ActionRecord] = []
        st = self.probe()
        self._execute(plan_down(self.spec, st), records, stop_on_error=False, st=st)
        st = self.probe()
        summary = summarize(self.spec, st)
        ids = record_ids(self.spec)
        # the host entry stays while another subsystem still allows it (two loopback targets share a host NQN)
        shared_host = any(self.spec.host_nqn in sub.allowed_hosts for nqn, sub in st.nvmet.subsystems.items()
                          if nqn != self.spec.nqn)
        leftover = sorted(i for i, there in ids.items() if _made(st, i) and there(st)
                          and not (i == f"nvmet-host:{self.spec.host_nqn}" and shared_host))
        if st.record_stale:  # recorded objects that went away without kvgate: forgotten on the node too
            self._save(st.record, records)
        left_alone = sorted(i for i, there in ids.items() if not _made(st, i) and there(st))
        err = f"left behind: {', '.join(leftover)}" if leftover else None
        return LoopbackResult(summary, records, error=err, left_alone=left_alone)


def resolve_loopback_device(transport: Any, steps: Any, target: Any, node_name: str = "node") -> str:
    """For fio-read's TARGET_RESOLVERS: /dev/nvmeXnY of a loopback target, found by NQN."""
    spec = LoopbackSpec.from_target(target, node_name)
    run = None
    if steps is not None and hasattr(steps, "run"):
        run = lambda name, argv, timeout_s: steps.run(transport, name, argv, timeout_s=timeout_s)  # noqa: E731
    dev = Loopback(transport, spec, run=run).device()
    if dev is None:
        raise LoopbackError(f"loopback target {target.name} ({target.nqn}) is not connected: "
                            "run 'kvgate loopback up' first")
    return dev
