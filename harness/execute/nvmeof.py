"""The host side of an NVMe-oF target (inventory ``kind: nvmeof``): find the namespace of a subsystem NQN on a
node and check it is the one the inventory names; with ``connect: managed``, connect it first and disconnect
it at the end.

The check (:func:`resolve`, pure) takes what the node shows (``nvme list-subsys``, ``nvme list -v``, the NVMe
sysfs attributes, and for RDMA the kernel's connection-manager IDs and RDMA links) and answers with the
``/dev/nvmeXnY`` to use or the reason not to: the subsystem NQN is not connected (naming the subsystems that
are), a controller of it runs another transport or sits at another address than the inventory's, the
controller at the declared address is not ``live``, the namespace (``nsid``, ``ns_uuid`` or ``nguid``) is not
there. Every path of the subsystem is recorded with its transport, address, state, ANA state and queue count,
with native multipath (one ``nvmeXnY`` head over hidden ``nvmeXcYnZ`` paths) and without it (one ``nvmeXnY``
per controller), and for RDMA the RDMA device and NIC each connection runs on.

``connect: managed`` (:class:`NvmeofHost`, :class:`ManagedTargets`): ``nvme discover`` at the inventory's
address (the NQN must be offered), ``nvme connect`` with its transport, address, host NQN and queue settings,
bounded by the target's ``connect_timeout_s``, then wait for the namespace. What kvgate connected is told apart
from what was there (controllers before and after), and only that is disconnected (``nvme disconnect -d
nvmeX``): at the end of the run, after a failed gate, after Ctrl-C, and at once when the connect itself fails.
A subsystem already connected at the declared address is used as it is and left connected.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import HarnessError
from ..parsers import nvme as P
from ..parsers.rdma import RDMA_CM_ID_ARGV, RDMA_LINK_ARGV, RdmaParseError, host_connection, parse_cm_ids, \
    parse_rdma_links
from .fanout import fan_out

Runner = Callable[[str, Sequence[str], float | None], Any]  # (step name, argv, timeout_s) -> CommandResult

DISCOVERY_NQN = "nqn.2014-08.org.nvmexpress.discovery"
PROBE_TIMEOUT_S = 60.0  # a hang guard: the probes read sysfs and nvme-cli's view of it
DISCONNECT_TIMEOUT_S = 120.0


class NvmeofError(HarnessError):
    """A node's NVMe-oF state could not be read."""


# ------------------------------------------------------------------------------------------ spec


@dataclass(frozen=True)
class NvmeofSpec:
    """One ``kind: nvmeof`` target: which subsystem, where, and how kvgate may connect to it."""

    name: str
    nqn: str
    transport: str
    traddr: str
    trsvcid: str = "4420"
    connect: str = "existing"
    nsid: int | None = None
    ns_uuid: str | None = None
    nguid: str | None = None
    host_nqn: str | None = None
    host_id: str | None = None
    nr_io_queues: int | None = None
    queue_size: int | None = None
    ctrl_loss_tmo_s: int | None = None
    reconnect_delay_s: int | None = None
    connect_timeout_s: float = 30.0
    discovery_trsvcid: str | None = None

    @classmethod
    def from_target(cls, target: Any) -> "NvmeofSpec":
        """From an inventory ``Target`` of kind ``nvmeof`` (validated by harness.config)."""
        if getattr(target, "kind", None) != "nvmeof":
            raise NvmeofError(f"target {target.name} has kind {target.kind!r}, expected nvmeof")
        return cls(name=target.name, nqn=target.nqn, transport=target.transport, traddr=target.traddr,
                   trsvcid=str(target.trsvcid or "4420"), connect=target.connect or "existing", nsid=target.nsid,
                   ns_uuid=target.ns_uuid, nguid=target.nguid, host_nqn=target.host_nqn, host_id=target.host_id,
                   nr_io_queues=target.nr_io_queues, queue_size=target.queue_size,
                   ctrl_loss_tmo_s=target.ctrl_loss_tmo_s,
                   reconnect_delay_s=getattr(target, "reconnect_delay_s", None), connect_timeout_s=target.connect_timeout_s,
                   discovery_trsvcid=target.discovery_trsvcid)

    @property
    def address(self) -> str:
        return f"{self.transport} traddr={self.traddr},trsvcid={self.trsvcid}"

    def discover_argv(self) -> tuple[str, ...]:
        argv = ["nvme", "discover", "-t", self.transport, "-a", self.traddr,
                "-s", self.discovery_trsvcid or self.trsvcid]
        if self.host_nqn:
            argv += ["--hostnqn", self.host_nqn]
        if self.host_id:
            argv += ["--hostid", self.host_id]
        return tuple(argv + ["-o", "json"])

    def connect_argv(self) -> tuple[str, ...]:
        argv = ["nvme", "connect", "-t", self.transport, "-a", self.traddr, "-s", self.trsvcid, "-n", self.nqn]
        if self.host_nqn:
            argv += ["--hostnqn", self.host_nqn]
        if self.host_id:
            argv += ["--hostid", self.host_id]
        for flag, value in (("--nr-io-queues", self.nr_io_queues), ("--queue-size", self.queue_size),
                            ("--ctrl-loss-tmo", self.ctrl_loss_tmo_s),
                            ("--reconnect-delay", self.reconnect_delay_s)):
            if value is not None:
                argv += [flag, str(value)]
        return tuple(argv + ["-o", "json"])


def disconnect_argv(controller: str) -> tuple[str, ...]:
    """Disconnect one controller (not ``-n NQN``, which would take every path of the subsystem)."""
    return ("nvme", "disconnect", "-d", controller)


def probe_commands(spec: NvmeofSpec) -> dict[str, tuple[str, ...]]:
    """The read-only commands whose outputs :func:`resolve` reads (name -> argv)."""
    cmds = {"list-subsys": P.LIST_SUBSYS_ARGV, "list-verbose": P.LIST_VERBOSE_ARGV, "sysfs": P.NVME_SYSFS_ARGV}
    if spec.transport == "rdma":
        cmds.update({"rdma-cm-ids": RDMA_CM_ID_ARGV, "rdma-links": RDMA_LINK_ARGV})
    return cmds


# ----------------------------------------------------------------------------------------- state


@dataclass
class HostState:
    """What the probes saw, parsed; ``raw`` keeps each probe's (rc, stdout)."""

    subsystems: list[P.NvmeSubsystem] = field(default_factory=list)
    namespaces: list[P.NvmeNamespace] = field(default_factory=list)
    sysfs: P.NvmeSysfs = field(default_factory=lambda: P.NvmeSysfs({}, {}))
    cm_ids: list = field(default_factory=list)
    links: list = field(default_factory=list)
    raw: dict[str, tuple[int | None, str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def controllers_of(self, nqns: set[str]) -> set[str]:
        """Controllers (nvmeX) the kernel has for these subsystem NQNs, by sysfs and nvme-cli."""
        out = {c for c, a in self.sysfs.controllers.items() if a.get("subsysnqn") in nqns}
        out |= {p.controller for s in self.subsystems if s.nqn in nqns for p in s.paths if p.controller}
        return out


def parse_host_state(outputs: dict[str, tuple[int | None, str]]) -> HostState:
    """Pure: probe outputs (name -> (rc, stdout)) -> HostState.

    nvme-cli 2.3 exits 1 and prints nothing when the host has no NVMe device: that is no subsystem. The RDMA
    probes are informative: a missing ``rdma`` tool leaves a note, not an error."""
    st = HostState(raw=dict(outputs))

    def out(name: str) -> str:
        rc, text = outputs.get(name, (None, ""))
        return text if rc == 0 else ""

    st.subsystems = P.parse_list_subsys(out("list-subsys"))
    st.namespaces = P.parse_list_verbose(out("list-verbose"))
    st.sysfs = P.parse_nvme_sysfs(out("sysfs"))
    for name, parse, attr in (("rdma-cm-ids", parse_cm_ids, "cm_ids"), ("rdma-links", parse_rdma_links, "links")):
        if name not in outputs:
            continue
        rc, text = outputs[name]
        if rc != 0:
            st.notes.append(f"{name}: exit {rc}" + (" (the rdma tool is not installed)" if rc == 127 else ""))
            continue
        try:
            setattr(st, attr, parse(text))
        except RdmaParseError as exc:
            st.notes.append(str(exc))
    return st


# ------------------------------------------------------------------------------------ resolution


@dataclass(frozen=True)
class PathRecord:
    """One controller path of the subsystem, as found."""

    controller: str
    transport: str
    address: str
    state: str
    ana_state: str | None
    queue_count: int | None
    declared: bool  # the inventory's transport and address
    device: str | None = None  # the path's own block device: nvmeXcYnZ (native multipath) or nvmeXnY


@dataclass(frozen=True)
class Resolution:
    """The namespace device of a target, or why there is none; everything the check rests on."""

    target: str
    nqn: str
    expected: str
    ok: bool
    error: str | None = None
    device: str | None = None
    multipath: str | None = None  # "native" (head over hidden paths) or "per-path" (one device per controller)
    nsid: int | None = None
    ns_uuid: str | None = None
    serial: str | None = None
    size_bytes: int | None = None
    host_nqn: str | None = None
    paths: tuple[PathRecord, ...] = ()
    rdma: tuple[dict, ...] = ()  # per declared RDMA path: device, port, netdev, queues (cm_ids)
    subsystems_seen: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def transport(self) -> str | None:
        live = [p for p in self.paths if p.declared and p.state == "live"]
        return live[0].transport if live else None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["paths"] = [asdict(p) for p in self.paths]
        d["rdma"] = list(self.rdma)
        d["subsystems_seen"] = list(self.subsystems_seen)
        d["notes"] = list(self.notes)
        d["transport"] = self.transport
        return d


def _addr_text(address: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in address.items())


def _path_text(p: P.NvmePath) -> str:
    return f"{p.controller} {p.transport or '?'} {_addr_text(p.address) or '?'} ({p.state or '?'})"


_PATH_DEV = re.compile(r"^nvme(\d+)c(\d+)n(\d+)$")


def _declared(spec: NvmeofSpec, p: P.NvmePath) -> bool:
    """Pure: whether a controller path is the one the inventory declares (its transport and address)."""
    return (p.transport == spec.transport and p.address.get("traddr") == spec.traddr
            and p.address.get("trsvcid") == spec.trsvcid)


def _path_records(spec: NvmeofSpec, st: HostState, sub_paths: list, cands: list) -> tuple[PathRecord, ...]:
    """Pure: the subsystem's controller paths as recorded, by controller, with their block devices and ANA states."""
    ana_by_ctrl = _ana_by_controller(st, cands)
    return tuple(PathRecord(
        controller=p.controller, transport=p.transport, address=_addr_text(p.address), state=p.state,
        ana_state=p.ana_state or ana_by_ctrl.get(p.controller, (None, None))[1],
        queue_count=st.sysfs.queue_count(p.controller), declared=_declared(spec, p),
        device=ana_by_ctrl.get(p.controller, (None, None))[0]) for p in sorted(sub_paths, key=lambda p: p.controller))


def _pick_namespace(spec: NvmeofSpec, chosen: list, live: list, want: int | None
                    ) -> tuple[Any, str | None, str | None]:
    """Pure: (namespace, multipath mode, None): the native head, else the first device on a live path; or the error."""
    heads = [ns for ns in chosen if ns.controller is None]
    if heads:
        return heads[0], "native", None
    live_ctrls = {p.controller for p in live}
    per_path = sorted((ns for ns in chosen if ns.controller in live_ctrls), key=lambda n: n.device)
    if not per_path:
        return None, None, (f"{spec.nqn}: namespace {want} has no device on the live controller(s) "
                            f"{', '.join(sorted(live_ctrls))} at {spec.address}")
    return per_path[0], "per-path", None


def resolve(spec: NvmeofSpec, st: HostState) -> Resolution:
    """Pure: the namespace device of ``spec`` in ``st``, checked against the inventory, or the reason why not."""
    seen = tuple(sorted({s.nqn for s in st.subsystems}))
    base = dict(target=spec.name, nqn=spec.nqn, expected=spec.address, subsystems_seen=seen, notes=tuple(st.notes))

    def fail(msg: str, **kw) -> Resolution:
        return Resolution(ok=False, error=msg, **base, **kw)

    subs = [s for s in st.subsystems if s.nqn == spec.nqn]
    if not subs:
        return fail(f"subsystem {spec.nqn} is not connected on this node (subsystems seen: "
                    f"{', '.join(seen) or 'none'}); nothing was read from any device")
    sub_paths = [p for s in subs for p in s.paths]
    host_nqns = sorted({s.host_nqn for s in subs if s.host_nqn})
    host_nqn = host_nqns[0] if len(host_nqns) == 1 else None

    # the namespace's per-path block devices and ANA states (for the record, before any check can fail)
    cands = [ns for ns in st.namespaces if ns.nqn == spec.nqn]
    base.update(paths=_path_records(spec, st, sub_paths, cands), host_nqn=host_nqn)

    if spec.host_nqn and host_nqns and spec.host_nqn not in host_nqns:
        return fail(f"{spec.nqn} is connected with host NQN {', '.join(host_nqns)}, expected {spec.host_nqn}")
    other_transport = [p for p in sub_paths if p.transport != spec.transport]
    if other_transport:
        return fail(f"{spec.nqn}: expected {spec.address}; found " + "; ".join(_path_text(p) for p in sub_paths)
                    + f" (a {other_transport[0].transport} path means I/O would not go over {spec.transport} only)")
    mine = [p for p in sub_paths if _declared(spec, p)]
    if not mine:
        return fail(f"{spec.nqn}: no controller at {spec.address}; found "
                    + "; ".join(_path_text(p) for p in sub_paths))
    live = [p for p in mine if p.state == "live"]
    if not live:
        return fail(f"{spec.nqn}: controller {mine[0].controller} at {spec.address} is {mine[0].state or 'unknown'}, "
                    "expected live")

    want, err = _wanted_nsid(spec, st, cands)
    if err:
        return fail(err)
    chosen = [ns for ns in cands if ns.nsid == want]
    if want is None or not chosen:
        return fail(f"{spec.nqn}: no namespace device" + (f" for nsid {want}" if want is not None else "")
                    + " (namespaces seen: " + (", ".join(f"{ns.device} nsid {ns.nsid}" for ns in cands) or "none")
                    + ")")
    ns, mode, err = _pick_namespace(spec, chosen, live, want)
    if err:
        return fail(err)
    rdma = _rdma_paths(st, live) if spec.transport == "rdma" else []
    return Resolution(ok=True, device=f"/dev/{ns.device}", multipath=mode, nsid=ns.nsid,
                      ns_uuid=st.sysfs.blocks.get(ns.device, {}).get("uuid"), serial=ns.serial,
                      size_bytes=ns.size_bytes or None, rdma=tuple(rdma), **base)


def _ana_by_controller(st: HostState, cands: list) -> dict[str, tuple[str, str | None]]:
    """Pure: controller -> (its path's block device, that path's ANA state), from the namespaces nvme-cli listed
    and from sysfs, which knows the ANA state of paths nvme-cli did not show."""
    ana_by_ctrl: dict[str, tuple[str, str | None]] = {}
    for ns in cands:
        if ns.controller is None:
            for path_dev in ns.paths:
                m = _PATH_DEV.match(path_dev)
                if m:
                    ana_by_ctrl[f"nvme{m.group(2)}"] = (path_dev, dict(ns.path_ana).get(path_dev))
        else:
            ana_by_ctrl[ns.controller] = (ns.device, st.sysfs.blocks.get(ns.device, {}).get("ana_state"))
    for dev, attrs in st.sysfs.blocks.items():
        m = _PATH_DEV.match(dev)
        if m and f"nvme{m.group(2)}" not in ana_by_ctrl:
            ana_by_ctrl[f"nvme{m.group(2)}"] = (dev, attrs.get("ana_state"))
    return ana_by_ctrl


def _wanted_nsid(spec: NvmeofSpec, st: HostState, cands: list) -> tuple[int | None, str | None]:
    """Pure: (the namespace ID the spec names, by ns_uuid, nguid or nsid, or the only one there is; or why none)."""
    if spec.ns_uuid or spec.nguid:
        key, value = ("uuid", spec.ns_uuid) if spec.ns_uuid else ("nguid", spec.nguid)
        hits = {ns.nsid for ns in cands if P.normalize_id(st.sysfs.blocks.get(ns.device, {}).get(key)) ==
                P.normalize_id(value)}
        if not hits:
            return None, (f"{spec.nqn}: no namespace with {key} {value} (namespaces seen: "
                          + (", ".join(f"{ns.device} nsid {ns.nsid} {key} "
                                       f"{st.sysfs.blocks.get(ns.device, {}).get(key) or '?'}" for ns in cands)
                             or "none") + ")")
        return min(hits), None
    if spec.nsid is not None:
        return spec.nsid, None
    nsids = sorted({ns.nsid for ns in cands})
    if len(nsids) > 1:
        return None, f"{spec.nqn} has namespaces {', '.join(map(str, nsids))}: name one with nsid, ns_uuid or nguid"
    return (nsids[0] if nsids else None), None


def _rdma_paths(st: HostState, live: list) -> list[dict]:
    """Pure: per live controller, the RDMA device, port and netdev its queues use (from the host's CM IDs)."""
    rdma: list[dict] = []
    netdev = {(link.device, link.port): link.netdev for link in st.links}
    for p in live:
        conns = host_connection(st.cm_ids, p.address.get("traddr", ""), p.address.get("trsvcid", ""))
        devs = sorted({(c.device, c.port) for c in conns})
        for dev, port in devs:
            rdma.append({"controller": p.controller, "device": dev, "port": port, "netdev": netdev.get((dev, port)),
                         "queues": sum(1 for c in conns if (c.device, c.port) == (dev, port))})
        if not devs:
            rdma.append({"controller": p.controller, "device": None, "port": None, "netdev": None, "queues": 0})
    return rdma


# ---------------------------------------------------------------------------------------- driver


@dataclass
class ConnectRecord:
    """What ``connect: managed`` did for one target on one node, and what it undid."""

    node: str
    target: str
    nqn: str
    address: str
    ok: bool = False
    error: str | None = None
    already_connected: bool = False  # found connected at the declared address: used as is, left connected
    issued: bool = False  # kvgate sent nvme connect (so whatever controller appeared is kvgate's)
    before: list[str] = field(default_factory=list)  # controllers of the NQN (and discovery) before
    controllers: list[str] = field(default_factory=list)  # the controllers kvgate made
    discovery: list[dict] = field(default_factory=list)
    connect_s: float | None = None
    disconnected: list[str] = field(default_factory=list)
    disconnect_errors: list[str] = field(default_factory=list)
    left_connected: list[str] = field(default_factory=list)
    resolution: dict | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class NvmeofHost:
    """One ``kind: nvmeof`` target on one node: probes, the check, and (managed) connect and disconnect.

    Every command goes through ``run(name, argv, timeout_s) -> CommandResult`` (the step log's seam)."""

    def __init__(self, run: Runner, spec: NvmeofSpec, node: str = "", clock=time.monotonic, sleep=time.sleep,
                 progress: Callable[[str], None] = lambda msg: None):
        self.run, self.spec, self.node = run, spec, node
        self.clock, self.sleep, self.progress = clock, sleep, progress

    def probe(self, prefix: str = "nvmeof") -> HostState:
        outputs = {}
        for name, argv in probe_commands(self.spec).items():
            r = self.run(f"{prefix}-{name}", argv, PROBE_TIMEOUT_S)
            if r.timed_out or r.error:
                raise NvmeofError(f"probe {name} did not answer: {r.summary()}")
            outputs[name] = (r.rc, r.stdout)
        try:
            return parse_host_state(outputs)
        except P.ParseError as exc:
            raise NvmeofError(str(exc)) from None

    def resolve(self, prefix: str = "nvmeof") -> tuple[Resolution, HostState]:
        st = self.probe(prefix)
        return resolve(self.spec, st), st

    def _ours(self, st: HostState, rec: ConnectRecord) -> list[str]:
        return sorted(st.controllers_of({self.spec.nqn, DISCOVERY_NQN}) - set(rec.before))

    def connect(self, rec: ConnectRecord | None = None) -> ConnectRecord:
        """Connect (managed), or find the subsystem already connected at the declared address (not ours).

        ``rec`` is filled in as things happen, so a cleanup that runs while this is interrupted (Ctrl-C) knows
        what may be kvgate's: ``before`` is set before anything is sent, ``issued`` before discovery and connect."""
        spec = self.spec
        rec = rec or ConnectRecord(node=self.node, target=spec.name, nqn=spec.nqn, address=spec.address)
        t0 = self.clock()
        deadline = t0 + spec.connect_timeout_s
        st = self.probe("connect-probe")
        rec.before = sorted(st.controllers_of({spec.nqn, DISCOVERY_NQN}))
        res = resolve(spec, st)
        at_address = [p for p in res.paths if p.declared]
        if not at_address:
            # not connected there yet: discovery must offer the NQN, then kvgate connects (and owns the result;
            # a discovery controller left by an interrupted discover is kvgate's too)
            rec.issued = True
            r = self.run("nvmeof-discover", spec.discover_argv(), spec.connect_timeout_s)
            if not r.ok:
                return self._failed(rec, f"discovery at {spec.address} failed within {spec.connect_timeout_s:g} s: "
                                         f"{r.summary()}", t0)
            try:
                rec.discovery = [asdict(d) for d in P.parse_discovery_log(r.stdout)]
            except P.ParseError as exc:
                return self._failed(rec, f"discovery at {spec.address}: {exc}", t0)
            offered = sorted({d["subnqn"] for d in rec.discovery if d["subnqn"] != DISCOVERY_NQN})
            if spec.nqn not in offered:
                return self._failed(rec, f"discovery at {spec.address} does not offer {spec.nqn} (offered: "
                                         f"{', '.join(offered) or 'none'}); nothing was connected", t0)
            left_s = max(1.0, deadline - self.clock())
            self.progress(f"{self.node}: nvme connect {spec.nqn} at {spec.address}")
            r = self.run("nvmeof-connect", spec.connect_argv(), left_s)
            if not r.ok:
                return self._failed(rec, f"nvme connect to {spec.address} failed: {r.summary()}", t0)
        else:
            rec.already_connected = True
        while True:
            st = self.probe("connect-wait")
            res = resolve(spec, st)
            if res.ok or self.clock() >= deadline:
                break
            self.sleep(0.5)
        rec.resolution = res.as_dict()
        if rec.issued:
            rec.controllers = self._ours(st, rec)
        if not res.ok:
            return self._failed(rec, f"{res.error} ({spec.connect_timeout_s:g} s after "
                                     f"{'connecting' if rec.issued else 'finding it connected'})", t0)
        rec.ok, rec.connect_s = True, round(self.clock() - t0, 3)
        return rec

    def _failed(self, rec: ConnectRecord, error: str, t0: float) -> ConnectRecord:
        """A failed connect leaves nothing of kvgate's connected."""
        rec.error, rec.connect_s = error, round(self.clock() - t0, 3)
        if rec.issued:
            self.disconnect(rec)
        return rec

    def disconnect(self, rec: ConnectRecord, rounds: int = 3) -> ConnectRecord:
        """Disconnect every controller of the NQN (or a discovery controller) that appeared since ``rec.before``;
        a subsystem that was connected before kvgate came stays connected. Looks again after each round: a
        connect killed by Ctrl-C can still finish in the kernel a moment later."""
        if not rec.issued:
            return rec
        for i in range(rounds + 1):
            try:
                st = self.probe("disconnect-probe" if i == 0 else "disconnect-check")
            except NvmeofError as exc:
                rec.disconnect_errors.append(str(exc))
                return rec
            rec.left_connected = self._ours(st, rec)
            if not rec.left_connected or i == rounds:
                break
            if i:
                self.sleep(1.0)
            for ctrl in rec.left_connected:
                r = self.run(f"nvmeof-disconnect-{ctrl}", disconnect_argv(ctrl), DISCONNECT_TIMEOUT_S)
                if r.ok:
                    rec.disconnected.append(ctrl)
                else:
                    rec.disconnect_errors.append(r.summary())
        return rec


# ------------------------------------------------------------------------------------- a run's view


def managed_targets(config: Any) -> dict[str, list[Any]]:
    """node -> the ``connect: managed`` targets the suite's gates name (``params.target``, then each of
    ``params.paths``: the further paths of a multipath namespace), in gate order."""
    out: dict[str, list[Any]] = {}
    for gate in config.suite.gates:
        params = config.params.get(gate.id)
        names = [getattr(params, "target", None), *(getattr(params, "paths", None) or ())]
        for name in names:
            if not isinstance(name, str):
                continue
            for node in config.gate_nodes(gate):
                t = node.target(name)
                if t is not None and t.kind == "nvmeof" and t.connect == "managed" and \
                        t.name not in {x.name for x in out.get(node.name, [])}:
                    out.setdefault(node.name, []).append(t)
    return out


def managed_plan(config: Any) -> tuple[list[tuple[str, str, tuple[str, ...]]], list[tuple[str, str, tuple[str, ...]]]]:
    """(before the gates, after them): (node, what, argv) of every command ``connect: managed`` sends."""
    attach, detach = [], []
    for node, targets in managed_targets(config).items():
        for t in targets:
            spec = NvmeofSpec.from_target(t)
            for name, argv in probe_commands(spec).items():
                attach.append((node, f"{t.name}: what is connected ({name})", argv))
            attach.append((node, f"{t.name}: discovery at {spec.address} (unless already connected there)",
                           spec.discover_argv()))
            attach.append((node, f"{t.name}: connect {spec.nqn} (unless already connected there; within "
                                 f"{spec.connect_timeout_s:g} s)", spec.connect_argv()))
            attach.append((node, f"{t.name}: the probes above again, every 0.5 s until the namespace is live "
                                 f"(at most {spec.connect_timeout_s:g} s)", ()))
            for name, argv in probe_commands(spec).items():
                detach.append((node, f"{t.name}: what is connected now ({name})", argv))
            detach.append((node, f"{t.name}: disconnect each controller kvgate connected (also after a failed "
                                 "gate or Ctrl-C; a subsystem found connected stays)", disconnect_argv("<nvmeX>")))
            detach.append((node, f"{t.name}: the probes again, to record anything left connected", ()))
    return attach, detach


class ManagedTargets:
    """The ``connect: managed`` targets of a run: connected before the gates, disconnected in the run's
    ``finally`` (end, failed gate, Ctrl-C). Records land in ``run_dir/nodes/NODE/nvmeof-managed.json``."""

    def __init__(self, steps: Any, run_dir: Path, progress: Callable[[str], None] = lambda msg: None):
        self.steps, self.run_dir, self.progress = steps, Path(run_dir), progress
        self.records: dict[tuple[str, str], ConnectRecord] = {}
        self.targets: dict[str, list[Any]] = {}
        self._lock = threading.Condition()
        self._active = 0  # attach threads still running (Ctrl-C returns before they end)
        self._stopping = False

    def _host(self, transport: Any, target: Any) -> NvmeofHost:
        def run(name: str, argv: Sequence[str], timeout_s: float | None):
            if self._stopping:  # detach has begun: an interrupted attach sends nothing more
                raise NvmeofError("the run is stopping")
            return self.steps.run(transport, name, argv, timeout_s=timeout_s)
        return NvmeofHost(run, NvmeofSpec.from_target(target), node=transport.name, progress=self.progress)

    def attach(self, targets: dict[str, list[Any]], transports: dict[str, Any]) -> None:
        """Connect every node's managed targets (nodes in parallel); failures are kept as records."""
        self.targets = targets

        def one(node: str, tr: Any) -> None:
            with self._lock:
                self._active += 1
            try:
                for t in targets.get(node, []):
                    rec = ConnectRecord(node=node, target=t.name, nqn=t.nqn,
                                        address=NvmeofSpec.from_target(t).address)
                    with self._lock:
                        self.records[(node, t.name)] = rec
                    try:
                        self._host(tr, t).connect(rec)
                    except NvmeofError as exc:
                        rec.error = str(exc)
                    self.progress(f"{node}/{t.name}: " + (
                        f"{'connected' if rec.issued else 'found connected'} {rec.nqn} "
                        f"({', '.join(rec.controllers) or 'not connected by kvgate, left as found'}) in {rec.connect_s} s"
                        if rec.ok else f"connect: managed failed: {rec.error}"))
                    self._write(node)
            finally:
                with self._lock:
                    self._active -= 1
                    self._lock.notify_all()
        live = {n: tr for n, tr in transports.items() if n in targets}
        if live:
            fan_out(live, one)

    def record(self, node: str, target: str) -> ConnectRecord | None:
        with self._lock:
            return self.records.get((node, target))

    def detach(self, transports: dict[str, Any], wait_s: float = 60.0) -> None:
        """Disconnect what :meth:`attach` connected (reverse order per node); never raises. An attach still
        running (Ctrl-C during it) is stopped first: its command killed, then it is waited for."""
        with self._lock:
            self._stopping = True
            busy = self._active > 0
        if busy:
            for n in self.targets:
                if n in transports:
                    try:
                        transports[n].abort()
                    except Exception:  # noqa: BLE001
                        pass
            with self._lock:
                self._lock.wait_for(lambda: self._active == 0, timeout=wait_s)
        self._stopping = False

        def one(node: str, tr: Any) -> None:
            for t in reversed(self.targets.get(node, [])):
                rec = self.record(node, t.name)
                if rec is None or not rec.issued:
                    continue
                try:
                    self._host(tr, t).disconnect(rec)
                except Exception as exc:  # noqa: BLE001 - the cleanup must reach every target
                    rec.disconnect_errors.append(f"{type(exc).__name__}: {exc}")
                self.progress(f"{node}/{t.name}: disconnected {', '.join(rec.disconnected) or 'nothing'}"
                              + (f"; LEFT CONNECTED: {', '.join(rec.left_connected)}" if rec.left_connected else ""))
                self._write(node)
        live = {n: tr for n, tr in transports.items() if n in self.targets}
        if live:
            fan_out(live, one)

    def _write(self, node: str) -> None:
        with self._lock:
            recs = [r.as_dict() for (n, _), r in self.records.items() if n == node]
        path = self.run_dir / "nodes" / node / "nvmeof-managed.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(recs, indent=1, sort_keys=True, default=str) + "\n")
