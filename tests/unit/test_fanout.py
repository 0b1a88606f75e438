"""Group results, failure policy, clock offsets (scripted clock at the Transport seam), clock alignment."""

import pytest

from harness.errors import HarnessError
from harness.execute.clock import ClockOffset, applied_offset_s, measure_clock_offset, measure_clock_offsets
from harness.execute.fanout import FailurePolicy, GroupResult, NodeOutcome, fan_out
from harness.transport import CommandResult, Transport


def test_fan_out_keeps_every_node_and_turns_exceptions_into_data():
    def fn(node, x):
        if node == "b":
            raise HarnessError("disk gone")
        if node == "c":
            raise ValueError("bad")
        return x * 2

    g = fan_out({"a": 1, "b": 2, "c": 3, "d": 4}, fn)
    assert set(g) == {"a", "b", "c", "d"}
    assert g.succeeded == {"a": 2, "d": 8}
    assert g.failed == {"b": "disk gone", "c": "ValueError: bad"}
    assert g.failed_share == 0.5
    assert "2/4 nodes failed" in g.summary()


def test_failure_policy_decides_error_by_share():
    g = GroupResult({n: NodeOutcome(n, n != "x", None, None if n != "x" else "died") for n in "abcx"})
    assert FailurePolicy(0.0).verdict_error(g).startswith("1 of 4 nodes failed")
    assert FailurePolicy(0.25).verdict_error(g) is None
    assert FailurePolicy(0.2).verdict_error(g) is not None
    with pytest.raises(ValueError):
        FailurePolicy(1.5)
    with pytest.raises(ValueError):
        FailurePolicy(0.0, "ignore")


class FakeClockTransport(Transport):
    """Answers `date +%s.%N` from a scripted clock: node clock = ours + offset, sampled `lag` into the trip."""

    name = "fake"

    def __init__(self, clock, offset_s, delays):
        self.clock, self.offset_s, self.delays = clock, offset_s, list(delays)

    def _start(self, argv, env, stdin, log_path):
        raise NotImplementedError

    def put(self, local_path, remote_path):
        raise NotImplementedError

    def get(self, remote_path, local_path):
        raise NotImplementedError

    def run(self, argv, timeout_s=None, env=None, stdin=None):
        out_s, back_s = self.delays.pop(0)
        self.clock.t += out_s
        node_t = self.clock.t + self.offset_s
        self.clock.t += back_s
        return CommandResult(tuple(argv), 0, f"{node_t:.9f}\n", "", out_s + back_s)


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_clock_offset_from_round_trips_with_asymmetric_delays():
    clock = FakeClock()
    # slow, asymmetric trips and one quick symmetric one: the quick one decides.
    t = FakeClockTransport(clock, 3.25, [(0.200, 0.010), (0.002, 0.002), (0.090, 0.001)])
    off = measure_clock_offset(t, samples=3, clock=clock)
    assert off.offset_s == pytest.approx(3.25, abs=1e-6)
    assert off.rtt_s == pytest.approx(0.004)
    assert off.samples == 3


def test_applied_offset_modes():
    significant = ClockOffset(offset_s=2.0, uncertainty_s=0.05, rtt_s=0.1, samples=5)
    noise = ClockOffset(offset_s=0.06, uncertainty_s=0.07, rtt_s=0.14, samples=5)
    assert applied_offset_s(significant) == 2.0
    assert applied_offset_s(noise) == 0.0  # inside its own error bar: not distinguishable from 0
    assert applied_offset_s(noise, "measured") == 0.06
    assert applied_offset_s(significant, "assume_synced") == 0.0
    with pytest.raises(ValueError):
        applied_offset_s(noise, "guess")


class TimingOutTransport(FakeClockTransport):
    """A node whose every command times out (e.g. a hung login shell): counts the probes it was sent."""

    def __init__(self):
        self.calls = []

    def run(self, argv, timeout_s=None, env=None, stdin=None):
        self.calls.append(timeout_s)
        return CommandResult(tuple(argv), None, "", "", timeout_s, True)


def test_clock_probe_fails_the_node_at_its_first_timeout():
    t = TimingOutTransport()
    with pytest.raises(HarnessError, match="timed out after 2 s"):
        measure_clock_offset(t, samples=5, timeout_s=2.0)
    assert t.calls == [2.0]  # one bounded probe, not timeout x samples


def test_clock_offsets_group_keeps_the_live_nodes_when_one_times_out():
    clock = FakeClock()
    live = FakeClockTransport(clock, -0.5, [(0.001, 0.001)] * 3)
    g = measure_clock_offsets({"a": live, "dead": TimingOutTransport()}, samples=3, clock=clock, timeout_s=1.0)
    assert g.succeeded["a"].offset_s == pytest.approx(-0.5, abs=1e-6)
    assert "timed out" in g.failed["dead"]


def test_ctrl_c_returns_at_once_instead_of_waiting_for_every_node():
    # The caller (the runner) must get the interrupt while nodes still run, to stop their process groups.
    import os
    import signal
    import threading
    import time

    from signals import ctrl_c_raises

    release = threading.Event()
    t0 = time.monotonic()
    with ctrl_c_raises(), pytest.raises(KeyboardInterrupt):  # whatever SIGINT was when the suite started
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
        fan_out({"a": 1, "b": 2}, lambda node, x: release.wait(10))
    assert time.monotonic() - t0 < 2
    release.set()
