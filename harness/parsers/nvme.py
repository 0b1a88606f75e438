"""Pure parsers for NVMe-oF: nvme-cli JSON (list-subsys, list -v, discover, connect), the NVMe sysfs
attributes of controllers and namespaces, and the nvmet/null_blk configfs listings of the loopback.

Every function takes the text a command printed and returns data; nothing here runs a command (the argv
constants beside them are what kvgate runs). Fixtures captured from the real guest (Debian kernel 6.1,
nvme-cli 2.3) are under tests/fixtures/nvme/ (the loopback) and tests/fixtures/nvmeof/ (the host side over
TCP and RDMA, native multipath and per-path devices).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from harness.errors import HarnessError

NVMET_ROOT = "/sys/kernel/config/nvmet"
NULLB_ROOT = "/sys/kernel/config/nullb"

LIST_SUBSYS_ARGV = ("nvme", "list-subsys", "-o", "json")
LIST_VERBOSE_ARGV = ("nvme", "list", "-v", "-o", "json")
# Controllers (state, transport, address, queue count) and namespace block devices (nsid, UUID, NGUID, ANA
# state of each path) as the kernel shows them: ``path:value`` lines, unreadable attributes left out.
NVME_SYSFS_ARGV = ("sh", "-c",
                   'for c in /sys/class/nvme/nvme*; do [ -d "$c" ] && grep -s -H . "$c/state" "$c/transport" '
                   '"$c/address" "$c/queue_count" "$c/sqsize" "$c/subsysnqn" "$c/cntlid"; done; '
                   'for b in /sys/block/nvme*; do [ -d "$b" ] && grep -s -H . "$b/nsid" "$b/uuid" "$b/nguid" '
                   '"$b/ana_state" "$b/size"; done; true')


class ParseError(HarnessError):
    """A command's output did not have the expected shape."""


# ------------------------------------------------------------------------------------- nvme-cli


@dataclass(frozen=True)
class NvmePath:
    """One controller path of a connected subsystem (``nvme list-subsys``)."""

    controller: str
    transport: str
    address: dict[str, str]
    state: str
    ana_state: str | None = None  # nvme-cli prints it when asked about a namespace, and in ``list -v``


@dataclass(frozen=True)
class NvmeSubsystem:
    """A subsystem the host is connected to, from ``nvme list-subsys -o json``."""

    name: str
    nqn: str
    host_nqn: str
    paths: tuple[NvmePath, ...]

    @property
    def live(self) -> bool:
        return any(p.state == "live" for p in self.paths)

    @property
    def instance(self) -> int | None:
        """N of ``nvme-subsysN``; with native multipath the namespace head is nvmeNnY."""
        prefix = "nvme-subsys"
        if self.name.startswith(prefix) and self.name[len(prefix):].isdigit():
            return int(self.name[len(prefix):])
        return None


def parse_address(text: str) -> dict[str, str]:
    """``traddr=127.0.0.1,trsvcid=4420,src_addr=127.0.0.1`` -> dict."""
    out: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        if sep and key:
            out[key] = value
    return out


def load_json(text: str, what: str):
    """Parse a command's JSON output; None when it printed nothing."""
    text = text.strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ParseError(f"{what}: not JSON: {exc}: {text[:120]!r}") from None


def parse_list_subsys(text: str) -> list[NvmeSubsystem]:
    """Parse ``nvme list-subsys -o json`` (nvme-cli 2.x; also the 1.x ``{"Subsystems": [...]}`` shape).

    Empty output or ``[]`` means nothing is connected.
    """
    data = load_json(text, "nvme list-subsys")
    if data is None:
        return []
    hosts = data if isinstance(data, list) else [data]
    out: list[NvmeSubsystem] = []
    for host in hosts:
        if not isinstance(host, dict):
            raise ParseError(f"nvme list-subsys: expected objects, got {type(host).__name__}")
        host_nqn = str(host.get("HostNQN", ""))
        for sub in host.get("Subsystems", []) or []:
            paths = tuple(
                NvmePath(controller=str(p.get("Name", "")), transport=str(p.get("Transport", "")),
                         address=parse_address(str(p.get("Address", ""))), state=str(p.get("State", "")),
                         ana_state=str(p["ANAState"]) if p.get("ANAState") else None)
                for p in sub.get("Paths", []) or [])
            if "NQN" not in sub:
                raise ParseError(f"nvme list-subsys: a subsystem has no NQN: {sub!r}"[:200])
            out.append(NvmeSubsystem(name=str(sub.get("Name", "")), nqn=str(sub["NQN"]),
                                     host_nqn=host_nqn, paths=paths))
    return out


@dataclass(frozen=True)
class NvmeNamespace:
    """A namespace block device of a subsystem, from ``nvme list -v -o json``."""

    subsystem: str
    nqn: str
    device: str  # e.g. nvme0n1 (the multipath head when native multipath is on)
    nsid: int
    size_bytes: int
    sector_size: int
    controllers: tuple[str, ...]
    paths: tuple[str, ...]  # per-controller paths such as nvme0c0n1 (where multipath statistics appear)
    # The controller a per-path device belongs to (no native multipath: one nvmeXnY per controller);
    # None for a native multipath head, which every controller of the subsystem serves.
    controller: str | None = None
    path_ana: tuple[tuple[str, str], ...] = ()  # (path, ANA state) of every path of a multipath head
    serial: str | None = None


def parse_list_verbose(text: str) -> list[NvmeNamespace]:
    """Parse ``nvme list -v -o json`` (nvme-cli 2.x): namespaces per subsystem, by NQN.

    With native multipath the subsystem lists the head (``nvme0n1``) and each controller its hidden path
    (``nvme0c1n1``, with its ANA state); without it each controller lists its own ``nvmeXnY``."""
    data = load_json(text, "nvme list -v")
    if data is None:
        return []
    if not isinstance(data, dict) or not isinstance(data.get("Devices", []), list):
        raise ParseError("nvme list -v: expected {\"Devices\": [...]}")
    out: list[NvmeNamespace] = []
    for host in data.get("Devices", []):
        for sub in host.get("Subsystems", []) or []:
            nqn = str(sub.get("SubsystemNQN", ""))
            ctrls = sub.get("Controllers", []) or []
            ctrl_names = tuple(str(c.get("Controller", "")) for c in ctrls)
            paths = [p for c in ctrls for p in (c.get("Paths", []) or [])]
            path_names = tuple(str(p.get("Path", "")) for p in paths)
            path_ana = tuple((str(p.get("Path", "")), str(p["ANAState"])) for p in paths if p.get("ANAState"))
            serials = {str(c.get("SerialNumber", "")).strip() for c in ctrls} - {""}
            # Without native multipath the namespaces hang under each controller instead.
            namespaces = [(ns, None) for ns in sub.get("Namespaces", []) or []]
            for c in ctrls:
                namespaces += [(ns, str(c.get("Controller", ""))) for ns in c.get("Namespaces", []) or []]
            for ns, ctrl in namespaces:
                sector = int(ns.get("SectorSize", 0) or 0)
                size = int(ns.get("PhysicalSize", 0) or 0)
                if not size and sector:
                    size = int(ns.get("MaximumLBA", 0) or 0) * sector
                out.append(NvmeNamespace(subsystem=str(sub.get("Subsystem", "")), nqn=nqn,
                                         device=str(ns.get("NameSpace", "")), nsid=int(ns.get("NSID", 0) or 0),
                                         size_bytes=size, sector_size=sector, controllers=ctrl_names,
                                         paths=path_names if ctrl is None else (),
                                         controller=ctrl, path_ana=path_ana if ctrl is None else (),
                                         serial=serials.pop() if len(serials) == 1 else None))
    return out


def find_subsystem(subsystems: list[NvmeSubsystem], nqn: str) -> NvmeSubsystem | None:
    return next((s for s in subsystems if s.nqn == nqn), None)


def find_namespace_device(subsystems: list[NvmeSubsystem], namespaces: list[NvmeNamespace], nqn: str,
                          nsid: int = 1) -> str | None:
    """The /dev path of namespace ``nsid`` of the connected subsystem ``nqn``, or None.

    Prefers the namespace listing (``nvme list -v``); falls back to the multipath head name the
    kernel derives from the subsystem instance (nvme-subsysN -> nvmeNnNSID).
    """
    sub = find_subsystem(subsystems, nqn)
    if sub is None or not sub.live:
        return None
    for ns in namespaces:
        if ns.nqn == nqn and ns.nsid == nsid and ns.device:
            return "/dev/" + ns.device
    if sub.instance is not None and not namespaces:
        return f"/dev/nvme{sub.instance}n{nsid}"
    return None


@dataclass(frozen=True)
class NvmeSysfs:
    """``NVME_SYSFS_ARGV``'s view: controller attributes by controller (nvme0) and namespace block device
    attributes by device (nvme0n1, nvme0c1n1), each attribute name -> value."""

    controllers: dict[str, dict[str, str]]
    blocks: dict[str, dict[str, str]]

    def queue_count(self, controller: str) -> int | None:
        v = self.controllers.get(controller, {}).get("queue_count", "")
        return int(v) if v.isdigit() else None


_SYSFS_LINE = re.compile(r"^/sys/(class/nvme|block)/(nvme[0-9a-z]+)/([a-z_]+):(.*)$")


def parse_nvme_sysfs(text: str) -> NvmeSysfs:
    """Parse ``NVME_SYSFS_ARGV``'s ``/sys/class/nvme/nvmeX/attr:value`` and ``/sys/block/nvmeXnY/attr:value``
    lines. Paths hold no ':' (NVMe names), values may (addresses, NQNs)."""
    ctrls: dict[str, dict[str, str]] = {}
    blocks: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        m = _SYSFS_LINE.match(line.strip())
        if not m:
            continue
        where = ctrls if m.group(1) == "class/nvme" else blocks
        where.setdefault(m.group(2), {})[m.group(3)] = m.group(4).strip()
    return NvmeSysfs(ctrls, blocks)


def fabric_view(sysfs: NvmeSysfs) -> dict[str, list[dict]]:
    """The snapshot's NVMe(-oF) view from sysfs: controllers (transport, address, state, queue count, subsystem
    NQN) and namespace block devices (a multipath head or a path, with its ANA state)."""
    def num(v: str | None) -> int | None:
        return int(v) if v and v.isdigit() else None
    ctrls = [{"controller": name, "transport": a.get("transport"), "address": a.get("address"),
              "state": a.get("state"), "queue_count": num(a.get("queue_count")), "sqsize": num(a.get("sqsize")),
              "subsystem_nqn": a.get("subsysnqn"), "cntlid": num(a.get("cntlid"))}
             for name, a in sorted(sysfs.controllers.items())]
    blocks = [{"device": name, "nsid": num(a.get("nsid")), "uuid": a.get("uuid"), "nguid": a.get("nguid"),
               "ana_state": a.get("ana_state"), "size_bytes": num(a.get("size")) * 512 if num(a.get("size"))
               is not None else None}
              for name, a in sorted(sysfs.blocks.items())]
    return {"nvme_fabric_controllers": ctrls, "nvme_namespace_devices": blocks}


def normalize_id(value: str | None) -> str:
    """A namespace UUID or NGUID compared without dashes or case."""
    return (value or "").replace("-", "").lower()


@dataclass(frozen=True)
class DiscoveryRecord:
    """One entry of a discovery log page (``nvme discover -o json``)."""

    trtype: str
    traddr: str
    trsvcid: str
    subnqn: str
    subtype: str
    adrfam: str = ""
    portid: int | None = None


def parse_discovery_log(text: str) -> list[DiscoveryRecord]:
    """Parse ``nvme discover -o json`` (nvme-cli 2.x: ``{"genctr": N, "records": [...]}``)."""
    data = load_json(text, "nvme discover")
    if data is None:
        return []
    if not isinstance(data, dict) or not isinstance(data.get("records", []), list):
        raise ParseError("nvme discover: expected {\"records\": [...]}")
    out = []
    for r in data.get("records", []):
        if not isinstance(r, dict) or "subnqn" not in r:
            raise ParseError(f"nvme discover: a record has no subnqn: {r!r}"[:200])
        port = r.get("portid")
        out.append(DiscoveryRecord(trtype=str(r.get("trtype", "")), traddr=str(r.get("traddr", "")),
                                   trsvcid=str(r.get("trsvcid", "")), subnqn=str(r["subnqn"]),
                                   subtype=str(r.get("subtype", "")), adrfam=str(r.get("adrfam", "")),
                                   portid=int(port) if isinstance(port, int) else None))
    return out


def parse_connect_device(text: str) -> str | None:
    """The controller ``nvme connect -o json`` made (``{"device": "nvme0"}``), None when it printed none."""
    try:
        data = load_json(text, "nvme connect")
    except ParseError:
        return None
    dev = data.get("device") if isinstance(data, dict) else None
    return str(dev) if isinstance(dev, str) and re.fullmatch(r"nvme\d+", dev) else None


# ------------------------------------------------------------------------------------- configfs


@dataclass
class NamespaceState:
    nsid: int
    device_path: str | None = None
    enabled: bool | None = None
    buffered_io: bool | None = None


@dataclass
class SubsystemState:
    nqn: str
    allow_any_host: bool | None = None
    allowed_hosts: set[str] = field(default_factory=set)
    namespaces: dict[int, NamespaceState] = field(default_factory=dict)


@dataclass
class PortState:
    port_id: str
    trtype: str | None = None
    adrfam: str | None = None
    traddr: str | None = None
    trsvcid: str | None = None
    subsystems: set[str] = field(default_factory=set)


@dataclass
class NvmetState:
    """The kernel target's configuration as configfs shows it."""

    present: bool = False  # /sys/kernel/config/nvmet exists (nvmet loaded, configfs mounted)
    hosts: set[str] = field(default_factory=set)
    subsystems: dict[str, SubsystemState] = field(default_factory=dict)
    ports: dict[str, PortState] = field(default_factory=dict)


def _rel_parts(path: str, root: str) -> list[str] | None:
    path = path.strip()
    if path != root and not path.startswith(root + "/"):
        return None
    rest = path[len(root):].strip("/")
    return rest.split("/") if rest else []


_PORT_ATTRS = {"addr_trtype": "trtype", "addr_adrfam": "adrfam", "addr_traddr": "traddr",
               "addr_trsvcid": "trsvcid"}


def parse_nvmet_configfs(find_text: str, grep_text: str = "") -> NvmetState:
    """Parse ``find /sys/kernel/config/nvmet`` plus ``grep -rs . /sys/kernel/config/nvmet``.

    ``find`` gives the objects (hosts, subsystems, namespaces, ports and the links between them);
    ``grep`` gives attribute values as ``path:value`` lines. NQNs contain ':' but never '/', so a
    grep line splits at the first ':' after the attribute's path component.
    """
    st = NvmetState()
    for line in find_text.splitlines():
        parts = _rel_parts(line, NVMET_ROOT)
        if parts is None:
            continue
        st.present = True
        _add_object(st, parts)
    for line in grep_text.splitlines():
        if not line.startswith(NVMET_ROOT + "/"):
            continue
        # split "<path>:<value>" where <path> has no ':' in its last component
        head, value = _split_grep_line(line)
        if head is None:
            continue
        parts = _rel_parts(head, NVMET_ROOT)
        if not parts:
            continue
        st.present = True
        _add_attr(st, parts, value)
    return st


_ATTR_RE = re.compile(r"[a-z][a-z0-9_]*")


def _split_grep_line(line: str) -> tuple[str | None, str]:
    """Split ``<path>:<value>`` from grep. NQN components hold ':' and values may hold '/', so the split
    is at the first ':' whose preceding path component is an attribute name (lower-case, digits, '_');
    NQNs always contain '.' and '-', which attribute names never do."""
    start = 0
    while True:
        colon = line.find(":", start)
        if colon < 0:
            return None, ""
        component = line[line.rfind("/", 0, colon) + 1:colon]
        if _ATTR_RE.fullmatch(component):
            return line[:colon], line[colon + 1:]
        start = colon + 1


def _add_object(st: NvmetState, parts: list[str]) -> None:
    if len(parts) >= 2 and parts[0] == "hosts":
        st.hosts.add(parts[1])
    elif len(parts) >= 2 and parts[0] == "subsystems":
        sub = st.subsystems.setdefault(parts[1], SubsystemState(parts[1]))
        if len(parts) == 4 and parts[2] == "allowed_hosts":
            sub.allowed_hosts.add(parts[3])
        elif len(parts) >= 4 and parts[2] == "namespaces" and parts[3].isdigit():
            sub.namespaces.setdefault(int(parts[3]), NamespaceState(int(parts[3])))
    elif len(parts) >= 2 and parts[0] == "ports":
        port = st.ports.setdefault(parts[1], PortState(parts[1]))
        if len(parts) == 4 and parts[2] == "subsystems":
            port.subsystems.add(parts[3])


def _add_attr(st: NvmetState, parts: list[str], value: str) -> None:
    _add_object(st, parts[:-1])
    attr = parts[-1]
    if parts[0] == "subsystems" and len(parts) == 3:
        if attr == "attr_allow_any_host":
            st.subsystems[parts[1]].allow_any_host = value.strip() == "1"
    elif parts[0] == "subsystems" and len(parts) == 5 and parts[2] == "namespaces" and parts[3].isdigit():
        ns = st.subsystems[parts[1]].namespaces[int(parts[3])]
        if attr == "device_path":
            ns.device_path = value.strip() or None
        elif attr == "enable":
            ns.enabled = value.strip() == "1"
        elif attr == "buffered_io":
            ns.buffered_io = value.strip() == "1"
    elif parts[0] == "ports" and len(parts) == 3 and attr in _PORT_ATTRS:
        setattr(st.ports[parts[1]], _PORT_ATTRS[attr], value.strip())


@dataclass
class NullbDevice:
    """A null_blk device created through configfs (/sys/kernel/config/nullb/<name>)."""

    name: str
    attrs: dict[str, str] = field(default_factory=dict)

    @property
    def powered(self) -> bool:
        return self.attrs.get("power") == "1"

    @property
    def memory_backed(self) -> bool:
        return self.attrs.get("memory_backed") == "1"

    @property
    def size_mib(self) -> int | None:
        v = self.attrs.get("size")
        return int(v) if v and v.isdigit() else None

    @property
    def index(self) -> int | None:
        v = self.attrs.get("index")
        return int(v) if v and v.isdigit() else None


def parse_nullb_configfs(grep_text: str) -> dict[str, NullbDevice]:
    """Parse ``grep -rs . /sys/kernel/config/nullb`` into devices by configfs name."""
    out: dict[str, NullbDevice] = {}
    for line in grep_text.splitlines():
        head, value = _split_grep_line(line)
        if head is None:
            continue
        parts = _rel_parts(head, NULLB_ROOT)
        if not parts or len(parts) != 2:
            continue  # "features" sits at the top level
        out.setdefault(parts[0], NullbDevice(parts[0])).attrs[parts[1]] = value.strip()
    return out


def parse_block_list(text: str) -> set[str]:
    """``ls /sys/block`` -> set of block device names."""
    return {w for w in text.split() if w}
