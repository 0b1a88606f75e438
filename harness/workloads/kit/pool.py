"""The serving gates' pool as a tier of its own: the block device it lives on, and the cold regime that makes its
read-backs reach that device (harness/parsers/poolloop.py has the node commands and their parsers).

``pool_device: {kind: loop, size: 2 GiB}``: kvgate makes the pool on a loop device of its own (ext4 on a backing
file in the engine's run directory, mounted on the pool directory), so the device's counters are the tier's alone.
Its inverse (unmount, detach, remove) is registered with the run's undo log before the make is sent, and runs
whatever ends the gate. ``kind: directory`` (the default) keeps the pool where ``pool_dir`` is, on whatever device
holds it (an operator's array mount, the NVMe-oF loopback's namespace): its counters then count everything else
on that device too, which the evidence says.

The cold regime is the engine profile's (``cold_regime``): ``evict`` runs ``harness/node/pool_evict.py`` beside the
engine (each store's and each read's pages dropped), ``odirect`` means the connector itself reads and writes with
O_DIRECT (the profile's ``in_force_log`` line proves it in the engine's log), ``none`` declares nothing. A gate may
switch a declared regime off (``cold_regime: none``), to measure what the node's memory serves.
"""

from __future__ import annotations

import posixpath
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, field_validator

from ...node import program_path
from ...parsers.poolloop import EVICT_MARK_PREFIX, EvictSummary, EvictWindow, LoopPool, evict_window, loop_pool_argv, \
    loop_pool_undo_argv, mark_argv, parse_evict_log, parse_loop_pool, parse_mark_made
from ...units import parse_size_bytes
from .base import GateContext, PlannedStep, StrictModel

EVICT_PROGRAM = "pool_evict.py"
# How long kvgate waits, after a load point, for the evictor to log the point's mark (it logs it once it has
# handled every pool event before it: a device that takes this long to write a store back leaves no answer)
MARK_TIMEOUT_S = 120.0


class PoolDeviceSpec(StrictModel):
    """Where a launched engine's pool lives: ``directory`` (pool_dir as it is) or ``loop`` (a loop device kvgate
    makes, formats and mounts on pool_dir for the run, of ``size``)."""

    kind: Literal["directory", "loop"] = "directory"
    size: str = "2 GiB"
    # loop: the loop device reads its backing file with O_DIRECT (the backing disk's speed), or through the node's
    # page cache (off: a device as fast as memory; the pool's own counters still count every read of the tier)
    direct_io: bool = True
    # loop: the device's read-ahead (the kernel's default is 128 KiB; a connector that maps its files and faults
    # them in page by page reads one read-ahead window per trip to the device)
    read_ahead_kb: int = Field(default=128, ge=0, le=65536)

    @field_validator("size")
    @classmethod
    def _size(cls, v: str) -> str:
        n = parse_size_bytes(v, what="pool size")
        if n < 64 * 1024**2:
            raise ValueError(f"pool size {v!r} is below 64 MiB (ext4 and the KV of one prompt need more)")
        return v

    @property
    def size_bytes(self) -> int:
        return parse_size_bytes(self.size, what="pool size")


@dataclass
class PoolRecord:
    """The pool as made for the run, for the evidence: its kind, the loop device (if kvgate made one), the cold
    regime in force and what it did."""

    kind: str = "directory"
    loop: LoopPool | None = None
    backing: str | None = None
    cold_regime: str = "none"
    evict: EvictSummary | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "backing": self.backing, "cold_regime": self.cold_regime,
                "loop": None if self.loop is None else {"device": self.loop.device, "maj_min": self.loop.maj_min,
                                                         "direct_io": self.loop.direct_io},
                "evict": None if self.evict is None else self.evict.to_dict()}


def cold_regime_of(profile_regime: str, gate_regime: str) -> str:
    """The regime in force: the profile's, unless the gate switches it off."""
    return "none" if gate_regime == "none" else profile_regime


def backing_file(run_dir: str) -> str:
    return posixpath.join(run_dir, "pool.img")


def plan_pool(node: str, spec: PoolDeviceSpec, regime: str, python: str, pool_dir: str, run_dir: str,
              pattern: str) -> list[PlannedStep]:
    """The steps :func:`prepare_pool` sends, for ``kvgate plan``."""
    steps = []
    if spec.kind == "loop":
        back = backing_file(run_dir)
        steps.append(PlannedStep(node, f"the pool on a loop device of its own: a {spec.size} backing file, ext4, "
                                       f"mounted on {pool_dir} (undone at the gate's end: unmount, detach, remove)",
                                 loop_pool_argv(back, spec.size_bytes, pool_dir, spec.direct_io,
                                                spec.read_ahead_kb)))
    if regime == "evict":
        steps.append(PlannedStep(node, "cold regime: drop each pool file's pages when a store lands and after "
                                       "each read (sync_file_range write-back + posix_fadvise DONTNEED), beside the "
                                       "engine; after each load point a mark file written into the pool "
                                       f"({EVICT_MARK_PREFIX}<point>) and awaited in its log: a read it saw before "
                                       "it had dropped the read file's store is a breach",
                                 evict_argv(python, run_dir, pool_dir, pattern)))
    return steps


def evict_argv(python: str, run_dir: str, pool_dir: str, pattern: str) -> tuple[str, ...]:
    """The evictor's command, at a raised priority (nice -10; where that is refused, nice runs it as it is): on a
    busy node it must drop a store's pages before the session comes back, or the page cache serves the read-back
    (the device proof then makes the point INVALID)."""
    return ("nice", "-n", "-10", python, posixpath.join(run_dir, EVICT_PROGRAM), pool_dir, "--pattern", pattern)


@dataclass
class NodeProcess:
    """A helper process beside an engine (the evictor): spawned as a step in its own process group, stopped with
    the engine, its log fetched into the gate directory."""

    ctx: GateContext
    transport: Any
    name: str
    argv: tuple[str, ...]
    log_path: str
    proc: Any = None
    stopped: bool = field(default=False)

    def start(self) -> None:
        self.proc, _ = self.ctx.steps.spawn(self.transport, self.name, list(self.argv), log_path=self.log_path)

    def stop(self) -> str | None:
        """Stop it (SIGTERM to its group: it writes its summary) and return its log's text (None: unreadable)."""
        if self.proc is not None and not self.stopped:
            self.stopped = True
            self.proc.kill_group(grace_s=5.0)
            self.proc.wait(10.0)
        local = self.ctx.gate_dir / posixpath.basename(self.log_path)
        try:
            self.transport.get(self.log_path, local)
            return local.read_text(errors="replace")
        except Exception:  # noqa: BLE001 - a missing log is reported by its absence
            return None


@dataclass
class PoolHandle:
    """The pool made for a run: its record, the evictor beside the engine, and the loop device's inverse. ``close``
    (after the engine stopped) stops the evictor and puts what it did into the record; the loop device is torn down
    by the run's undo log once the gate has ended (its engines stopped, whatever ended it), or here where there is
    no undo log."""

    ctx: GateContext
    transport: Any
    record: PoolRecord
    evictor: NodeProcess | None = None
    undo_argv: tuple[str, ...] | None = None
    undo_entry: Any = None
    closed: bool = False
    pool_dir: str = ""

    def mark(self, name: str, timeout_s: float = MARK_TIMEOUT_S, poll_s: float = 0.1) -> EvictWindow | None:
        """Close a load point for the cold regime (None without an evictor): write the mark ``name`` into the pool,
        wait until the evictor has logged it (every pool event before it handled), and return the breaches of the
        reads before it (harness.parsers.poolloop.evict_window); no answer is an :class:`EvictWindow` with its
        ``error``."""
        if self.evictor is None or self.evictor.proc is None or self.closed:
            return None
        res = self.ctx.steps.run(self.transport, f"pool-mark-{name}", mark_argv(self.pool_dir, name), timeout_s=60)
        try:
            made = parse_mark_made(res.stdout) if res.ok else None
        except ValueError:
            made = None
        if made is None:
            return EvictWindow(name=name, error=f"the mark could not be written: {res.summary()}")
        deadline = time.monotonic() + timeout_s
        local = self.ctx.gate_dir / posixpath.basename(self.evictor.log_path)
        while True:
            try:
                self.transport.get(self.evictor.log_path, local)
                text = local.read_text(errors="replace")
            except Exception as exc:  # noqa: BLE001 - an unreadable log is an answer of its own
                return EvictWindow(name=name, made_unix_s=made, error=f"the evictor's log could not be read: {exc}")
            w = evict_window(text, name, made)
            if w is not None:
                return w
            if time.monotonic() >= deadline or self.evictor.proc.poll() is not None:
                why = "has exited" if self.evictor.proc.poll() is not None else f"did not log it within {timeout_s:g} s"
                return EvictWindow(name=name, made_unix_s=made, error=f"the evictor {why}")
            self.ctx.cancel.sleep(poll_s)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.evictor is not None:
            text = self.evictor.stop()
            self.record.evict = parse_evict_log(text or "")
        if self.undo_argv is not None and self.undo_entry is None:  # no undo log: nobody else would tear it down
            self.ctx.steps.run(self.transport, "pool-loop-undo", self.undo_argv, timeout_s=120)


def prepare_pool(ctx: GateContext, transport: Any, node: str, spec: PoolDeviceSpec, regime: str, python: str,
                 pool_dir: str, run_dir: str, pattern: str, step: str) -> tuple[str | None, PoolHandle]:
    """Make the pool as ``spec`` says (after the pool directory exists) and start the cold regime's evictor:
    (error or None, the handle to close once the engine has stopped; close it on an error too)."""
    handle = PoolHandle(ctx, transport, PoolRecord(kind=spec.kind, cold_regime=regime), pool_dir=pool_dir)
    rec = handle.record
    if spec.kind == "loop":
        rec.backing = backing_file(run_dir)
        handle.undo_argv = loop_pool_undo_argv(rec.backing, pool_dir)
        if ctx.undo is not None:  # the inverse is kept before the change is sent
            handle.undo_entry = ctx.undo.register(node, f"{step}-loop", handle.undo_argv, gate=ctx.gate.id)
        res = ctx.steps.run(transport, f"{step}-loop", loop_pool_argv(rec.backing, spec.size_bytes, pool_dir,
                                                                      spec.direct_io, spec.read_ahead_kb),
                            timeout_s=300)
        if not res.ok:
            return f"could not make the pool's loop device on {node}: {res.summary()}", handle
        try:
            rec.loop = parse_loop_pool(res.stdout)
        except ValueError as exc:
            return f"the pool's loop device on {node}: {exc}", handle
    if regime == "evict":
        transport.put(program_path(EVICT_PROGRAM), posixpath.join(run_dir, EVICT_PROGRAM))
        handle.evictor = NodeProcess(ctx, transport, f"{step}-evict", evict_argv(python, run_dir, pool_dir, pattern),
                                     posixpath.join(run_dir, "pool-evict.jsonl"))
        handle.evictor.start()
    return None, handle
