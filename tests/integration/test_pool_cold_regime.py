"""The serving gates' pool on a real loop device and the real evictor beside it (root; no engine): every read-back
of a stored file reaches the pool's device while the cold regime runs, and the page cache serves it when it does
not (the control that makes the first assertion mean something). The make's inverse tears it all down, twice
without harm."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness.node import program_path
from harness.parsers.pooldev import parse_pool_blockstat, pool_blockstat_argv, read_bytes_between
from harness.parsers.poolloop import cold_window_issue, evict_window, loop_pool_argv, loop_pool_undo_argv, mark_argv, \
    parse_evict_log, parse_loop_pool, parse_mark_made
from polling import wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="loop devices and mount need root")

FILE_BYTES = 4 * 1024 * 1024


def sh(argv) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True)


def device_stat(pool: Path):
    return parse_pool_blockstat(sh(pool_blockstat_argv(str(pool))).stdout)


@pytest.fixture
def pool(tmp_path):
    backing, mnt = tmp_path / "pool.img", tmp_path / "pool"
    r = sh(loop_pool_argv(str(backing), 256 * 1024 * 1024, str(mnt)))
    try:
        assert r.returncode == 0, r.stderr
        yield parse_loop_pool(r.stdout), mnt
    finally:
        sh(loop_pool_undo_argv(str(backing), str(mnt)))


def store(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(FILE_BYTES))


def read_back(pool: Path, path: Path) -> int:
    """Bytes the pool's device read while ``path`` was read whole."""
    before = device_stat(pool)
    assert path.read_bytes()
    return read_bytes_between(before, device_stat(pool))


def evictions(log: Path, after: str) -> int:
    text = log.read_text() if log.exists() else ""
    return sum(1 for line in text.splitlines() if line.startswith("{") and json.loads(line).get("after") == after)


def test_the_pool_is_its_own_loop_device_and_the_probe_counts_that_device(pool):
    loop, mnt = pool
    stat = device_stat(mnt)
    assert stat.maj_min == loop.maj_min and stat.source == loop.device
    assert sh(["findmnt", "-n", "-o", "FSTYPE", str(mnt)]).stdout.strip() == "ext4"


def test_without_the_cold_regime_a_stored_file_is_read_back_from_the_page_cache(pool):
    _, mnt = pool
    f = mnt / "chunk" / "model.layers.0.safetensors"
    store(f)
    assert read_back(mnt, f) < FILE_BYTES // 8  # the node's memory served it: what a gate must not credit


def test_the_evictor_makes_every_read_back_reach_the_device_and_logs_what_it_dropped(pool, tmp_path):
    _, mnt = pool
    log = tmp_path / "evict.jsonl"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, str(program_path("pool_evict.py")), str(mnt), "--pattern",
                                 "*.safetensors", "--settle-s", "0.2"], stdout=out, start_new_session=True)
    try:
        wait_until(lambda: '"start"' in log.read_text(), 30, "the evictor's start line")
        f = mnt / "abc" / "model.layers.0.safetensors"  # a directory made after the evictor started, as vLLM's
        store(f)
        wait_until(lambda: evictions(log, "store") >= 2, 30, "the store's evictions")
        assert read_back(mnt, f) >= FILE_BYTES
        wait_until(lambda: evictions(log, "read") >= 2, 30, "the read's evictions")
        assert read_back(mnt, f) >= FILE_BYTES  # a second resume of the same session is cold too
        other = mnt / "abc" / "notes.txt"  # not a pool file: left alone
        store(other)
        assert read_back(mnt, other) < FILE_BYTES // 8
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    s = parse_evict_log(log.read_text())
    assert s.ended and s.errors == 0 and s.files == 1 and s.evictions >= 4
    assert s.dropped_bytes >= FILE_BYTES  # the stored pages it found resident and dropped


def test_the_inverse_unmounts_detaches_and_removes_and_may_run_twice(tmp_path):
    backing, mnt = tmp_path / "pool.img", tmp_path / "pool"
    r = sh(loop_pool_argv(str(backing), 128 * 1024 * 1024, str(mnt)))
    loop = parse_loop_pool(r.stdout)
    for _ in range(2):
        assert sh(loop_pool_undo_argv(str(backing), str(mnt))).returncode == 0
    assert not backing.exists()
    assert sh(["findmnt", str(mnt)]).returncode != 0
    assert str(backing) not in sh(["losetup", "-a"]).stdout  # (its device number may be reused by now)
    assert loop.device.startswith("/dev/loop")


def test_a_read_before_the_evictor_dropped_its_store_is_a_breach_logged_before_the_points_mark(pool, tmp_path):
    # the evictor held (SIGSTOP: a node whose device stalls its write-back) while a store lands and is read back:
    # the page cache serves that read, and once the evictor runs again it logs the read as a breach, before the
    # mark kvgate writes after the point; a store read after its eviction (the next point) is no breach
    _, mnt = pool
    log = tmp_path / "evict.jsonl"
    f = mnt / "abc" / "model.layers.0.safetensors"
    f.parent.mkdir()  # watched from the evictor's start
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, str(program_path("pool_evict.py")), str(mnt), "--pattern",
                                 "*.safetensors", "--settle-s", "0.2"], stdout=out, start_new_session=True)
    try:
        wait_until(lambda: '"start"' in log.read_text(), 30, "the evictor's start line")
        os.kill(proc.pid, signal.SIGSTOP)
        store(f)
        assert read_back(mnt, f) < FILE_BYTES // 8  # served from memory: the breach is real
        r = sh(mark_argv(str(mnt), "x2-t1"))
        made = parse_mark_made(r.stdout)
        os.kill(proc.pid, signal.SIGCONT)
        wait_until(lambda: evict_window(log.read_text(), "x2-t1") is not None, 30, "the point's mark")
        w = evict_window(log.read_text(), "x2-t1", made)
        assert w.breaches == 1 and w.first_breach == str(f) and w.lag_s is not None and w.lag_s >= 0
        assert not (mnt / ".kvgate-mark-x2-t1").exists()  # the evictor removed its mark
        assert "the cold regime fell behind: 1 read(s)" in cold_window_issue(w)
        g = mnt / "abd" / "model.layers.0.safetensors"  # the next point: the evictor keeps up
        store(g)
        wait_until(lambda: evictions(log, "store") >= 4, 30, "the second store's evictions")
        assert read_back(mnt, g) >= FILE_BYTES
        sh(mark_argv(str(mnt), "x4-t1"))
        wait_until(lambda: evict_window(log.read_text(), "x4-t1") is not None, 30, "the next point's mark")
        w = evict_window(log.read_text(), "x4-t1")
        assert w.breaches == 0 and cold_window_issue(w) is None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    s = parse_evict_log(log.read_text())
    assert s.ended and s.breaches == 1 and s.errors == 0
