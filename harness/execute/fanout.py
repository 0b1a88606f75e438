"""Run on every node in parallel, then aggregate: group results, the failure-share policy, and a
synchronized launch (arm every node's reader, release all together, stop every one on failure).

Used by every multi-node workload. Everything here talks to nodes only through the Transport contract,
so tests inject a transport at that seam; failures become data (NodeOutcome with an error), never a
lost exception. Only KeyboardInterrupt propagates, after every remote process group was stopped.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Generic, Iterator, Mapping, Sequence, TypeVar

from ..errors import HarnessError
from ..transport import Process, Transport

T = TypeVar("T")


@dataclass(frozen=True)
class NodeOutcome(Generic[T]):
    """One node's result or error."""

    node: str
    ok: bool
    value: T | None = None
    error: str | None = None
    duration_s: float = 0.0


class GroupResult(Mapping[str, NodeOutcome]):
    """node -> NodeOutcome, with `.succeeded` (node -> value) and `.failed` (node -> error text)."""

    def __init__(self, outcomes: Mapping[str, NodeOutcome]):
        self._o = dict(outcomes)

    def __getitem__(self, node: str) -> NodeOutcome:
        return self._o[node]

    def __iter__(self) -> Iterator[str]:
        return iter(self._o)

    def __len__(self) -> int:
        return len(self._o)

    @property
    def succeeded(self) -> dict[str, Any]:
        return {n: o.value for n, o in self._o.items() if o.ok}

    @property
    def failed(self) -> dict[str, str]:
        return {n: o.error or "failed" for n, o in self._o.items() if not o.ok}

    @property
    def failed_share(self) -> float:
        return len(self.failed) / len(self._o) if self._o else 0.0

    def summary(self) -> str:
        if not self.failed:
            return f"all {len(self)} nodes ok"
        return f"{len(self.failed)}/{len(self)} nodes failed: " + "; ".join(f"{n}: {e}" for n, e in self.failed.items())

    def as_dict(self) -> dict:
        return {n: {"ok": o.ok, "error": o.error, "duration_s": round(o.duration_s, 6)} for n, o in self._o.items()}


@dataclass(frozen=True)
class FailurePolicy:
    """How many failed nodes a gate tolerates, and whether one failure stops the others.

    max_failed_share: failed nodes / all nodes above which the gate is ERROR (0.0: any failure).
    on_node_failure: "continue" lets the other nodes finish (their data stays usable);
                     "abort" stops every node's process as soon as one fails.
    """

    max_failed_share: float = 0.0
    on_node_failure: str = "continue"

    def __post_init__(self):
        if not 0.0 <= self.max_failed_share <= 1.0:
            raise ValueError("max_failed_share must be within 0..1")
        if self.on_node_failure not in ("continue", "abort"):
            raise ValueError("on_node_failure must be 'continue' or 'abort'")

    def tolerates(self, group: GroupResult) -> bool:
        return group.failed_share <= self.max_failed_share + 1e-12

    def verdict_error(self, group: GroupResult) -> str | None:
        """The ERROR reason when the failures exceed the policy, else None."""
        if self.tolerates(group):
            return None
        return (f"{len(group.failed)} of {len(group)} nodes failed (share {group.failed_share:.2f} > allowed "
                f"{self.max_failed_share:.2f}): " + "; ".join(f"{n}: {e}" for n, e in sorted(group.failed.items())))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, HarnessError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def _local_outcome(node: str, fn: Callable[[], T]) -> NodeOutcome:
    """``fn()`` as a node outcome, an exception as its error (no thread: for checks that send nothing)."""
    try:
        return NodeOutcome(node, True, fn())
    except Exception as exc:  # noqa: BLE001 - failures are data
        return NodeOutcome(node, False, None, _describe(exc))


def fan_out(items: Mapping[str, Any], fn: Callable[[str, Any], T], max_workers: int | None = None) -> GroupResult:
    """Call fn(node, item) for every node in parallel; exceptions become that node's error."""
    def one(node: str) -> NodeOutcome:
        t0 = time.monotonic()
        try:
            return NodeOutcome(node, True, fn(node, items[node]), None, time.monotonic() - t0)
        except Exception as exc:  # noqa: BLE001 - failures are data
            return NodeOutcome(node, False, None, _describe(exc), time.monotonic() - t0)

    if not items:
        return GroupResult({})
    ex = ThreadPoolExecutor(max_workers=max_workers or min(64, len(items)))
    try:
        outcomes = list(ex.map(one, list(items)))
    except BaseException:
        # Ctrl-C: return at once instead of waiting for every node's command to end; the caller stops the
        # remote process groups (Transport.abort), and the threads end with them.
        ex.shutdown(wait=False, cancel_futures=True)
        raise
    ex.shutdown(wait=True)
    return GroupResult({o.node: o for o in outcomes})


# ----------------------------------------------------------------------------------------------
# synchronized launch
# ----------------------------------------------------------------------------------------------

def output_bytes(proc: Process) -> int | None:
    """Bytes of stdout a running process has delivered so far, where its transport keeps them in memory
    (kvgate's local and SSH processes do); None when unknown, which disables stall detection for it."""
    return proc.stdout_bytes_so_far()


@dataclass(frozen=True)
class LaunchSpec:
    """What to start on one node: argv (in its own process group), and the node-side files used to
    signal 'armed' (the reader creates it) and 'go' (we create it, holding the node-clock start time).

    ``armed_marker``: bytes the program prints on its stdout once armed. With it, arming is seen in the
    output already streaming back, with no command sent per check (a check per node every ``poll_s`` is
    a process forked on every node, many times a second); without it, or where the transport does not keep
    the output in memory, ``armed_path`` is polled with ``test -e``."""

    argv: tuple[str, ...]
    armed_path: str
    go_path: str
    armed_marker: bytes | None = None

    def command(self) -> tuple[str, ...]:
        """What is started on the node: a stale go file (it would release the program at once) and armed
        file removed, then ``argv`` exec'd in the same process: one command per node, not two."""
        return ("sh", "-c", 'rm -f -- "$1" "$2" && shift 2 && exec "$@"', "kvgate-launch", self.go_path,
                self.armed_path, *self.argv)


@dataclass
class NodeRun:
    """One node's launched process and what became of it."""

    node: str
    process: Process | None = None
    armed_at_s: float | None = None  # our clock
    go_node_s: float | None = None  # the start time written to the node (node clock)
    go_written_at_s: float | None = None  # our clock, when the go file write returned
    rc: int | None = None
    stdout: str = ""
    stderr: str = ""
    error: str | None = None
    stopped: bool = False  # we killed its process group

    def as_dict(self) -> dict:
        return {"node": self.node, "rc": self.rc, "error": self.error, "stopped": self.stopped,
                "armed_at_s": self.armed_at_s, "go_node_s": self.go_node_s, "go_written_at_s": self.go_written_at_s,
                "pid": getattr(self.process, "pid", None), "pgid": getattr(self.process, "pgid", None)}


class SynchronizedLaunch:
    """Arm a process on every node, release them together at one instant, wait, stop all on failure.

    `offsets` maps node -> the clock offset (node clock - ours, seconds) to apply.

    Protocol: each process is spawned in its own process group and creates `armed_path` once it is
    ready (connected, files opened, buffers allocated); it then polls for `go_path`, which holds the
    Unix time, in the node's clock, at which to start. We write every go file in parallel with
    a common start instant T on our clock converted with each node's measured clock offset, and T far
    enough ahead that every write lands before it. The skew actually achieved is what the processes
    report (their first-read times), aligned with the same offsets.

    Use as a context manager: leaving the block with an exception (KeyboardInterrupt included) stops
    every node's process group; partial output stays with each NodeRun.
    """

    def __init__(self, transports: Mapping[str, Transport], specs: Mapping[str, LaunchSpec],
                 offsets: Mapping[str, float], policy: FailurePolicy = FailurePolicy(),
                 clock: Callable[[], float] = time.time, poll_s: float = 0.05, log_dir: Path | None = None):
        missing = set(specs) - set(transports) or set(specs) - set(offsets)
        if missing:
            raise HarnessError(f"synchronized launch: no transport/clock offset for {', '.join(sorted(missing))}")
        self.transports = transports
        self.specs = specs
        self.offsets = offsets
        self.policy = policy
        self.clock = clock
        self.poll_s = poll_s
        self.log_dir = log_dir
        self.runs: dict[str, NodeRun] = {n: NodeRun(n) for n in specs}
        self.go_ref_s: float | None = None
        self.round_trip_all_s = 0.0  # slowest parallel command round over all nodes seen while arming
        self.polled_rounds = 0  # `test -e` rounds sent while arming (none when every node prints its marker)
        self.events: list[dict] = []
        self._lock = threading.Lock()

    # -- context manager: stop everything on the way out of an exception
    def __enter__(self) -> "SynchronizedLaunch":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.stop_all(reason=f"{exc_type.__name__} in orchestrator")
        self._write_log()

    def _event(self, what: str, **kw) -> None:
        with self._lock:
            self.events.append({"t_s": self.clock(), "event": what, **kw})

    def _fail(self, node: str, error: str) -> None:
        run = self.runs[node]
        if run.error is None:
            run.error = error
            self._event("node_failed", node=node, error=error)

    # -- phases
    def arm(self, timeout_s: float = 60.0) -> GroupResult:
        """Spawn every process and wait until each has armed (or failed). Nothing starts reading yet."""
        def spawn(node: str, spec: LaunchSpec) -> Process:
            proc = self.transports[node].spawn(list(spec.command()))
            self.runs[node].process = proc
            return proc

        group = fan_out(self.specs, spawn)
        for node, err in group.failed.items():
            self._fail(node, f"spawn failed: {err}")
        self._event("spawned", nodes=sorted(group.succeeded))
        waiting = set(group.succeeded)
        deadline = self.clock() + timeout_s

        def streamed(node: str) -> bool | None:
            """Armed as seen in the node's output stream; None when it has to be polled on the node."""
            marker = self.specs[node].armed_marker
            out = self.runs[node].process.stdout_so_far() if marker else None
            return None if out is None else marker in out

        def check(node: str, spec: LaunchSpec) -> bool:
            proc = self.runs[node].process
            if proc is not None and proc.poll() is not None:
                raise HarnessError(f"exited with rc={proc.poll()} before arming")
            seen = streamed(node)
            if seen is not None:
                return seen
            res = self.transports[node].run(["test", "-e", spec.armed_path], timeout_s=30)
            if res.error or res.timed_out:
                raise HarnessError(f"cannot check armed state: {res.summary()}")
            return res.rc == 0

        while waiting and self.clock() < deadline:
            t_round = self.clock()
            polled = {n for n in waiting if streamed(n) is None}
            if polled:
                g = fan_out({n: self.specs[n] for n in waiting}, check)
                self.round_trip_all_s = max(self.round_trip_all_s, self.clock() - t_round)
                self.polled_rounds += 1
            else:  # nothing to send: every node's state is in its output already
                g = GroupResult({n: _local_outcome(n, lambda n=n: check(n, self.specs[n])) for n in waiting})
            for node, err in g.failed.items():
                self._fail(node, f"arming: {err}")
                waiting.discard(node)
            for node, armed in g.succeeded.items():
                if armed:
                    self.runs[node].armed_at_s = self.clock()
                    waiting.discard(node)
            if waiting:
                time.sleep(self.poll_s)
        for node in waiting:
            self._fail(node, f"not armed within {timeout_s:.0f} s")
        result = self._group(lambda r: r.armed_at_s is not None)
        self._event("armed", ok=sorted(result.succeeded), failed=result.failed)
        return result

    def release(self, lead_s: float | None = None, nodes: Sequence[str] | None = None) -> float:
        """Write every armed node's go file with one common start instant; returns it (our clock).

        lead_s: how far ahead of now the start is set, long enough for the parallel go-file writes to
        land first; default: 0.25 s plus twice the slowest parallel round seen while arming, or, where
        arming was seen in the output streams (no rounds sent), twice a probe round of the same writes.
        Writes that land late are recorded in the events (late_go_writes).
        """
        nodes = [n for n in (nodes or self.runs) if self.runs[n].armed_at_s is not None and self.runs[n].error is None]
        tmpdir = Path(tempfile.mkdtemp(prefix="kvgate-go-"))
        try:
            if lead_s is None:
                lead_s = 0.25 + 2 * (self.round_trip_all_s if self.polled_rounds else self._probe_round(nodes, tmpdir))
        except BaseException:
            shutil.rmtree(tmpdir, ignore_errors=True)
            raise
        go_ref = self.clock() + lead_s
        self.go_ref_s = go_ref

        def write(node: str, _):
            go_node = go_ref + self.offsets[node]
            # SFTP put over the already open session: no remote process to fork, so it lands fast. The
            # reader only accepts a go file that ends in a newline, so a partial write is never taken.
            local = tmpdir / node
            local.write_text(f"{go_node:.6f}\n")
            self.transports[node].put(local, self.specs[node].go_path)
            self.runs[node].go_node_s = go_node
            self.runs[node].go_written_at_s = self.clock()
            return go_node

        try:
            g = fan_out({n: None for n in nodes}, write)
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)
        for node, err in g.failed.items():
            self._fail(node, err)
        late = [n for n in g.succeeded if (self.runs[n].go_written_at_s or 0) > go_ref]
        self._event("released", go_ref_s=go_ref, lead_s=lead_s, late_go_writes=late)
        if g.failed and self.policy.on_node_failure == "abort":
            self.stop_all(reason="go signal failed on " + ", ".join(sorted(g.failed)))
        return go_ref

    def _probe_round(self, nodes: Sequence[str], tmpdir: Path) -> float:
        """How long one parallel round of go-file writes takes now: the same write (SFTP put of a line) to
        ``go_path + ".probe"`` on every node, which no reader looks at. Returns the round's seconds."""
        probe = tmpdir / "probe"
        probe.write_text("probe\n")
        t0 = self.clock()
        g = fan_out({n: None for n in nodes}, lambda n, _: self.transports[n].put(probe, self.specs[n].go_path + ".probe"))
        round_s = self.clock() - t0
        self._event("probe", round_s=round_s, failed=g.failed)
        return round_s

    def wait(self, timeout_s: float, stall_timeout_s: float | None = None,
             nodes: Sequence[str] | None = None) -> GroupResult:
        """Wait for every process; on timeout or (policy abort) a failure, stop every process group.

        stall_timeout_s: a process that streams progress (the G3 reader prints a sample every interval)
        and whose output stops growing for this long is failed as unreachable or hung and its group is
        stopped in the background, while the others read on; a node whose link went down is then
        noticed in seconds, not at the end of timeout_s. None: no stall detection.

        nodes: wait for these only (default: all); the others run on (G3's writer runs until the readers are
        done and is then told to stop). A timeout still stops every process group.
        """
        deadline = self.clock() + timeout_s
        pending = {n for n, r in self.runs.items() if r.process is not None and r.rc is None and not r.stopped
                   and (nodes is None or n in nodes)}
        # Silence counts from the start instant: a released reader prints nothing until then.
        quiet_from = max(self.clock(), self.go_ref_s or 0.0)
        seen: dict[str, tuple[int, float]] = {n: (-1, quiet_from) for n in pending}
        stoppers: list[threading.Thread] = []
        try:
            while pending:
                for node in list(pending):
                    run = self.runs[node]
                    rc = run.process.poll()
                    if rc is None:
                        if stall_timeout_s is not None:
                            size = output_bytes(run.process)
                            last_size, since = seen[node]
                            now = self.clock()
                            if size is None or size != last_size:
                                seen[node] = (size if size is not None else -1, max(now, since))
                            elif now - since >= stall_timeout_s:
                                pending.discard(node)
                                self._fail(node, f"no output for {now - since:.0f} s (node unreachable or hung): stopped")
                                th = threading.Thread(target=self._stop_one, args=(node, "stalled"), daemon=True)
                                th.start()
                                stoppers.append(th)
                                if self.policy.on_node_failure == "abort":
                                    self.stop_all(reason=f"{node} stalled and policy is abort")
                                    pending.clear()
                        continue
                    pending.discard(node)
                    self._collect(node, rc)
                    if run.error and self.policy.on_node_failure == "abort":
                        self.stop_all(reason=f"{node} failed and policy is abort")
                        pending.clear()
                if pending and self.clock() >= deadline:
                    for node in pending:
                        self._fail(node, f"still running after {timeout_s:.0f} s: stopped")
                    self.stop_all(reason="timeout")
                    break
                if pending:
                    time.sleep(self.poll_s)
        except BaseException:
            self.stop_all(reason="interrupted")
            raise
        finally:
            for th in stoppers:
                th.join(60.0)
        return self._group(lambda r: r.error is None and r.rc == 0)

    def _stop_one(self, node: str, reason: str, grace_s: float = 2.0) -> None:
        run = self.runs[node]
        if run.process is None or run.rc is not None:
            return
        self._event("stop", node=node, reason=reason)
        run.stopped = True
        try:
            run.process.kill_group(grace_s=grace_s)
        except Exception as exc:  # noqa: BLE001 - an unreachable node cannot be told anything
            self._event("stop_failed", node=node, error=_describe(exc))
        self._collect(node, run.process.wait(5.0))

    def _collect(self, node: str, rc: int | None) -> None:
        run = self.runs[node]
        run.rc = rc
        try:
            out, err = run.process.output()
        except Exception as exc:  # noqa: BLE001
            out, err = b"", f"(output unavailable: {exc})".encode()
        run.stdout = out.decode(errors="replace")
        run.stderr = err.decode(errors="replace")
        if rc != 0 and run.error is None:
            tail = (run.stderr.strip().splitlines() or [""])[-1][:300]
            self._fail(node, f"exited with rc={rc}" + (f": {tail}" if tail else ""))
        self._event("exited", node=node, rc=rc)

    def stop_all(self, reason: str, grace_s: float = 2.0) -> None:
        """Kill every still-running process group (in parallel); keep whatever output each produced."""
        live = {n: r for n, r in self.runs.items() if r.process is not None and r.rc is None and not r.stopped}
        if not live:
            return
        self._event("stop_all", reason=reason, nodes=sorted(live))

        def kill(node: str, run: NodeRun):
            run.stopped = True
            run.process.kill_group(grace_s=grace_s)
            rc = run.process.wait(10.0)
            self._collect(node, rc)
            if run.error is None:
                self._fail(node, f"stopped: {reason}")

        fan_out(live, kill)

    def _group(self, ok: Callable[[NodeRun], bool]) -> GroupResult:
        return GroupResult({n: NodeOutcome(n, ok(r), r, None if ok(r) else (r.error or "failed"))
                            for n, r in self.runs.items()})

    def _write_log(self) -> None:
        if self.log_dir is None:
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        (self.log_dir / "launch.json").write_text(json.dumps({
            "go_ref_s": self.go_ref_s,
            "policy": {"max_failed_share": self.policy.max_failed_share, "on_node_failure": self.policy.on_node_failure},
            "offsets_s": dict(self.offsets),
            "nodes": {n: r.as_dict() for n, r in self.runs.items()},
            "events": self.events,
        }, indent=1, default=str))
