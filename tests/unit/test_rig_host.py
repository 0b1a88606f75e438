"""The rigs' one host-side runner (harness.rigs.host.run_host) and the one SIGTERM -> SIGKILL killer
(harness.transport.procgroup.terminate) that the loopback guest, the namespace rig, the local transport and the
test sshd stop their processes with. The processes killed here are children this test starts, in their own
process groups; nothing else is signalled."""

import json
import os
import signal
import subprocess
import sys

import pytest

from harness.errors import HarnessError
from harness.rigs.host import CommandLog, run_host
from harness.transport.procgroup import group_exists, pid_alive, terminate


class RigFailure(HarnessError):
    pass


def test_a_host_command_is_run_logged_and_its_failures_become_the_rigs_error(tmp_path):
    log = CommandLog(tmp_path / "log", error=RigFailure)
    cp = log.run([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr)"])
    assert (cp.returncode, cp.stdout, cp.stderr) == (0, "out\n", "err\n")
    with pytest.raises(RigFailure, match=r"failed \(rc=3\): boom"):
        log.run([sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"])
    assert log.run([sys.executable, "-c", "raise SystemExit(3)"], check=False).returncode == 3
    with pytest.raises(RigFailure, match=r"kvgate-no-such-tool not found: apt-get install kvgate-pkg"):
        log.run(["kvgate-no-such-tool"], install_hint=lambda tool: "apt-get install kvgate-pkg")
    with pytest.raises(RigFailure, match=r"timed out after 0.5 s"):
        log.run([sys.executable, "-c", "import time; time.sleep(30)"], timeout_s=0.5)
    records = [json.loads(line) for line in (tmp_path / "log" / "commands.jsonl").read_text().splitlines()]
    assert [r["rc"] for r in records] == [0, 3, 3, None]  # the timed-out one too, without an exit status
    assert records[0]["stdout"] == "out\n" and records[1]["stderr"].strip() == "boom"


def test_bytes_by_default_and_the_input_goes_to_stdin():
    cp = run_host([sys.executable, "-c", "import sys; sys.stdout.write(sys.stdin.read().upper())"],
                  input_bytes=b"abc")
    assert cp.stdout == b"ABC"


# A leader that starts a grandchild in its own process group, then waits; with "ignore", both ignore SIGTERM.
GROUP = """
import signal, subprocess, sys, time
if sys.argv[1] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\\n"
                          "if sys.argv[1] == 'ignore': signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
                          "print('ready', flush=True); time.sleep(60)", sys.argv[1]])
print(child.pid, flush=True)
time.sleep(60)
"""


def _start_group(mode: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-c", GROUP, mode], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    grandchild = int(proc.stdout.readline())
    assert proc.stdout.readline().strip() == "ready"  # the grandchild set its handler before it printed
    return proc, grandchild


@pytest.mark.parametrize("mode, signal_seen", [("term", -signal.SIGTERM), ("ignore", -signal.SIGKILL)])
def test_a_whole_process_group_is_stopped_and_sigkill_follows_an_ignored_sigterm(mode, signal_seen):
    proc, grandchild = _start_group(mode)
    try:
        assert terminate([proc.pid], group=True, grace_s=0.5,
                         alive=lambda pgid: proc.poll() is None or group_exists(pgid)) == [proc.pid]
        assert proc.wait(5) == signal_seen  # the leader's own exit status, kept by its Popen
        assert not group_exists(proc.pid) and not pid_alive(grandchild)  # the grandchild went with its group
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_single_pids_are_stopped_one_by_one_and_gone_ones_are_not_signalled():
    proc = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                             "signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        done = subprocess.Popen([sys.executable, "-c", "pass"])
        done.wait()
        assert terminate([proc.pid, done.pid], group=False, grace_s=0.3) == [proc.pid]
        assert not pid_alive(proc.pid)  # it ignored SIGTERM: only the SIGKILL after the grace ended it
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
