"""SynchronizedLaunch with real reader processes on LocalTransport 'nodes': arm, release together,
Ctrl-C and a failing node stop every process group, partial output kept."""

import _thread
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.execute.fanout import FailurePolicy, LaunchSpec, SynchronizedLaunch
from harness.parsers.g3series import parse_reader_output, start_skew_s
from harness.node import program_path
from harness.transport import LocalTransport
from signals import ctrl_c_raises

pytestmark = pytest.mark.integration

READER = program_path("g3_reader.py")


def make_pool(tmp_path, size_bytes):
    pool = tmp_path / "pool"
    pool.mkdir()
    with open(pool / "kv.data", "wb") as fh:
        fh.truncate(size_bytes)  # sparse: reads are fast but take a while at this size
    (pool / "m.json").write_text(json.dumps({"files": ["kv.data"]}))
    return pool


def specs_for(tmp_path, pool, nodes, manifest="m.json"):
    out = {}
    for n in nodes:
        d = tmp_path / n
        d.mkdir()
        argv = (sys.executable, str(READER), "--manifest", str(pool / manifest), "--pool-dir", str(pool),
                "--node", n, "--direct", "off", "--streams", "1", "--block-bytes", str(1 << 20),
                "--interval-s", "0.05", "--armed-file", str(d / "armed"), "--go-file", str(d / "go"),
                "--deadline-s", "120")
        out[n] = LaunchSpec(argv, str(d / "armed"), str(d / "go"))
    return out


def gone(pgid):
    try:
        os.killpg(pgid, 0)
        return False
    except ProcessLookupError:
        return True


def test_release_together_and_complete(tmp_path):
    pool = make_pool(tmp_path, 64 << 20)
    nodes = ["a", "b", "c"]
    tr = {n: LocalTransport(n) for n in nodes}
    with SynchronizedLaunch(tr, specs_for(tmp_path, pool, nodes), {n: 0.0 for n in nodes},
                            log_dir=tmp_path / "log") as launch:
        armed = launch.arm(timeout_s=30)
        assert set(armed.succeeded) == set(nodes)
        go = launch.release()
        res = launch.wait(timeout_s=60)
    assert not res.failed
    series = {n: parse_reader_output(launch.runs[n].stdout, n).series for n in nodes}
    assert all(s.completed and s.total_bytes == 64 << 20 for s in series.values())
    assert all(s.started_at_s >= go - 0.001 for s in series.values())  # nobody jumped the gun
    assert start_skew_s(series) < 0.5
    assert json.loads((tmp_path / "log" / "launch.json").read_text())["go_ref_s"] == go


def test_ctrl_c_stops_every_process_group_and_keeps_partial_output(tmp_path):
    pool = make_pool(tmp_path, 200 << 30)  # far more than can be read before the interrupt
    nodes = ["a", "b"]
    tr = {n: LocalTransport(n) for n in nodes}
    launch = SynchronizedLaunch(tr, specs_for(tmp_path, pool, nodes), {n: 0.0 for n in nodes})
    # ctrl_c_raises: interrupt_main does nothing where SIGINT is ignored (nohup, a background job)
    with ctrl_c_raises(), pytest.raises(KeyboardInterrupt):
        with launch:
            launch.arm(timeout_s=30)
            launch.release(lead_s=0.2)
            threading.Timer(1.5, _thread.interrupt_main).start()
            launch.wait(timeout_s=60)
    for n in nodes:
        run = launch.runs[n]
        assert run.stopped and run.error
        assert gone(run.process.pid)
        out = parse_reader_output(run.stdout, n)
        assert out.truncated and len(out.series.intervals) >= 3


def test_abort_policy_stops_the_others_when_one_node_fails(tmp_path):
    pool = make_pool(tmp_path, 200 << 30)
    nodes = ["a", "b", "c"]
    tr = {n: LocalTransport(n) for n in nodes}
    launch = SynchronizedLaunch(tr, specs_for(tmp_path, pool, nodes), {n: 0.0 for n in nodes},
                                policy=FailurePolicy(0.0, "abort"))
    with launch:
        launch.arm(timeout_s=30)
        launch.release(lead_s=0.2)
        threading.Timer(1.0, lambda: os.killpg(launch.runs["b"].process.pid, 9)).start()
        t0 = time.time()
        res = launch.wait(timeout_s=60)
    assert time.time() - t0 < 20
    assert set(res.failed) == set(nodes)
    assert "rc=-9" in launch.runs["b"].error
    assert all(launch.runs[n].stopped for n in ("a", "c"))
    assert all(gone(launch.runs[n].process.pid) for n in nodes)


def test_a_node_that_cannot_arm_fails_alone(tmp_path):
    pool = make_pool(tmp_path, 8 << 20)
    nodes = ["a", "b"]
    specs = specs_for(tmp_path, pool, nodes)
    bad = list(specs["b"].argv)
    bad[bad.index("--manifest") + 1] = str(pool / "missing.json")
    specs["b"] = LaunchSpec(tuple(bad), specs["b"].armed_path, specs["b"].go_path)
    tr = {n: LocalTransport(n) for n in nodes}
    with SynchronizedLaunch(tr, specs, {n: 0.0 for n in nodes}) as launch:
        armed = launch.arm(timeout_s=30)
        assert set(armed.failed) == {"b"} and "before arming" in armed.failed["b"]
        launch.release()
        res = launch.wait(timeout_s=30)
    assert set(res.succeeded) == {"a"}


def test_a_silent_node_is_failed_and_stopped_while_the_others_read_on(tmp_path):
    # "b" is frozen (SIGSTOP) right after the start, as a node whose link went down looks from here: its
    # output stops. It must be failed after stall_timeout_s and its process group killed, long before
    # the read timeout, while "a" completes; b's samples from before the freeze are kept.
    pool = make_pool(tmp_path, 200 << 30)
    (tmp_path / "s").mkdir()
    small = make_pool(tmp_path / "s", 256 << 20)
    nodes = ["a", "b"]
    tr = {n: LocalTransport(n) for n in nodes}
    specs = specs_for(tmp_path, pool, nodes)
    a_argv = list(specs["a"].argv)
    a_argv[a_argv.index("--manifest") + 1] = str(small / "m.json")
    a_argv[a_argv.index("--pool-dir") + 1] = str(small)
    specs["a"] = LaunchSpec(tuple(a_argv), specs["a"].armed_path, specs["a"].go_path)
    with SynchronizedLaunch(tr, specs, {n: 0.0 for n in nodes}, poll_s=0.02) as launch:
        assert set(launch.arm(timeout_s=30).succeeded) == set(nodes)
        launch.release(lead_s=0.2)
        time.sleep(0.8)
        pgid_b = launch.runs["b"].process.pid
        os.killpg(pgid_b, signal.SIGSTOP)
        t0 = time.monotonic()
        res = launch.wait(timeout_s=120, stall_timeout_s=1.5)
        waited = time.monotonic() - t0
    assert waited < 100  # stall detection, not the 120 s read timeout
    assert set(res.failed) == {"b"} and "no output" in res.failed["b"]
    assert launch.runs["b"].stopped
    assert parse_reader_output(launch.runs["a"].stdout, "a").series.completed
    partial = parse_reader_output(launch.runs["b"].stdout, "b")
    assert partial.series.intervals and not partial.series.completed
    assert gone(pgid_b)


class CountingTransport(LocalTransport):
    """A local node that remembers every command sent to it."""

    def __init__(self, name):
        super().__init__(name)
        self.sent = []

    def run(self, argv, *a, **kw):
        self.sent.append(("run",) + tuple(argv))
        return super().run(argv, *a, **kw)

    def spawn(self, argv, *a, **kw):
        self.sent.append(("spawn",) + tuple(argv))
        return super().spawn(argv, *a, **kw)


def test_arming_seen_in_the_output_stream_sends_no_command_per_check(tmp_path):
    from harness.workloads.g3_shared_read import ARMED_MARKER

    pool = make_pool(tmp_path, 64 << 20)
    nodes = ["a", "b", "c"]
    tr = {n: CountingTransport(n) for n in nodes}
    specs = {n: LaunchSpec(s.argv, s.armed_path, s.go_path, ARMED_MARKER)
             for n, s in specs_for(tmp_path, pool, nodes).items()}
    for s in specs.values():  # a stale go file from an earlier run would release its reader at once
        Path(s.go_path).write_text("1.0\n")
    with SynchronizedLaunch(tr, specs, {n: 0.0 for n in nodes}, log_dir=tmp_path / "log") as launch:
        assert set(launch.arm(timeout_s=30).succeeded) == set(nodes)
        go = launch.release()
        res = launch.wait(timeout_s=60)
    assert not res.failed
    # One command per node (a stale go file cleared, then the reader in the same process), none per check.
    assert all(t.sent == [("spawn",) + specs[n].command()] for n, t in tr.items())
    assert launch.polled_rounds == 0
    events = {e["event"]: e for e in launch.events}
    # The start was set ahead by twice a probe round of go-file writes, and every real write beat it.
    assert events["probe"]["failed"] == {} and events["released"]["late_go_writes"] == []
    assert events["released"]["lead_s"] == pytest.approx(0.25 + 2 * events["probe"]["round_s"])
    series = {n: parse_reader_output(launch.runs[n].stdout, n).series for n in nodes}
    assert all(s.completed and s.started_at_s >= go - 0.001 for s in series.values())
