"""Pure parsers for the NVMe-oF loopback: nvme-cli JSON and configfs listings.

Every function takes the text a command printed and returns data; nothing here runs a command.
Fixtures captured from the real guest (Debian kernel 6.1, nvme-cli 2.3) are under
tests/fixtures/nvme/.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from harness.errors import HarnessError

NVMET_ROOT = "/sys/kernel/config/nvmet"
NULLB_ROOT = "/sys/kernel/config/nullb"


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
                         address=parse_address(str(p.get("Address", ""))), state=str(p.get("State", "")))
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


def parse_list_verbose(text: str) -> list[NvmeNamespace]:
    """Parse ``nvme list -v -o json`` (nvme-cli 2.x): namespaces per subsystem, by NQN."""
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
            path_names = tuple(str(p.get("Path", "")) for c in ctrls for p in (c.get("Paths", []) or []))
            namespaces = list(sub.get("Namespaces", []) or [])
            # Without native multipath the namespaces hang under each controller instead.
            for c in ctrls:
                namespaces += list(c.get("Namespaces", []) or [])
            for ns in namespaces:
                sector = int(ns.get("SectorSize", 0) or 0)
                size = int(ns.get("PhysicalSize", 0) or 0)
                if not size and sector:
                    size = int(ns.get("MaximumLBA", 0) or 0) * sector
                out.append(NvmeNamespace(subsystem=str(sub.get("Subsystem", "")), nqn=nqn,
                                         device=str(ns.get("NameSpace", "")), nsid=int(ns.get("NSID", 0) or 0),
                                         size_bytes=size, sector_size=sector, controllers=ctrl_names,
                                         paths=path_names))
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
