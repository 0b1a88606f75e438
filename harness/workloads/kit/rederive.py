"""A signed bundle's raw files read again for a workload's re-deriver (harness/gates/reevaluate.py calls each
workload's ``rederive``): a gate's raw files through the hardened reader (missing or empty: an error naming it), the
run's pool-device probe steps re-parsed, engine logs re-scanned for fall-backs, the raw inputs g2-ttft and g2-answer
share. Nothing here trusts the evidence's figures: they are what a re-deriver checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...engines import load_profile
from ...errors import HarnessError
from ...parsers.engine_log import scan_fallbacks
from ...parsers.pooldev import PoolDeviceStat, parse_pool_blockstat, read_bytes_between, write_bytes_between
from ...safeio import MAX_JSON_BYTES, parse_json, read_text
from .engine import fallback_reason
from .g2 import records_from_text
from .phases import missing_in_text, not_in_force


def raw_text(gate_dir: Path, rel: str, what: str, max_bytes: int = 1 << 30, empty_ok: bool = False) -> str:
    """A raw file of the gate (``gates/<gate>/<rel>``) through the hardened reader; missing, or empty (unless
    ``empty_ok``), is a HarnessError naming it: a figure with no raw basis is not re-derived from nothing."""
    name = f"gates/{gate_dir.name}/{rel}"
    text = read_text(gate_dir / rel, max_bytes=max_bytes, what=what, follow_symlinks=False, display_name=name)
    if not empty_ok and not text.strip():
        raise HarnessError(f"{name}: {what} is empty")
    return text


def evict_log_text(gate_dir: Path, points: list) -> str | None:
    """The cold regime's log (``gates/<gate>/pool-evict.jsonl``) where a load point recorded a window of it (its
    mark logged), so each window is read again from it; None where none did. Missing, it is a HarnessError."""
    if not any(pt.cold is not None and pt.cold.error is None for pt in points):
        return None
    return raw_text(gate_dir, "pool-evict.jsonl", "the cold regime's log")


def step_number(d: Path) -> int:
    """A step directory's number (``NNN-node-name``: the run's order; past 999 the digits grow)."""
    head = d.name.split("-", 1)[0]
    return int(head) if head.isdigit() else -1


def pool_device_steps(bundle_dir: Path, pool_dir: str | None, name: str = "g2-pool-blockstat",
                      need_ok: bool = False) -> list[PoolDeviceStat | None]:
    """The run's pool-device probes (steps ``*-<name>``; with ``pool_dir``, only those whose argv ends in it), in
    the run's order, each re-parsed from its stdout (harness.parsers.pooldev; None where it names no device, or
    with ``need_ok`` where the command failed, as the run then had none). A probe step without its argv.json,
    stdout or rc is a HarnessError."""
    out = []
    for d in sorted((bundle_dir / "steps").glob(f"*-{name}"), key=step_number):
        rel = f"steps/{d.name}"
        argv = parse_json(read_text(d / "argv.json", max_bytes=MAX_JSON_BYTES, what="a step's argv",
                                    follow_symlinks=False, display_name=f"{rel}/argv.json"), f"{rel}/argv.json")
        args = argv.get("argv") if isinstance(argv, dict) else None
        if pool_dir is not None and (not isinstance(args, list) or not args or args[-1] != pool_dir):
            continue
        text = read_text(d / "stdout", max_bytes=1 << 20, what="a pool-device probe's output", follow_symlinks=False,
                         display_name=f"{rel}/stdout")
        rc = read_text(d / "rc", max_bytes=64, what="a step's exit status", follow_symlinks=False,
                       display_name=f"{rel}/rc").strip()
        try:
            out.append(None if need_ok and rc != "0" else parse_pool_blockstat(text))
        except ValueError:
            out.append(None)
    return out


def device_by_attempt(bundle_dir: Path, gate: str, pool_dir: str | None, attempts: list[Any]
                      ) -> dict[str, tuple[int | None, int | None]]:
    """Each load attempt's pool-device (read, written) bytes from the run's probe steps, re-parsed: two probes per
    attempt (before, after), the attempts in the order they started. A count that does not match (the steps of
    another gate on the same pool, or steps removed) is a HarnessError: the bytes cannot be told apart."""
    steps = pool_device_steps(bundle_dir, pool_dir) if pool_dir else []
    want = 2 * len(attempts) if pool_dir else 0
    if len(steps) != want:
        raise HarnessError(f"{gate}: {len(steps)} pool-device probe steps of {pool_dir} for {len(attempts)} load "
                           f"attempt(s) (two each expected): the device bytes cannot be re-derived")
    if any(pt.started_unix_s is None for pt in attempts):
        raise HarnessError(f"{gate}: a load attempt has no start time: its pool-device probes cannot be matched")
    order = sorted(attempts, key=lambda pt: pt.started_unix_s)
    return {pt.requests_file: (read_bytes_between(steps[2 * i], steps[2 * i + 1]),
                               write_bytes_between(steps[2 * i], steps[2 * i + 1])) for i, pt in enumerate(order)}


def rescanned_fallback(gate_dir: Path, log: str, patterns: Any, label: str, required: Any = ()) -> str | None:
    """An engine kvgate launched: its whole log (``gates/<gate>/<log>``, missing or empty an ERROR) scanned again
    with the built-in fall-back patterns and the profile's (harness.parsers.engine_log), and for the lines that show
    its cold regime in force (the profile's ``in_force_log``), as the run's reason."""
    text = raw_text(gate_dir, log, "an engine log")
    return (fallback_reason(scan_fallbacks(text, list(patterns)), label)
            or not_in_force(missing_in_text(text, list(required)), label))


def load_texts(gate_dir: Path, sub: str, ev: Any) -> dict[str, dict[str, str]]:
    """Every attempt's raw requests and counters files (``gates/<gate>/<sub><file>``), the set-aside ones too."""
    texts: dict[str, dict[str, str]] = {"requests": {}, "counters": {}}
    for pt in ev.points + ev.spoiled:
        texts["requests"][pt.requests_file] = raw_text(gate_dir, sub + pt.requests_file, "a load point's requests",
                                                       empty_ok=pt.figures is None)
        if pt.counters_file:
            texts["counters"][pt.counters_file] = raw_text(gate_dir, sub + pt.counters_file,
                                                           "a load point's engine counters")
    return texts


def g2_phases(gate_dir: Path, result: dict[str, Any], params: Any, ctx: dict[str, Any]):
    """g2-ttft's raw inputs again: (evidence, re-compute records, read-back records, the read-back's device bytes,
    the fall-back re-scanned), as g2-ttft and g2-answer re-judge them."""
    ev = result.get("evidence") or {}
    prof = load_profile(params.engine)
    recompute = records_from_text(raw_text(gate_dir, "requests-recompute.jsonl", "the re-compute phase's requests"))
    fallback = None
    if params.attach is None:
        fallback = rescanned_fallback(gate_dir, "engine-recompute.log", prof.fallback_patterns, "re-compute",
                                      prof.in_force_log)
    elif ev.get("fallback_lines"):
        fallback = result.get("invalid_reason")
    readback: list = []
    if fallback is None and any(r.ok for r in recompute):  # the run read back: its records must be there
        readback = records_from_text(raw_text(gate_dir, "requests-readback.jsonl", "the read-back phase's requests"))
        if params.attach is None:
            fallback = rescanned_fallback(gate_dir, "engine-readback.log", prof.fallback_patterns, "read-back",
                                          prof.in_force_log)
    pool_dir = ev.get("pool_dir")
    steps = pool_device_steps(Path(ctx["bundle_dir"]), pool_dir) if pool_dir else []
    # before and after each phase run (re-compute, read-back); a bundle of a kvgate that did not count the
    # re-compute's writes has the read-back's two only
    want = ((4, 2) if readback else (2, 0)) if pool_dir else (0,)
    if len(steps) not in want:
        raise HarnessError(f"{gate_dir.name}: {len(steps)} pool-device probe steps of {pool_dir} "
                           f"({' or '.join(map(str, want))} expected: before and after each phase): the device bytes "
                           "cannot be re-derived")
    device = read_bytes_between(steps[-2], steps[-1]) if readback and steps else None
    if len(steps) == max(want) and steps:  # the re-compute's writes, to the read-back's start (or its own end)
        ev = {**ev, "recompute_device_write_bytes": write_bytes_between(steps[0], steps[2 if readback else 1])}
    return ev, recompute, readback, device, fallback


def one_step_output(steps_dir: Path, node: str, name: str) -> str | None:
    """The stdout of the run's step ``name`` on ``node`` that exited 0, when the run holds exactly one distinct
    such output (a suite with two G3 gates on one port probes it twice, alike); else None."""
    outs = {(d / "stdout").read_text(errors="replace") for d in steps_dir.glob(f"*-{node}-{name}")
            if (d / "rc").is_file() and (d / "rc").read_text().strip() == "0" and (d / "stdout").is_file()}
    return outs.pop() if len(outs) == 1 else None
