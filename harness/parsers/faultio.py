"""Pure parsers for a faulted read: fio's completion log, fio's verify failures, and the per-path block counters
of a native NVMe multipath head (the head of a 6.1 kernel counts no I/O of its own; its paths do).

* fio's ``--write_lat_log`` with ``--log_unix_epoch=1``: one line per completed I/O,
  ``time_ms, clat_ns, ddir, bytes, offset`` (the time in unix ms on the node's clock).
* fio's stderr with ``--verify=crc32c --continue_on_error=all``: ``verify failed at file F offset N`` per bad
  block read.
* the path sampler: ``T <unix s>`` then ``<path device> <the 17 fields of /sys/block/DEV/stat>`` per path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .blockdev import BlockStat, parse_block_stat


@dataclass(frozen=True)
class Completion:
    """One completed I/O: when (unix s, node clock) and how many bytes."""

    t_s: float
    bytes: int


def parse_clat_log(text: str) -> list[Completion]:
    """Pure: fio's clat log (log_unix_epoch) -> completions in time order. Raises ValueError on a bad line."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        f = [x.strip() for x in line.split(",")]
        if len(f) < 4:
            raise ValueError(f"fio completion log line {n}: expected time, latency, direction, bytes: {line[:80]!r}")
        try:
            out.append(Completion(int(f[0]) / 1000.0, int(f[3])))
        except ValueError:
            raise ValueError(f"fio completion log line {n}: not numbers: {line[:80]!r}") from None
    out.sort(key=lambda c: c.t_s)
    return out


_VERIFY = re.compile(r"verify failed at file .* offset (\d+), length (\d+)")


def parse_verify_failures(stderr: str) -> list[tuple[int, int]]:
    """Pure: (offset, length) of every block fio's verify found bad (a block read twice bad counts twice)."""
    return [(int(m.group(1)), int(m.group(2))) for m in _VERIFY.finditer(stderr)]


def path_stats_argv(devices: list[str]) -> tuple[str, ...]:
    """The node command: each path device's counters, one line each (``DEV <stat fields>``)."""
    return ("sh", "-c", 'for p; do echo "$p $(cat /sys/block/$p/stat)"; done', "kvgate-path-stats", *devices)


def parse_path_stats(text: str) -> dict[str, BlockStat]:
    """Pure: :func:`path_stats_argv`'s output -> device -> counters (a device whose stat was unreadable is left
    out)."""
    out = {}
    for line in text.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[1].split()[:1] and parts[1].split()[0].isdigit():
            try:
                out[parts[0]] = parse_block_stat(parts[1])
            except ValueError:
                continue
    return out


def path_sampler_argv(devices: list[str], duration_s: float, every_s: float = 0.5) -> tuple[str, ...]:
    """The node command sampling every path's counters for ``duration_s`` (``T <unix s>`` before each round)."""
    script = ('d=date; [ -x /usr/bin/date ] && d=/usr/bin/date; '  # coreutils' (nanoseconds), not a busybox one
              'end=$(( $($d +%s) + $1 )); every=$2; shift 2; while [ "$($d +%s)" -le "$end" ]; do '
              'echo "T $($d +%s.%N)"; for p; do echo "$p $(cat /sys/block/$p/stat)"; done; sleep "$every"; done')
    return ("sh", "-c", script, "kvgate-path-sampler", str(int(duration_s + 1)), f"{every_s:g}", *devices)


def parse_path_samples(text: str) -> list[tuple[float, dict[str, BlockStat]]]:
    """Pure: the sampler's output -> [(unix s, device -> counters)] in time order."""
    rounds: list[tuple[float, dict[str, BlockStat]]] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "T":
            try:
                rounds.append((float(parts[1]), {}))
            except ValueError:
                continue
        elif rounds and len(parts) > 1:
            got = parse_path_stats(line)
            rounds[-1][1].update(got)
    return rounds


def iopolicy_argv(nqn: str, policy: str | None = None, root: str = "/sys/class/nvme-subsystem") -> tuple[str, ...]:
    """The node command: the native multipath I/O policy of the subsystem ``nqn`` (``/sys/class/nvme-subsystem/
    */iopolicy``), set to ``policy`` first when given; prints ``SUBSYSTEM_DIR POLICY`` per matching subsystem. A
    policy the kernel does not know fails the write (``Invalid argument``) and the command exits non-zero; no
    subsystem of that NQN: exit 1. ``root``: the sysfs class directory (a test's own tree)."""
    script = (f'rc=1; for d in {root}/*; do [ -r "$d/subsysnqn" ] || continue; '
              '[ "$(cat "$d/subsysnqn")" = "$1" ] || continue; '
              'if [ -n "$2" ]; then echo "$2" > "$d/iopolicy" || exit 3; fi; '
              'echo "$d $(cat "$d/iopolicy")"; rc=0; done; exit $rc')
    return ("sh", "-c", script, "kvgate-iopolicy", nqn, policy or "")


def parse_iopolicy(text: str) -> str | None:
    """Pure: :func:`iopolicy_argv`'s output -> the subsystem's policy (None: no subsystem line, or two
    subsystems of one NQN that disagree)."""
    seen = {parts[1] for line in text.splitlines() if len(parts := line.split()) == 2 and parts[0].startswith("/")}
    return seen.pop() if len(seen) == 1 else None
