"""The one write guard: every write kvgate makes to a file or block device asks here first.

The rule (README, "Writing an inventory"):

- a **file** is written only when it does not exist yet (kvgate is about to create it) or kvgate created it
  (a ``PATH.kvgate-created`` marker lies next to it); a file kvgate did not create is never written;
- a **block device** is never written when it is read-only or mounted (itself or anything on it); when it
  holds a filesystem, a partition table, partitions or holders (``lsblk`` and ``blkid -p``, the latter
  probing the device itself, so it works without udev) it is written only when the target says
  ``allow_destructive: true`` and its ``serial`` equals the device's; and a target that names a serial is
  never written to a device with another serial, blank or not.

The device's serial is lsblk's SERIAL, else the kernel's sysfs ``serial`` (virtio) or ``device/serial``
(NVMe, SCSI). Loop devices have none; for them kvgate takes ``loop:`` + the backing file the kernel
reports (``/sys/class/block/loopN/loop/backing_file``), so ``serial: loop:/var/tmp/disk.img`` names the
loop device over that file (whatever loopN it got), and a loop device over another file does not match.
A device with no serial at all can never be written once it holds data.

A second path to storage the guard already judged (``same_storage_as``: the NVMe-oF namespace that serves a
loopback's backing device, the same bytes) is written only when that decision allowed it and this path is not
read-only or mounted (itself or anything on it): the namespace can be mounted while its backing device shows no
mount at all. What it holds is what the backing holds, judged there (with the target's serial, which names the
backing device, not the namespace).

The facts are read on the node through its transport (``run(name, argv, timeout_s) -> CommandResult``, the
same runner seam as the loopback, so every probe lands in the step log) and parsed by the pure functions
here; the decision is returned as data (``WriteDecision.as_dict()``) for the run directory and evidence.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Literal, Sequence

from .parsers.blockdev import (LSBLK_ARGV, BlockDevice, blkid_argv, holdings, never_writable, parse_blkid_export,
                               parse_lsblk, write_allowed)

CREATED_SUFFIX = ".kvgate-created"  # marks a file kvgate created (and may therefore write and delete)
PROBE_TIMEOUT_S = 30.0

Runner = Callable[[str, Sequence[str], float | None], Any]  # returns a CommandResult
Expect = Literal["file", "block"]

_KNAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")

# What the path is (block / file / other / missing), whether kvgate's marker is there, and the size.
_PATH_PROBE = ('if [ -b "$1" ]; then echo block; elif [ -f "$1" ]; then echo file; '
               'elif [ -e "$1" ] || [ -L "$1" ]; then echo other; else echo missing; fi; '
               'if [ -e "$2" ]; then echo created; else echo foreign; fi; '
               'stat -L -c %s -- "$1" 2>/dev/null || echo -')
# Identity attributes of a block device by kernel name; absent ones are left out.
_IDENTITY_PROBE = ('for f in serial device/serial loop/backing_file; do '
                   'if [ -r "/sys/class/block/$1/$f" ]; then printf "%s=" "$f"; '
                   'head -c 4096 "/sys/class/block/$1/$f"; echo; fi; done')


def path_probe_argv(path: str) -> tuple[str, ...]:
    """The path and its marker are positional parameters, never shell text."""
    return ("sh", "-c", _PATH_PROBE, "kvgate-path-probe", path, path + CREATED_SUFFIX)


def identity_argv(kname: str) -> tuple[str, ...]:
    return ("sh", "-c", _IDENTITY_PROBE, "kvgate-identity", kname)


def block_probe_plan(path: str, what: str) -> list[tuple[str, tuple[str, ...], bool]]:
    """Pure: what :func:`check_write` sends to decide on a block device ``path`` (``what`` it is, for the plan's
    text), as (description, argv, sent only when its condition holds): the path probe, lsblk, blkid -p, and the
    sysfs serial when lsblk shows none (its kernel name is then known: ``<kernel name>`` here)."""
    return [(f"the write guard on {what}: what it is, whether kvgate created it", path_probe_argv(path), False),
            (f"the write guard on {what}: filesystem, partition table, serial, mounts (lsblk)",
             LSBLK_ARGV + (path,), False),
            (f"the write guard on {what}: signatures on the device itself (blkid -p)", blkid_argv(path), False),
            (f"the write guard on {what}: its serial from sysfs, when lsblk shows none",
             identity_argv("<kernel name>"), True)]


@dataclass(frozen=True)
class PathFacts:
    """What ``path_probe_argv`` saw: ``kind`` is block, file, other or missing."""

    kind: str
    created_by_kvgate: bool
    size_bytes: int | None


def parse_path_probe(text: str) -> PathFacts | None:
    """Pure: the three lines of the path probe; None when the output has another shape."""
    lines = text.split()
    if len(lines) != 3 or lines[0] not in ("block", "file", "other", "missing") or \
            lines[1] not in ("created", "foreign"):
        return None
    size = int(lines[2]) if lines[2].isdigit() else None
    return PathFacts(lines[0], lines[1] == "created", size)


def parse_identity(text: str) -> dict[str, str]:
    """Pure: ``attr=value`` lines of the identity probe; empty values (e.g. virtio without serial) dropped."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key in ("serial", "device/serial", "loop/backing_file") and value.strip():
            out[key] = value.strip()
    return out


def device_serial(device: BlockDevice, identity: dict[str, str]) -> tuple[str | None, str | None]:
    """(serial, where it came from): lsblk, sysfs serial, sysfs device/serial, or a loop's backing file."""
    if device.serial:
        return device.serial, "lsblk SERIAL"
    for key in ("serial", "device/serial"):
        if identity.get(key):
            return identity[key], f"/sys/class/block/{device.name}/{key}"
    if identity.get("loop/backing_file"):
        return "loop:" + identity["loop/backing_file"], f"/sys/class/block/{device.name}/loop/backing_file"
    return None, None


def decide_block(device: BlockDevice | None, probe: dict[str, str], blkid_rc: int | None,
                 allow_destructive: bool, serial: str | None) -> tuple[bool, str]:
    """Pure: the block-device rule over parsed lsblk (``device``, serial already resolved) and blkid output."""
    if device is not None and blkid_rc not in (0, 2):
        # 2: no signature found; anything else (8: ambivalent result, 4: usage, ...) cannot be trusted
        return False, f"blkid -p could not tell what {device.path} holds (exit {blkid_rc})"
    if device is not None and blkid_rc == 0 and not _named_signature(probe):
        return False, f"blkid -p found a signature on {device.path} but its answer named none (output lost?)"
    return write_allowed(device, probe, allow_destructive, serial)


def _named_signature(probe: dict[str, str]) -> bool:
    """blkid exits 0 only when it found something: a filesystem, partition table or other signature it names."""
    return any(probe.get(k) for k in ("TYPE", "PTTYPE", "PART_ENTRY_SCHEME", "USAGE"))


def decide_same_storage(device: BlockDevice | None, probe: dict[str, str], blkid_rc: int | None,
                        same: "WriteDecision") -> tuple[bool, str]:
    """Pure: a second path to the storage ``same`` judged (a namespace over a loopback's backing device)."""
    if device is None:
        return False, "device not found in lsblk output"
    if blkid_rc not in (0, 2):
        return False, f"blkid -p could not tell what {device.path} holds (exit {blkid_rc})"
    if blkid_rc == 0 and not _named_signature(probe):
        return False, f"blkid -p found a signature on {device.path} but its answer named none (output lost?)"
    if not same.allowed:
        return False, f"{device.path} reaches the storage of {same.path}, which the guard refused: {same.reason}"
    never = never_writable(device)
    if never:
        return False, never
    held = holdings(device, probe)
    if held and not same.allow_destructive:
        return False, (f"{device.path} holds {', '.join(held)} although {same.path}, the same storage, was judged "
                       "blank; nothing is written")
    return True, (f"{device.path} reaches the storage of {same.path}, which the guard allowed ({same.reason}); "
                  "it is neither read-only nor mounted")


@dataclass(frozen=True)
class WriteDecision:
    """May kvgate write to ``path``? With everything the answer rests on."""

    path: str
    purpose: str
    expect: str
    allowed: bool
    reason: str
    node: str = ""
    kind: str | None = None
    created_by_kvgate: bool | None = None
    allow_destructive: bool = False
    target_serial: str | None = None
    device_serial: str | None = None
    serial_source: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=1, sort_keys=True, default=str) + "\n"

    def refusal(self) -> str:
        return f"refusing to write to {self.path} on {self.node or 'the node'} ({self.purpose}): {self.reason}"


def probe_path(run: Runner, path: str) -> tuple[PathFacts | None, str]:
    """(facts, error text)."""
    r = _ask(run, "guard-stat", path_probe_argv(path), lambda x: not x.ok or parse_path_probe(x.stdout) is not None)
    facts = parse_path_probe(r.stdout) if r.ok else None
    return facts, "" if facts else (r.summary() if not r.ok else f"unexpected output {r.stdout[:200]!r}")


def _decide_file(path: str, facts: PathFacts) -> tuple[bool, str]:
    """Pure: the file rule: kvgate writes a file that does not exist yet or one it created, nothing else."""
    if facts.kind == "missing":
        return True, f"{path} does not exist; kvgate creates it"
    if facts.kind == "file" and facts.created_by_kvgate:
        return True, f"{path} was created by kvgate ({path}{CREATED_SUFFIX})"
    if facts.kind == "file":
        return False, (f"{path} exists and was not created by kvgate (no {path}{CREATED_SUFFIX}); "
                       "kvgate only writes files it created")
    if facts.kind == "block":
        return False, f"{path} is a block device, not a file; declare it as a block target (see allow_destructive)"
    return False, f"{path} is not a regular file"


def check_write(run: Runner, path: str, *, expect: Expect, purpose: str, node: str = "",
                allow_destructive: bool = False, serial: str | None = None,
                facts: PathFacts | None = None, same_storage_as: WriteDecision | None = None) -> WriteDecision:
    """Run the probes on the node and decide. Never raises for what the node says: a failed probe refuses.
    ``same_storage_as``: the decision on the device whose storage ``path`` reaches (block only; see above)."""
    if same_storage_as is not None:
        allow_destructive = same_storage_as.allowed and same_storage_as.allow_destructive
        serial = None
    d = dict(path=path, purpose=purpose, expect=expect, node=node, allow_destructive=allow_destructive,
             target_serial=serial)
    if facts is None:
        facts, err = probe_path(run, path)
        if facts is None:
            return WriteDecision(allowed=False, reason=f"cannot inspect {path}: {err}", **d)
    d.update(kind=facts.kind, created_by_kvgate=facts.created_by_kvgate)
    ev: dict[str, Any] = {"path": facts.__dict__}
    if expect == "file":
        ok, why = _decide_file(path, facts)
        return WriteDecision(allowed=ok, reason=why, evidence=ev, **d)
    if facts.kind != "block":
        what = "does not exist" if facts.kind == "missing" else "is not a block device"
        return WriteDecision(allowed=False, reason=f"{path} {what}", evidence=ev, **d)
    r = _ask(run, "guard-lsblk", LSBLK_ARGV + (path,), lambda x: not x.ok or _json_object(x.stdout))
    ev["lsblk_rc"] = r.rc
    devices = []
    if r.ok:
        try:
            devices = parse_lsblk(r.stdout)
        except (ValueError, TypeError, AttributeError) as exc:
            ev["lsblk_error"] = f"unreadable lsblk output: {exc}"
    # lsblk given one device lists it as the only root (with what sits on it as children); a symlink such as
    # /dev/disk/by-id/... resolves to the kernel name, so match by position rather than by path.
    device = devices[0] if len(devices) == 1 else None
    if device is None:
        why = ev.get("lsblk_error") or (r.summary() if not r.ok else f"lsblk listed {len(devices)} devices")
        return WriteDecision(allowed=False, reason=f"cannot inspect {path} with lsblk: {why}", evidence=ev, **d)
    ev["lsblk"] = _device_dict(device)
    b = _ask(run, "guard-blkid", blkid_argv(path),
             lambda x: x.rc != 0 or _named_signature(parse_blkid_export(x.stdout)))
    probe = parse_blkid_export(b.stdout) if b.rc == 0 else {}
    ev.update(blkid_rc=b.rc, blkid=probe)
    identity: dict[str, str] = {}
    if not device.serial and _KNAME_RE.match(device.name):
        i = run("guard-identity", identity_argv(device.name), PROBE_TIMEOUT_S)
        identity = parse_identity(i.stdout) if i.ok else {}
        ev["identity"] = identity
    dev_serial, source = device_serial(device, identity)
    device = replace(device, serial=dev_serial)
    if same_storage_as is not None:
        ev["same_storage_as"] = same_storage_as.path
        ok, why = decide_same_storage(device, probe, b.rc, same_storage_as)
    else:
        ok, why = decide_block(device, probe, b.rc, allow_destructive, serial)
    return WriteDecision(allowed=ok, reason=why, device_serial=dev_serial, serial_source=source, evidence=ev, **d)


PROBE_ATTEMPTS = 3


def _ask(run: Runner, name: str, argv: Sequence[str], answered: Callable[[Any], bool]) -> Any:
    """Run a probe; an answer that cannot be what the command prints (exit 0 with its output cut short or lost
    on the way, as seen over SSH to a loaded guest) is asked again, up to PROBE_ATTEMPTS times. What still does
    not answer is decided on as it is: the rules above refuse it."""
    for _ in range(PROBE_ATTEMPTS):
        r = run(name, argv, PROBE_TIMEOUT_S)
        if r.timed_out or r.error or answered(r):
            return r
    return r


def _json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):
        return False


def _device_dict(dev: BlockDevice) -> dict[str, Any]:
    out = {k: getattr(dev, k) for k in dev.__dataclass_fields__ if k != "children"}
    out["children"] = [_device_dict(c) for c in dev.children]
    return out
