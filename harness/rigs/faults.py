"""Faults kvgate causes on a kernel NVMe-oF target (nvmet, configured through configfs) and their inverses: pure
command builders, one (apply, inverse) pair of argv per fault.

* ``path-down``: the subsystem's link to one nvmet port is removed (nvmet deletes the controllers connected
  through that port: the host loses that path); inverse: the link made again (the host reconnects after its
  ``reconnect_delay``).
* ``ana``: the ANA state of the port's ANA group 1 (every namespace's default group) is set to
  ``non-optimized`` or ``inaccessible`` (nvmet sends the ANA change event; the host's native multipath moves I/O
  to an optimized path); inverse: ``optimized``.
* ``target-restart``: the subsystem is unlinked from every port of the namespace and the namespace disabled (the
  target is gone for the host, every path down); inverse: the namespace enabled and every link made again.
* ``pool-path-loss`` (an engine gate's pool): every packet from the engine's node to the pool's server dropped
  (a blackhole route for the server's address: the node's other traffic, kvgate's own session included, goes
  on); inverse: that route deleted.
* ``pool-unmount`` (an engine gate's pool): the pool's file system detached from its path (held at a bind mount
  meanwhile); inverse: bound back.
* ``slow-path``: ``tc netem`` delay on one port's traffic (a prio qdisc with handle ``4b56:`` on the interface,
  a u32 filter on the port's source port sending its replies to the delayed band); inverse: that qdisc deleted,
  only when it is kvgate's (handle ``4b56:``).

Every argv is wrapped by :func:`clocked`: the node prints its clock (``date +%s.%N``) before and after the
command, the time base of fio's completion log (``log_unix_epoch``), so a fault is placed on the same clock as
the I/O it disturbs. Every inverse is idempotent: it may run after an apply that never landed.
"""

from __future__ import annotations

from dataclasses import dataclass

NVMET_ROOT = "/sys/kernel/config/nvmet"
CLOCK_MARK = "kvgate-fault-clock"
# coreutils' date by its path where it is there: a busybox date earlier in PATH (the loopback guest's /bin) prints
# "%N" literally; a node with neither prints no nanoseconds, the stamp does not parse and the fault is not timed
NS_DATE = "d=date; [ -x /usr/bin/date ] && d=/usr/bin/date"
TC_HANDLE = "4b56"  # "KV": the root qdisc kvgate adds for a slow path, and the only one it deletes
ANA_STATES = ("optimized", "non-optimized", "inaccessible")


def clocked(argv: tuple[str, ...]) -> tuple[str, ...]:
    """``argv`` run by ``sh`` between two readings of the node's clock (ns), its exit status kept."""
    return ("sh", "-c", f'{NS_DATE}; echo {CLOCK_MARK} $($d +%s.%N); "$@"; rc=$?; echo {CLOCK_MARK} $($d +%s.%N); '
                        'exit $rc', "kvgate-fault", *argv)


def parse_clocked(stdout: str) -> tuple[float | None, float | None]:
    """Pure: the node's clock (unix s) before and after a :func:`clocked` command; None where it did not print."""
    stamps = []
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == CLOCK_MARK:
            try:
                stamps.append(float(parts[1]))
            except ValueError:
                pass
    return (stamps[0] if stamps else None, stamps[1] if len(stamps) > 1 else None)


@dataclass(frozen=True)
class PortRef:
    """One path's nvmet port on the target side: its port id (the trsvcid, as kvgate's loopback names ports)."""

    port_id: str
    trsvcid: str
    root: str = NVMET_ROOT  # nvmet's configfs root (a test's copy of the tree elsewhere)

    @property
    def dir(self) -> str:
        return f"{self.root}/ports/{self.port_id}"


def _subsys_dir(nqn: str, root: str = NVMET_ROOT) -> str:
    return f"{root}/subsystems/{nqn}"


def _link(port: PortRef, nqn: str) -> str:
    return f"{port.dir}/subsystems/{nqn}"


_RELINK = 'sub=$1; shift; rc=0; for l; do [ -e "$l" ] || ln -s "$sub" "$l" || rc=1; done; exit $rc'


def path_down(nqn: str, port: PortRef) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(apply, inverse): the subsystem unlinked from the port, and linked again (unless it is)."""
    link = _link(port, nqn)
    return (("rm", "--", link), ("sh", "-c", _RELINK, "kvgate-relink", _subsys_dir(nqn, port.root), link))


def ana_change(port: PortRef, state: str, group: int = 1) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(apply, inverse): the port's ANA group ``group`` set to ``state``, then back to optimized."""
    if state not in ANA_STATES or state == "optimized":
        raise ValueError(f"ANA state {state!r}: expected non-optimized or inaccessible")
    attr = f"{port.dir}/ana_groups/{group}/ana_state"
    write = 'printf "%s" "$1" > "$2"'
    return (("sh", "-c", write, "kvgate-write", state, attr),
            ("sh", "-c", write, "kvgate-write", "optimized", attr))


def target_restart(nqn: str, nsid: int, ports: list[PortRef]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(apply, inverse): every port unlinked and the namespace disabled; the namespace enabled, every port linked
    again."""
    root = ports[0].root if ports else NVMET_ROOT
    enable = f"{_subsys_dir(nqn, root)}/namespaces/{nsid}/enable"
    links = [_link(p, nqn) for p in ports]
    down = ('e=$1; shift; rc=0; for l; do if [ -e "$l" ] || [ -L "$l" ]; then rm -- "$l" || rc=1; fi; done; '
            'printf 0 > "$e" || rc=1; exit $rc')
    up = ('e=$1; sub=$2; shift 2; rc=0; printf 1 > "$e" || rc=1; '
          'for l; do [ -e "$l" ] || ln -s "$sub" "$l" || rc=1; done; exit $rc')
    return (("sh", "-c", down, "kvgate-target-down", enable, *links),
            ("sh", "-c", up, "kvgate-target-up", enable, _subsys_dir(nqn, root), *links))


# the netem child's handle: a qdisc handle's major number is 16 bits (at most four hex digits; "4b563:" was
# refused by tc, "invalid qdisc ID", the first time the slow path ran in the guest)
TC_NETEM_HANDLE = f"{int(TC_HANDLE, 16) + 1:x}"
TC_PICK = "t=tc; [ -x /usr/sbin/tc ] && t=/usr/sbin/tc;"


def slow_path(interface: str, port: PortRef, delay_ms: float, loss_pct: float = 0.0
              ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(apply, inverse): netem delay (and loss) on the replies from the port's trsvcid on ``interface``; the
    inverse deletes the root qdisc only when it is kvgate's (handle 4b56:)."""
    netem = f"delay {delay_ms:g}ms" + (f" loss {loss_pct:g}%" if loss_pct else "")
    # iproute2's tc by its path where it is there: a busybox shell runs its own tc applet before any PATH lookup
    # (seen in the loopback guest: "tc: invalid argument 'root' to 'command'"), and that one knows no prio/netem
    tc = f'{TC_PICK} '
    script = (tc + f'$t qdisc add dev "$1" root handle {TC_HANDLE}: prio && '
              f'$t qdisc add dev "$1" parent {TC_HANDLE}:3 handle {TC_NETEM_HANDLE}: netem {netem} && '
              f'$t filter add dev "$1" parent {TC_HANDLE}: protocol ip prio 1 u32 match ip sport "$2" 0xffff '
              f'flowid {TC_HANDLE}:3')
    undo = (tc + f'if $t qdisc show dev "$1" | grep -q "qdisc prio {TC_HANDLE}: root"; then '
            f'$t qdisc del dev "$1" root; fi')
    return (("sh", "-c", script, "kvgate-slow-path", interface, port.trsvcid),
            ("sh", "-c", undo, "kvgate-slow-path-undo", interface))


def pool_path_loss(server: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(apply, inverse): a blackhole route for ``server`` (an IPv4 address, /32) in the node's main routing table:
    every packet the node sends it is dropped silently (a cable pull or a dead switch port, for that traffic only;
    no qdisc or firewall module needed); the inverse deletes that route only when it is there."""
    return (("ip", "route", "add", "blackhole", f"{server}/32"),
            ("sh", "-c", 'if ip route show table main exact "$1/32" type blackhole | grep -q .; then '
                         'ip route del blackhole "$1/32"; fi', "kvgate-pool-path-back", server))


def pool_unmount(mount_point: str, held: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(apply, inverse): the pool's file system detached from its path (``umount -l``: new lookups under
    ``mount_point`` find the empty directory beneath it, as on a node whose network mount went away), held
    mounted at ``held`` meanwhile (a bind mount: its connection and files stay as they were); the inverse binds
    it back at ``mount_point`` unless something is mounted there, then lets go of ``held``."""
    apply = ('mkdir -p "$2" && mount --bind "$1" "$2" && umount -l "$1"')
    back = ('rc=0; if ! mountpoint -q "$1"; then if mountpoint -q "$2"; then mount --bind "$2" "$1" || rc=1; '
            'else rc=1; echo "kvgate: $1 is not mounted and $2 holds nothing" >&2; fi; fi; '
            'if [ $rc = 0 ] && mountpoint -q "$2"; then umount -l "$2" || rc=1; fi; exit $rc')
    return (("sh", "-c", apply, "kvgate-pool-unmount", mount_point, held),
            ("sh", "-c", back, "kvgate-pool-remount", mount_point, held))
