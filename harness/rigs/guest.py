"""A Debian-kernel qemu guest that serves as a single-node NVMe-oF loopback node.

On a host whose kernel lacks nvmet/nvme-tcp/configfs (this machine, CI), kvgate boots
Debian's own kernel (``linux-image-amd64`` resolved to its real image package, fetched
with ``apt-get download`` and unpacked with ``dpkg -x``, never installed into /) under
qemu TCG with an initramfs that holds:

* the kernel modules the loopback needs, dependency closure from ``modprobe
  --show-depends`` on a ``depmod -b`` tree, plus real ``kmod`` so ``modprobe`` works in
  the guest exactly as on a real host;
* busybox (static) for the base system and init (busybox init reaps orphans);
* fio, nvme-cli, sshd and sftp-server copied from this host with their shared libraries;
* soft-RoCE: ``rdma_rxe`` with the RDMA core (ib_core, ib_uverbs, rdma_cm, iw_cm, ib_cm), ``nvme-rdma`` and
  ``nvmet-rdma``, the crc32 modules rdma_rxe asks the crypto API for, and iproute2's ``rdma`` tool. An
  RDMA link is added on the guest's virtio NIC (``rdma link add ... type rxe netdev eth0``), never on
  ``lo``, where ``nvme connect -t rdma`` fails with ``rdma_resolve_route failed (-110)``.

qemu user networking with ``restrict=on,hostfwd=tcp:127.0.0.1:PORT-:22`` makes the guest
an ordinary SSH node on the loopback address. The guest is started in its own session
and stopped by PID (whole process group).

The build is cached under ``~/.cache/kvgate/guest/<key>`` (``$KVGATE_CACHE_DIR``
overrides the root), keyed by the kernel package version, the versions of the host
packages copied in, and the text of the init files below; SSH keys live in
``<root>/keys`` and survive rebuilds so a known_hosts entry stays valid.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from ..errors import HarnessError
from ..transport import SSHTransport, Transport, open_transport
from ..transport.local import free_port
from ..transport.procgroup import group_alive, terminate
from .host import run_host

# Modules the guest needs; their dependency closure is resolved with modprobe --show-depends.
GUEST_MODULES = (
    "virtio_pci", "virtio_net", "configfs", "nvmet", "nvmet-tcp", "nvme-tcp",
    "null_blk", "brd", "crc32c_generic", "ext4", "loop",
    # soft-RoCE and NVMe over RDMA; rdma_rxe asks the crypto API for "crc32" at link creation (no module
    # dependency names it), so both implementations ride along
    "crc32_generic", "crc32-pclmul", "rdma_rxe", "ib_uverbs", "rdma_cm", "nvme-rdma", "nvmet-rdma",
    # the host's tree shared read-only over virtio-9p (9pnet, netfs and fscache come as dependencies): the
    # node's engine interpreter (torch, LMCache) runs from it, chrooted (kvgate-engine-python below)
    "9pnet_virtio", "9p",
    # a slow path (harness.rigs.faults): netem delay on one nvmet port's traffic, chosen by a u32 filter
    "sch_netem", "sch_prio", "cls_u32",
)

# Host binaries copied into the guest with their libraries, and the package each comes from.
HOST_BINARIES = {
    "/usr/bin/fio": "fio",
    "/usr/sbin/nvme": "nvme-cli",
    "/usr/sbin/sshd": "openssh-server",
    "/usr/lib/openssh/sftp-server": "openssh-sftp-server",
    "/usr/bin/kmod": "kmod",
    # the write guard (harness.writeguard) inspects a backing device with lsblk and blkid -p before writing
    "/usr/bin/lsblk": "util-linux",
    "/usr/sbin/blkid": "util-linux",
    # RDMA links (soft-RoCE) and the RDMA facts kvgate records; not `ip`: busybox's applet serves the base
    # system, and a real ip copied over /bin/ip would overwrite busybox itself through the applet's symlink
    "/usr/bin/rdma": "iproute2",
    # kv-read: the pool's block device (findmnt) and a filesystem on an NVMe-oF namespace (mke2fs)
    "/usr/bin/findmnt": "util-linux",
    "/usr/sbin/mke2fs": "e2fsprogs",
    # faults (harness.rigs.faults): each fault step stamps the node's clock in ns (busybox date has no %N),
    # the time base of fio's completion log; tc for a slow path (netem)
    "/usr/bin/date": "coreutils",
    "/usr/sbin/tc": "iproute2",
}
# Host tools the build itself runs, and the package that provides each.
BUILD_TOOLS = {
    "qemu-system-x86_64": "qemu-system-x86",
    "busybox": "busybox-static",
    "apt-get": "apt",
    "apt-cache": "apt",
    "dpkg-deb": "dpkg",
    "dpkg-query": "dpkg",
    "depmod": "kmod",
    "modprobe": "kmod",
    "ssh-keygen": "openssh-client",
    "cpio": "cpio",
    "ldd": "libc-bin",
}
KMOD_LINKS = ("modprobe", "insmod", "rmmod", "lsmod", "depmod", "modinfo")
# busybox applets never linked: real tools replace them, or (mke2fs) they shadow real ones.
# tc: busybox's applet on /bin (first in the guest's PATH) shadowed iproute2's /usr/sbin/tc and refused the slow
# path's `tc qdisc add dev lo root handle ...` ("invalid argument 'root' to 'command'")
BUSYBOX_SKIP = set(KMOD_LINKS) | {"mke2fs", "mkfs.ext2", "init", "linuxrc", "blkid", "lsblk", "tc"}

GUEST_HOSTNAME = "kvgate-guest"
# Debian 6.1's hardened usercopy takes nvmet-tcp's receive into a multi-page buffer for an exposure and BUGs
# (mm/usercopy.c:101 from nvmet_tcp_io_work, seen on large writes: LMCache storing 4 MiB chunks on ext4 over
# NVMe/TCP); the worker dies, keep-alive expires and every I/O on the namespace hangs. The check is off in the
# guest, which runs nothing but kvgate's own loopback.
GUEST_KERNEL_ARGS = "hardened_usercopy=off"
HOST_SHARE_TAG = "hostroot"
HOST_SHARE_DIR = "/host"
ENGINE_PYTHON = "/usr/local/bin/kvgate-engine-python"
ENGINE_PYTHON_ARG = "kvgate.engine_python"
READY_MARKER = "KVGATE-GUEST-READY"

INITTAB = """\
::sysinit:/etc/init.d/rcS
::respawn:/usr/sbin/sshd -D -e -f /etc/ssh/sshd_config
::shutdown:/bin/sync
"""

RCS = f"""\
#!/bin/sh
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
modprobe configfs && mount -t configfs configfs /sys/kernel/config
modprobe virtio_pci
modprobe virtio_net
hostname {GUEST_HOSTNAME}
ip link set lo up
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
ip route add default via 10.0.2.2
mkdir -p /run/sshd /root
# the host's tree, when qemu shares it (tag hostroot, read-only on both sides): see kvgate-engine-python
modprobe 9pnet_virtio && modprobe 9p
if grep -qx {HOST_SHARE_TAG} /sys/bus/virtio/drivers/9pnet_virtio/*/mount_tag 2>/dev/null; then
  mkdir -p {HOST_SHARE_DIR}
  mount -t 9p -o ro,trans=virtio,version=9p2000.L,msize=512000,cache=loose {HOST_SHARE_TAG} {HOST_SHARE_DIR}
fi
chmod 755 /run/sshd
chmod 700 /root
echo "{READY_MARKER} kernel=$(uname -r)" > /dev/console
"""

# The node's engine interpreter in the guest: the host's own (named on the kernel command line by guest-up),
# run chrooted on the host's tree (shared read-only at /host) in a private mount namespace where the guest's
# /dev /proc /sys /run /tmp /mnt are bound in at the same paths, so every path (work dir, pool, device stat)
# means the same inside and out, and nothing is ever written into the host's tree.
ENGINE_WRAPPER = f"""\
#!/bin/sh
py=$(sed -n 's/.*{ENGINE_PYTHON_ARG.replace(".", "[.]")}=\\([^ ]*\\).*/\\1/p' /proc/cmdline)
if [ -z "$py" ]; then
  echo "kvgate-engine-python: no {ENGINE_PYTHON_ARG}= on the kernel command line (kvgate loopback guest-up --engine-python PATH)" >&2
  exit 127
fi
if ! grep -q " {HOST_SHARE_DIR} 9p ro[, ]" /proc/mounts; then
  echo "kvgate-engine-python: the host's tree is not mounted read-only at {HOST_SHARE_DIR} (a guest booted without its share)" >&2
  exit 127
fi
# the host's tree is read-only: numba (LMCache's CPU kernels) caches its compiled functions in the guest's /tmp
export NUMBA_CACHE_DIR="${{NUMBA_CACHE_DIR:-/tmp/kvgate-engine-cache/numba}}" PYTHONDONTWRITEBYTECODE=1
# An interpreter under a directory the guest's own is bound over (a checkout in /tmp, as CI clones it): the
# top directory of its path (e.g. /tmp/ci) stays the host's, at the same path, over the guest's.
case "$py" in
  /tmp/*|/run/*|/mnt/*) keep=$(echo "$py" | cut -d/ -f1-3) ;;
  *) keep= ;;
esac
exec unshare -m sh -c '
  keep=$1; shift
  if [ -n "$keep" ]; then mkdir -p /run/kvgate-keep && mount --bind "{HOST_SHARE_DIR}$keep" /run/kvgate-keep || exit 126; fi
  for d in dev proc sys run tmp mnt; do mount --rbind "/$d" "{HOST_SHARE_DIR}/$d" || exit 126; done
  if [ -n "$keep" ]; then mkdir -p "{HOST_SHARE_DIR}$keep" && mount --bind /run/kvgate-keep "{HOST_SHARE_DIR}$keep" || exit 126; fi
  exec chroot {HOST_SHARE_DIR} "$@"' kvgate-engine-python "$keep" "$py" "$@"
"""

SSHD_CONFIG = """\
Port 22
ListenAddress 0.0.0.0
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PubkeyAuthentication yes
AuthorizedKeysFile /etc/ssh/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
PidFile /run/sshd.pid
Subsystem sftp /usr/lib/openssh/sftp-server
"""

PASSWD = "root:x:0:0:root:/root:/bin/sh\nsshd:x:100:65534::/run/sshd:/bin/false\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
GROUP = "root:x:0:\nnogroup:x:65534:\n"
SHADOW = "root:*:19000:0:99999:7:::\nsshd:*:19000:0:99999:7:::\nnobody:*:19000:0:99999:7:::\n"

# Bump when the layout of the initramfs changes in a way the texts above do not show.
BUILD_FORMAT = "2"


class GuestError(HarnessError):
    """The loopback guest could not be built, started or stopped."""


@dataclasses.dataclass(frozen=True)
class GuestImage:
    """A built guest: kernel + initramfs + the SSH keys that reach it."""

    key: str
    dir: Path
    kernel_path: Path
    initrd_path: Path
    kernel_release: str
    kernel_package: str
    identity_file: Path
    host_public_key: str
    versions: dict


@dataclasses.dataclass
class GuestState:
    """A running guest as recorded in its state file (enough to reach and stop it)."""

    pid: int
    ssh_port: int
    host: str
    user: str
    identity_file: str
    known_hosts_path: str
    console_log: str
    initrd_path: str
    kernel_release: str
    started_at: float
    ready_s: float | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_file(cls, path: Path) -> "GuestState":
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise GuestError(f"{path}: cannot read guest state: {exc}") from exc
        return cls(**data)


def default_cache_root() -> Path:
    """``$KVGATE_CACHE_DIR/guest`` or ``~/.cache/kvgate/guest``."""
    base = os.environ.get("KVGATE_CACHE_DIR")
    if base:
        return Path(base) / "guest"
    return Path.home() / ".cache" / "kvgate" / "guest"


def _run(argv: list[str], cwd: Path | None = None, check: bool = True, input_bytes: bytes | None = None,
         timeout_s: float = 600) -> subprocess.CompletedProcess:
    return run_host(argv, cwd=cwd, check=check, input_bytes=input_bytes, timeout_s=timeout_s, error=GuestError,
                    install_hint=_install_hint)


def _install_hint(tool: str) -> str:
    pkg = BUILD_TOOLS.get(tool, tool)
    return f"install the Debian package {pkg} (apt-get install {pkg})"


def check_build_tools() -> None:
    """Raise GuestError naming every missing package at once."""
    missing = sorted({pkg for tool, pkg in BUILD_TOOLS.items() if shutil.which(tool) is None
                      and not Path("/usr/sbin", tool).exists()})
    missing += sorted({pkg for path, pkg in HOST_BINARIES.items() if not Path(path).exists()})
    if missing:
        pkgs = " ".join(sorted(set(missing)))
        raise GuestError(f"missing packages for the loopback guest: {pkgs} (apt-get install {pkgs})")


def host_package_versions() -> dict[str, str]:
    """Versions of the host packages whose files go into the guest."""
    pkgs = sorted(set(HOST_BINARIES.values()) | {"busybox-static"})
    proc = _run(["dpkg-query", "-W", "-f", "${Package}\t${Version}\n", *pkgs], check=False)
    versions = {}
    for line in proc.stdout.decode().splitlines():
        name, _, version = line.partition("\t")
        if version:
            versions[name] = version
    missing = [p for p in pkgs if p not in versions]
    if missing:
        raise GuestError(f"missing packages for the loopback guest: {' '.join(missing)} "
                         f"(apt-get install {' '.join(missing)})")
    return versions


def parse_apt_depends(depends: str, prefix: str = "linux-image-") -> str | None:
    """First package named ``prefix*`` in a Debian Depends field (alternatives allowed)."""
    for clause in depends.split(","):
        for alt in clause.split("|"):
            name = alt.strip().split(" ", 1)[0].split(":", 1)[0]
            if name.startswith(prefix):
                return name
    return None


DEFAULT_KERNEL_PACKAGE = "linux-image-amd64"  # Debian's own kernel, whatever the release's metapackage names


def check_kernel_package(package: str) -> str:
    """``package`` when it is a Debian linux-image-* package name (GuestError otherwise: bad input, before
    anything is fetched)."""
    if not re.fullmatch(r"linux-image-[a-z0-9][a-z0-9.+~-]*", package):
        raise GuestError(f"--kernel-package {package!r}: expected a Debian linux-image-* package name, "
                         "e.g. linux-image-6.12-amd64")
    return package


def resolve_kernel_package(package: str = DEFAULT_KERNEL_PACKAGE) -> tuple[str, str]:
    """(image package, version) for ``package``: the linux-image-* package a metapackage (linux-image-amd64,
    linux-image-6.12-amd64) depends on right now, or ``package`` itself when it is the image."""
    check_kernel_package(package)
    proc = _run(["apt-cache", "show", "--no-all-versions", package], check=False)
    if proc.returncode != 0 or not proc.stdout:
        raise GuestError(f"apt-cache knows no {package}: run apt-get update "
                         f"({proc.stderr.decode(errors='replace').strip()})")
    fields = {}
    for line in proc.stdout.decode().splitlines():
        if ":" in line and not line.startswith(" "):
            k, _, v = line.partition(":")
            fields.setdefault(k.strip(), v.strip())
    pkg = parse_apt_depends(fields.get("Depends", ""))
    if not pkg:  # the image itself depends on no other image
        if not fields.get("Version"):
            raise GuestError(f"{package} has no version in apt-cache")
        return package, fields["Version"]
    proc = _run(["apt-cache", "show", "--no-all-versions", pkg])
    version = ""
    for line in proc.stdout.decode().splitlines():
        if line.startswith("Version:"):
            version = line.split(":", 1)[1].strip()
            break
    return pkg, version


def _cache_key(kernel_pkg: str, kernel_version: str, versions: dict[str, str]) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"kernel": [kernel_pkg, kernel_version], "host": versions,
                         "modules": GUEST_MODULES, "format": BUILD_FORMAT, "host_binaries": HOST_BINARIES,
                         "busybox_skip": sorted(BUSYBOX_SKIP),
                         "texts": [INITTAB, RCS, SSHD_CONFIG, PASSWD, GROUP, SHADOW, ENGINE_WRAPPER]},
                        sort_keys=True).encode())
    return h.hexdigest()[:16]


def _ensure_keys(root: Path) -> tuple[Path, Path]:
    keys = root / "keys"
    keys.mkdir(parents=True, exist_ok=True)
    client, host = keys / "id_ed25519", keys / "ssh_host_ed25519_key"
    for path, comment in ((client, "kvgate-client"), (host, "kvgate-guest-host")):
        if not path.exists():
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
    client.chmod(0o600)
    return client, host


def _libraries(binary: str) -> list[str]:
    proc = _run(["ldd", binary], check=False)
    libs = []
    for line in proc.stdout.decode().splitlines():
        parts = line.split()
        if "=>" in parts:
            idx = parts.index("=>")
            if idx + 1 < len(parts) and parts[idx + 1].startswith("/"):
                libs.append(parts[idx + 1])
        elif parts and parts[0].startswith("/"):
            libs.append(parts[0])  # the dynamic loader
    return libs


def _copy_into(stage: Path, src: str, dest: str | None = None) -> None:
    target = stage / (dest or src).lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(os.path.realpath(src), target)


def _unpack_kernel(tmp: Path, kernel_pkg: str, kernel_version: str) -> tuple[Path, Path, str]:
    """Download the kernel package into ``tmp``, unpack it and run depmod: (its root, its vmlinuz, its release)."""
    _run(["apt-get", "download", f"{kernel_pkg}={kernel_version}"], cwd=tmp, timeout_s=900)
    debs = sorted(tmp.glob(f"{kernel_pkg}_*.deb"))
    if not debs:
        raise GuestError(f"apt-get download {kernel_pkg} produced no .deb in {tmp}")
    kroot = tmp / "kernel"
    _run(["dpkg-deb", "-x", str(debs[0]), str(kroot)])
    vmlinuz = sorted((kroot / "boot").glob("vmlinuz-*"))
    if not vmlinuz:
        raise GuestError(f"{debs[0].name} holds no boot/vmlinuz-*")
    release = vmlinuz[0].name[len("vmlinuz-"):]
    _run(["depmod", "-b", str(kroot), release])
    return kroot, vmlinuz[0], release


def _module_files(kroot: Path, release: str) -> list[str]:
    """The .ko files GUEST_MODULES need in the unpacked kernel, dependencies first (modprobe --show-depends)."""
    modules: list[str] = []
    for mod in GUEST_MODULES:
        proc = _run(["modprobe", "-d", str(kroot), "-S", release, "--show-depends", mod])
        for line in proc.stdout.decode().splitlines():
            parts = line.split()
            if parts and parts[0] == "insmod" and parts[1] not in modules:
                modules.append(parts[1])
    return modules


def build_guest(cache_root: Path | None = None, progress=lambda msg: None,
                kernel_package: str = DEFAULT_KERNEL_PACKAGE) -> GuestImage:
    """Build (or reuse from cache) the guest kernel + initramfs; ``kernel_package``: a Debian linux-image-*
    metapackage or image (another release's kernel, e.g. linux-image-6.12-amd64 for features 6.1 lacks). Returns
    the image."""
    root = Path(cache_root or default_cache_root())
    check_build_tools()
    kernel_pkg, kernel_version = resolve_kernel_package(kernel_package)
    versions = host_package_versions()
    key = _cache_key(kernel_pkg, kernel_version, versions)
    out = root / key
    client_key, host_key = _ensure_keys(root)
    meta_path = out / "image.json"
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        progress(f"guest image cached: {out}")
        return _image_from_meta(out, meta, client_key, host_key)

    root.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="build-", dir=root) as tmp_s:
        tmp = Path(tmp_s)
        progress(f"downloading {kernel_pkg} {kernel_version}")
        kroot, vmlinuz, release = _unpack_kernel(tmp, kernel_pkg, kernel_version)
        moddir = kroot / "lib" / "modules" / release

        stage = tmp / "stage"
        stage.mkdir()
        progress(f"resolving modules for {release}")
        modules = _module_files(kroot, release)
        for mod_path in modules:
            rel = os.path.relpath(mod_path, kroot)
            _copy_into(stage, mod_path, "/" + rel)
        for name in ("modules.order", "modules.builtin", "modules.builtin.modinfo"):
            if (moddir / name).exists():
                _copy_into(stage, str(moddir / name), f"/lib/modules/{release}/{name}")
        _populate_base(stage, host_key, client_key)
        _run(["depmod", "-b", str(stage), release])

        progress("writing initramfs")
        initrd_tmp = tmp / "initrd.cpio"
        _write_cpio(stage, initrd_tmp)
        out_tmp = root / f".{key}.tmp"
        shutil.rmtree(out_tmp, ignore_errors=True)
        out_tmp.mkdir()
        shutil.copy2(vmlinuz, out_tmp / "vmlinuz")
        shutil.move(str(initrd_tmp), out_tmp / "initrd.cpio")
        meta = {"key": key, "kernel_package": kernel_pkg, "kernel_version": kernel_version,
                "kernel_release": release, "versions": versions, "modules": [os.path.basename(m) for m in modules],
                "build_s": round(time.monotonic() - t0, 3)}
        (out_tmp / "image.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
        shutil.rmtree(out, ignore_errors=True)
        out_tmp.rename(out)
    progress(f"guest image built in {time.monotonic() - t0:.1f} s: {out}")
    return _image_from_meta(out, meta, client_key, host_key)


def _image_from_meta(out: Path, meta: dict, client_key: Path, host_key: Path) -> GuestImage:
    return GuestImage(
        key=meta["key"], dir=out, kernel_path=out / "vmlinuz", initrd_path=out / "initrd.cpio",
        kernel_release=meta["kernel_release"],
        kernel_package=f"{meta['kernel_package']} {meta['kernel_version']}",
        identity_file=client_key,
        host_public_key=Path(str(host_key) + ".pub").read_text().split()[0:2] and
        " ".join(Path(str(host_key) + ".pub").read_text().split()[0:2]),
        versions=meta["versions"],
    )


def _populate_base(stage: Path, host_key: Path, client_key: Path) -> None:
    for d in ("bin", "sbin", "usr/bin", "usr/sbin", "usr/lib", "usr/lib64", "etc/ssh", "etc/init.d",
              "proc", "sys", "dev", "run", "tmp", "root", "var/empty", "mnt"):
        (stage / d).mkdir(parents=True, exist_ok=True)
    # Debian is usr-merged: libraries resolve under both /lib and /usr/lib.
    for link, to in (("lib", "usr/lib"), ("lib64", "usr/lib64")):
        if not (stage / link).exists():
            os.symlink(to, stage / link)
    busybox = shutil.which("busybox")
    _copy_into(stage, busybox, "/bin/busybox")
    for lib in _libraries(busybox):
        _copy_into(stage, lib)
    applets = _run([busybox, "--list"]).stdout.decode().split()
    for applet in applets:
        if applet in BUSYBOX_SKIP or applet == "busybox":
            continue
        os.symlink("busybox", stage / "bin" / applet)
    os.symlink("bin/busybox", stage / "init")
    for binary in HOST_BINARIES:
        _copy_into(stage, binary)
        for lib in _libraries(binary):
            _copy_into(stage, lib)
    for name in KMOD_LINKS:
        os.symlink("../bin/kmod", stage / "usr" / "sbin" / name)
    # the kernel's module autoloader runs /sbin/modprobe (e.g. rdma-link-rxe, crypto-crc32)
    os.symlink("../usr/bin/kmod", stage / "sbin" / "modprobe")
    files = {
        "etc/inittab": INITTAB, "etc/init.d/rcS": RCS, "etc/ssh/sshd_config": SSHD_CONFIG,
        "etc/passwd": PASSWD, "etc/group": GROUP, "etc/shadow": SHADOW,
        "etc/hostname": GUEST_HOSTNAME + "\n",
        ENGINE_PYTHON.lstrip("/"): ENGINE_WRAPPER,
        "etc/ssh/authorized_keys": Path(str(client_key) + ".pub").read_text(),
        "etc/ssh/ssh_host_ed25519_key": host_key.read_text(),
        "etc/ssh/ssh_host_ed25519_key.pub": Path(str(host_key) + ".pub").read_text(),
    }
    for rel, text in files.items():
        (stage / rel).parent.mkdir(parents=True, exist_ok=True)
        (stage / rel).write_text(text)
    (stage / "etc/init.d/rcS").chmod(0o755)
    (stage / ENGINE_PYTHON.lstrip("/")).chmod(0o755)
    (stage / "etc/shadow").chmod(0o600)
    (stage / "etc/ssh/ssh_host_ed25519_key").chmod(0o600)


def _write_cpio(stage: Path, dest: Path) -> None:
    names = ["."]
    for dirpath, dirnames, filenames in os.walk(stage):
        dirnames.sort()
        rel = os.path.relpath(dirpath, stage)
        for name in sorted(dirnames) + sorted(filenames):
            names.append(os.path.join(rel, name) if rel != "." else name)
    listing = ("\n".join(names) + "\n").encode()
    with open(dest, "wb") as fh:
        proc = subprocess.run(["cpio", "--quiet", "-o", "-H", "newc", "-R", "0:0"], cwd=stage,
                              input=listing, stdout=fh, stderr=subprocess.PIPE)
    if proc.returncode != 0:
        raise GuestError(f"cpio failed: {proc.stderr.decode(errors='replace').strip()}")


# --------------------------------------------------------------------------- running


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def check_engine_python(path: str) -> str:
    """The host interpreter the guest runs as its engine interpreter: an absolute path without blanks (it rides
    on the kernel command line) to an executable file on this host; GuestError otherwise."""
    if not path.startswith("/") or any(c.isspace() or c in "\"'\\" for c in path):
        raise GuestError(f"--engine-python {path!r}: expected an absolute path without blanks or quotes")
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise GuestError(f"--engine-python {path}: not an executable file on this host")
    return path


def qemu_argv(image: GuestImage, ssh_port: int, console_log: Path, memory_mib: int = 2048,
              smp: int = 2, kernel_args: str = "", engine_python: str | None = None) -> list[str]:
    """The qemu command line (TCG, user networking restricted to a 127.0.0.1 forward); ``kernel_args`` are
    appended to the kernel command line (e.g. ``nvme_core.multipath=N`` for per-path NVMe devices).

    With ``engine_python`` (a host path) the host's tree is shared with the guest over virtio-9p, read-only in
    qemu (``readonly=on``: the guest cannot write whatever it mounts) and mounted read-only at /host, and the
    path rides on the kernel command line for the guest's ``kvgate-engine-python``. ``multidevs=remap``: the
    host's / spans filesystems whose inode numbers collide (procfs, sysfs, tmpfs roots are all inode 1); without
    it the guest's 9p client takes /host/proc and /host/sys for one inode, the engine's chroot binds /sys over
    both, and the engine finds no /proc/cpuinfo nor /proc/sys/vm/drop_caches."""
    share: list[str] = []
    if engine_python is not None:
        kernel_args = f"{kernel_args} {ENGINE_PYTHON_ARG}={engine_python}".strip()
        share = ["-fsdev", "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap",
                 "-device", f"virtio-9p-pci,fsdev=hostroot,mount_tag={HOST_SHARE_TAG}"]
    return [
        "qemu-system-x86_64",
        "-accel", "tcg,thread=multi", "-cpu", "max", "-smp", str(smp), "-m", str(memory_mib),
        "-kernel", str(image.kernel_path), "-initrd", str(image.initrd_path),
        "-append", (f"console=ttyS0 rdinit=/init panic=-1 nokaslr mitigations=off {GUEST_KERNEL_ARGS} "
                    + kernel_args).strip(),
        "-netdev", f"user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:{ssh_port}-:22",
        "-device", "virtio-net-pci,netdev=n0",
        *share,
        "-display", "none", "-monitor", "none", "-no-reboot",
        "-serial", f"file:{console_log}",
        "-name", f"kvgate-guest-{image.key}",
    ]


def ssh_banner_ready(port: int, host: str = "127.0.0.1", timeout_s: float = 2.0) -> bool:
    """True when an SSH server answers with its banner (hostfwd accepts before sshd runs)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as s:
            s.settimeout(timeout_s)
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def _console_tail(path: Path, n: int = 20) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no console log)"
    return "\n".join(lines[-n:])


def start_guest(image: GuestImage, state_dir: Path, ssh_port: int | None = None, memory_mib: int = 2048,
                smp: int = 2, boot_timeout_s: float = 240.0, progress=lambda msg: None,
                kernel_args: str = "", engine_python: str | None = None) -> GuestState:
    """Start qemu in its own session, wait for sshd's banner, record the state file.

    With ``engine_python``, the host's tree is shared read-only and the guest's ``kvgate-engine-python`` runs
    that interpreter (:func:`qemu_argv`). Picks another port when the requested one is taken. On a boot failure
    qemu is stopped, the console log stays in ``state_dir`` and GuestError carries its tail.
    """
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    console_log = state_dir / "console.log"
    qemu_log = state_dir / "qemu.stderr"
    last_error = ""
    for attempt in range(5):
        port = ssh_port if (ssh_port and attempt == 0) else free_port()
        if ssh_port and attempt == 0 and not port_is_free(port):
            progress(f"port 127.0.0.1:{port} is taken, picking another")
            continue
        argv = qemu_argv(image, port, console_log, memory_mib, smp, kernel_args,
                         engine_python=check_engine_python(engine_python) if engine_python else None)
        (state_dir / "qemu.argv.json").write_text(json.dumps(argv))
        t0 = time.monotonic()
        with open(qemu_log, "wb") as err:
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                        start_new_session=True)
            except FileNotFoundError as exc:
                raise GuestError("qemu-system-x86_64 not found: apt-get install qemu-system-x86") from exc
        known_hosts = state_dir / "known_hosts"
        known_hosts.write_text(f"[127.0.0.1]:{port} {image.host_public_key}\n")
        state = GuestState(pid=proc.pid, ssh_port=port, host="127.0.0.1", user="root",
                           identity_file=str(image.identity_file), known_hosts_path=str(known_hosts),
                           console_log=str(console_log), initrd_path=str(image.initrd_path),
                           kernel_release=image.kernel_release, started_at=time.time())
        (state_dir / "guest.json").write_text(state.to_json())
        progress(f"qemu pid {proc.pid}, ssh on 127.0.0.1:{port}, console {console_log}")
        deadline = t0 + boot_timeout_s
        while time.monotonic() < deadline:
            rc = proc.poll()
            if rc is not None:
                err_text = qemu_log.read_text(errors="replace").strip()
                if "hostfwd" in err_text or "host forwarding" in err_text:
                    last_error = f"port 127.0.0.1:{port} taken: {err_text}"
                    progress(last_error + "; picking another")
                    break
                raise GuestError(f"qemu exited rc={rc} before sshd answered: {err_text[-500:]}\n"
                                 f"console ({console_log}):\n{_console_tail(console_log)}")
            if ssh_banner_ready(port):
                state.ready_s = round(time.monotonic() - t0, 3)
                (state_dir / "guest.json").write_text(state.to_json())
                progress(f"guest sshd answered after {state.ready_s:.1f} s")
                return state
            time.sleep(0.5)
        else:
            stop_guest(state_dir)
            raise GuestError(f"guest did not answer SSH within {boot_timeout_s:.0f} s; qemu stopped; "
                             f"console ({console_log}):\n{_console_tail(console_log)}")
    raise GuestError(f"could not start qemu on a free port: {last_error}")


def _is_our_qemu(pid: int, initrd_path: str) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return bool(cmdline) and b"qemu-system" in cmdline[0] and initrd_path.encode() in cmdline


def qemu_pids(initrd_path: str) -> list[int]:
    """PIDs of every running qemu booting ``initrd_path`` (what a test checks is gone after it stopped its guest)."""
    return sorted(int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit() and _is_our_qemu(int(d.name),
                                                                                                   str(initrd_path)))


def stop_guest(state_dir: Path, grace_s: float = 5.0) -> bool:
    """Stop the guest recorded in ``state_dir/guest.json`` by PID. True if one was running.

    Checks the PID still belongs to our qemu (by its command line) before signalling, and
    signals its whole process group.
    """
    path = Path(state_dir) / "guest.json"
    if not path.exists():
        return False
    state = GuestState.from_file(path)
    if not _is_our_qemu(state.pid, state.initrd_path):
        path.unlink(missing_ok=True)
        return False
    terminate([state.pid], group=True, grace_s=grace_s,
              alive=lambda pgid: group_alive(pgid) and _is_our_qemu(state.pid, state.initrd_path))
    path.unlink(missing_ok=True)
    return True


def guest_running(state_dir: Path) -> GuestState | None:
    """The recorded guest if its qemu is still alive."""
    path = Path(state_dir) / "guest.json"
    if not path.exists():
        return None
    state = GuestState.from_file(path)
    return state if _is_our_qemu(state.pid, state.initrd_path) else None


# ----------------------------------------------------------------------------------- as an inventory node

GUEST_LABEL = "kvgate-guest"
GUEST_CONNECT_TIMEOUT_S = 90.0


def default_state_dir() -> Path:
    """Where ``kvgate loopback guest-up`` records the running guest by default."""
    return default_cache_root() / "run"


def open_node_transport(node, state_dir: Path | None = None) -> Transport:
    """The node's transport; a node labelled ``kvgate-guest: <state dir or "default">`` is the local qemu
    guest, reached at the guest's recorded port with its key and known_hosts (the forwarded port can change)."""
    label = node.labels.get(GUEST_LABEL) if node.labels else None
    if label is None:
        return open_transport(node)
    sd = state_dir or (default_state_dir() if label in ("", "default") else Path(label).expanduser())
    st = guest_running(sd)
    if st is None:
        raise GuestError(f"node {node.name} is the loopback guest but none runs (state {sd}): "
                         "run 'kvgate loopback guest-up' first")
    # A TCG guest on a loaded host can take far longer than a real node to finish a login after its banner.
    return SSHTransport(st.host, st.ssh_port, st.user, st.identity_file, known_hosts_path=st.known_hosts_path,
                        name=node.name, connect_timeout_s=GUEST_CONNECT_TIMEOUT_S)


def open_guest_transports(inventory, state_dir: Path | None = None) -> dict[str, Transport]:
    """Transports for the inventory's kvgate-guest nodes (for ``run_suite(transports=...)``)."""
    return {n.name: open_node_transport(n, state_dir) for n in inventory.nodes
            if n.labels and GUEST_LABEL in n.labels}
