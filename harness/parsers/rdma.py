"""Pure parsers for RDMA: iproute2's ``rdma`` tool (links, connection-manager IDs) and /sys/class/infiniband.

What kvgate records about a node's RDMA devices (port state, link layer, GID types and the NIC under each
GID) and which RDMA device an NVMe/RDMA connection runs on (the kernel ``nvme_rdma`` connection-manager ID
whose destination is the controller's address). Fixtures captured from the real guest (soft-RoCE
``rdma_rxe`` on the virtio NIC, iproute2 6.1) are under tests/fixtures/nvmeof/.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from ..errors import HarnessError

RDMA_LINK_ARGV = ("rdma", "-j", "link", "show")
RDMA_CM_ID_ARGV = ("rdma", "-j", "res", "show", "cm_id")
IB_ROOT = "/sys/class/infiniband"
# Every RDMA device's type and GUID, and per port: state, physical state, link layer, rate, and each
# populated GID with its type (RoCE v1 / RoCE v2 / IB) and the NIC under it; all-zero GIDs left out.
IB_SYSFS_ARGV = ("sh", "-c",
                 f'for d in {IB_ROOT}/*; do [ -d "$d" ] || continue; '
                 'grep -s -H . "$d/node_type" "$d/node_guid" "$d/fw_ver"; '
                 'for p in "$d"/ports/*; do grep -s -H . "$p/state" "$p/phys_state" "$p/link_layer" "$p/rate" '
                 '"$p"/gid_attrs/types/* "$p"/gid_attrs/ndevs/* "$p"/gids/*; done; done '
                 '| grep -v ":0000:0000:0000:0000:0000:0000:0000:0000$"; true')


class RdmaParseError(HarnessError, ValueError):
    """The rdma tool printed something that is not the JSON it prints."""


def _json_list(text: str, what: str) -> list[dict]:
    text = text.strip()
    if not text:
        return []
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise RdmaParseError(f"{what}: not JSON: {exc}: {text[:120]!r}") from None
    if not isinstance(data, list) or not all(isinstance(x, dict) for x in data):
        raise RdmaParseError(f"{what}: expected a JSON list of objects")
    return data


@dataclass(frozen=True)
class RdmaLink:
    """One RDMA port as ``rdma -j link show`` prints it: its state and the network device under it."""

    device: str
    port: int
    state: str
    physical_state: str
    netdev: str | None


def parse_rdma_links(text: str) -> list[RdmaLink]:
    """``rdma -j link show``: ``[{"ifname": "rxe0", "port": 1, "state": "ACTIVE", "netdev": "eth0", ...}]``."""
    return [RdmaLink(device=str(x.get("ifname", "")), port=int(x.get("port", 0) or 0),
                     state=str(x.get("state", "")), physical_state=str(x.get("physical_state", "")),
                     netdev=str(x["netdev"]) if x.get("netdev") else None)
            for x in _json_list(text, "rdma link")]


@dataclass(frozen=True)
class CmId:
    """A connection-manager ID (``rdma -j res show cm_id``): who owns it and which addresses it joins."""

    device: str
    port: int
    state: str
    comm: str  # the owner: nvme_rdma (host), nvmet_rdma (target), or a process name
    src_addr: str
    dst_addr: str
    qp_type: str | None = None


def parse_cm_ids(text: str) -> list[CmId]:
    """``rdma -j res show cm_id``."""
    return [CmId(device=str(x.get("ifname", "")), port=int(x.get("port", 0) or 0), state=str(x.get("state", "")),
                 comm=str(x.get("comm", "")).strip("[]"), src_addr=str(x.get("src-addr", "")),
                 dst_addr=str(x.get("dst-addr", "")), qp_type=str(x["qp-type"]) if x.get("qp-type") else None)
            for x in _json_list(text, "rdma res show cm_id")]


def split_host_port(addr: str) -> tuple[str, str]:
    """``10.0.2.15:4421`` or ``[fe80::1]:4421`` -> (host, port)."""
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), port


def host_connection(cm_ids: list[CmId], traddr: str, trsvcid: str) -> list[CmId]:
    """The NVMe/RDMA host's connected queues to ``traddr:trsvcid`` (one cm_id per queue)."""
    return [c for c in cm_ids if c.comm == "nvme_rdma" and split_host_port(c.dst_addr) == (traddr, str(trsvcid))]


@dataclass
class IbPort:
    port: int
    state: str | None = None  # e.g. "ACTIVE" (from "4: ACTIVE")
    phys_state: str | None = None  # e.g. "LinkUp"
    link_layer: str | None = None  # "Ethernet" for RoCE, "InfiniBand"
    rate: str | None = None
    gids: dict[int, dict[str, str]] = field(default_factory=dict)  # index -> gid, type, netdev

    @property
    def gid_types(self) -> list[str]:
        return sorted({g["type"] for g in self.gids.values() if g.get("type")})

    @property
    def netdevs(self) -> list[str]:
        return sorted({g["netdev"] for g in self.gids.values() if g.get("netdev")})

    def as_dict(self) -> dict:
        return {"port": self.port, "state": self.state, "phys_state": self.phys_state,
                "link_layer": self.link_layer, "rate": self.rate, "gid_types": self.gid_types,
                "netdevs": self.netdevs, "gids": [{"index": i, **g} for i, g in sorted(self.gids.items())]}


@dataclass
class IbDevice:
    name: str
    node_type: str | None = None
    node_guid: str | None = None
    fw_ver: str | None = None
    ports: dict[int, IbPort] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"device": self.name, "node_type": self.node_type, "node_guid": self.node_guid,
                "fw_ver": self.fw_ver, "ports": [p.as_dict() for _, p in sorted(self.ports.items())]}


_IB_LINE = re.compile(r"^/sys/class/infiniband/([^/:]+)/(?:ports/(\d+)/)?([a-z_]+(?:/[a-z_]+)?(?:/\d+)?):(.*)$")


def _state_word(value: str) -> str:
    """``4: ACTIVE`` -> ``ACTIVE``."""
    return value.split(":", 1)[1].strip() if re.match(r"^\d+:", value) else value.strip()


def parse_ib_sysfs(text: str) -> list[IbDevice]:
    """Parse ``IB_SYSFS_ARGV``'s ``path:value`` lines into devices, ports and populated GIDs."""
    devices: dict[str, IbDevice] = {}
    for line in text.splitlines():
        m = _IB_LINE.match(line.strip())
        if not m:
            continue
        name, port_s, attr, value = m.group(1), m.group(2), m.group(3), m.group(4).strip()
        dev = devices.setdefault(name, IbDevice(name))
        if port_s is None:
            if attr in ("node_type", "node_guid", "fw_ver"):
                setattr(dev, attr, (_state_word(value) if attr == "node_type" else value) or None)
            continue
        port = dev.ports.setdefault(int(port_s), IbPort(int(port_s)))
        if attr in ("state", "phys_state"):
            setattr(port, attr, _state_word(value))
        elif attr in ("link_layer", "rate"):
            setattr(port, attr, value)
        else:
            kind, _, index = attr.rpartition("/")
            if not index.isdigit():
                continue
            key = {"gids": "gid", "gid_attrs/types": "type", "gid_attrs/ndevs": "netdev"}.get(kind)
            if key:
                port.gids.setdefault(int(index), {})[key] = value
    for dev in devices.values():  # a type or NIC without its GID is an unpopulated entry
        for port in dev.ports.values():
            port.gids = {i: g for i, g in port.gids.items() if g.get("gid")}
    return [devices[n] for n in sorted(devices)]


def rdma_devices(links: list[dict], devices: list[dict]) -> list[dict]:
    """Per RDMA port: what ``rdma link`` says (state, the NIC under it; :class:`RdmaLink` as a dict) joined with
    sysfs (link layer, rate, GID types; :meth:`IbDevice.as_dict`). Works on the JSON a snapshot holds; a port
    only one source knows is listed with what that source says."""
    by_port = {(str(x.get("device")), int(x.get("port") or 0)): x for x in links if isinstance(x, dict)}
    out = []
    seen = set()
    for dev in devices:
        if not isinstance(dev, dict):
            continue
        for p in dev.get("ports") or []:
            key = (str(dev.get("device")), int(p.get("port") or 0))
            link = by_port.get(key, {})
            seen.add(key)
            netdevs = list(p.get("netdevs") or [])
            out.append({"device": key[0], "port": key[1], "node_type": dev.get("node_type"),
                        "state": link.get("state") or p.get("state"),
                        "physical_state": link.get("physical_state") or p.get("phys_state"),
                        "link_layer": p.get("link_layer"), "rate": p.get("rate"),
                        "gid_types": list(p.get("gid_types") or []),
                        "netdev": link.get("netdev") or (netdevs[0] if netdevs else None), "gid_netdevs": netdevs})
    for key, link in sorted(by_port.items()):
        if key not in seen:
            out.append({"device": key[0], "port": key[1], "node_type": None, "state": link.get("state"),
                        "physical_state": link.get("physical_state"), "link_layer": None, "rate": None,
                        "gid_types": [], "netdev": link.get("netdev"), "gid_netdevs": []})
    return out
