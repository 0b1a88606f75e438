"""Secrets reach the node through the transport's environment or stdin, never a command line: a real sshd on
loopback records every command line it is given (ForceCommand keeps it in $SSH_ORIGINAL_COMMAND, which is what
`ps` shows other users of the node as the login shell's argument), and every process's /proc/PID/cmdline is
read while a command with a secret runs. The command still sees the value."""

import os
import secrets
from pathlib import Path

import pytest
from polling import wait_until

from harness.transport import LocalTransport, SSHTransport
from harness.transport.sshd import PrivateSshd
from harness.transport.steps import StepLog

pytestmark = pytest.mark.integration


def canary() -> str:
    return "kvcanary" + secrets.token_hex(12)


@pytest.fixture(scope="module")
def recording_sshd(tmp_path_factory):
    """A private sshd that writes each command line it receives to ``commands.log``, then runs it."""
    work = tmp_path_factory.mktemp("rec-sshd")
    record = work / "commands.log"
    force = work / "record.sh"
    force.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$SSH_ORIGINAL_COMMAND\" >> {record}\n"
                     "exec /bin/sh -c \"$SSH_ORIGINAL_COMMAND\"\n")
    force.chmod(0o755)
    server = PrivateSshd(work / "sshd", extra_config=f"ForceCommand {force}\n").start()
    server.record = record
    yield server
    server.stop()


def ssh_to(server) -> SSHTransport:
    return SSHTransport("127.0.0.1", server.port, server.user, str(server.client_key),
                        known_hosts_path=str(server.known_hosts))


@pytest.fixture(params=["local", "ssh"])
def transport(request, recording_sshd):
    t = LocalTransport() if request.param == "local" else ssh_to(recording_sshd)
    yield t
    t.close()


def cmdlines_holding(value: str) -> list[str]:
    """Every process of this machine whose command line holds ``value``, except this test's own."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if value.encode() in cmd:
            found.append(pid + ": " + cmd.replace(b"\0", b" ").decode(errors="replace"))
    return found


def test_the_command_sees_the_secret_its_command_line_does_not(transport, recording_sshd):
    token = canary()
    r = transport.run(["sh", "-c", 'printf "%s|%s|" "$HF_TOKEN" "$KV_PLAIN"; tr "\\0" " " < /proc/$$/cmdline'],
                      env={"HF_TOKEN": token, "KV_PLAIN": "a b;c 'q'"}, timeout_s=60)
    assert r.ok, r.summary()
    seen_token, plain, cmdline = r.stdout.split("|", 2)
    assert (seen_token, plain) == (token, "a b;c 'q'")
    assert token not in cmdline and "printf" in cmdline
    if isinstance(transport, SSHTransport):
        sent = recording_sshd.record.read_text()
        assert "printf" in sent and token not in sent, sent


def test_stdin_after_the_environment_reaches_the_command_whole(transport):
    token = canary()
    payload = bytes(range(256)) * 300 + b"\n\nKV=1\n"  # blank lines and assignments are the command's own data
    r = transport.run(["sh", "-c", 'printf "%s\\n" "$API_KEY"; cat'], env={"API_KEY": token}, stdin=payload,
                      timeout_s=60)
    assert r.ok and r.stdout.startswith(token + "\n") and r.stdout.endswith("\n\nKV=1\n")
    out = transport.run(["sh", "-c", "cat | wc -c"], env={"API_KEY": token}, stdin=payload, timeout_s=60)
    assert out.stdout.strip() == str(len(payload))


def test_no_process_shows_the_secret_while_a_spawned_command_runs(transport, tmp_path, recording_sshd):
    """An engine: spawned with its output to a log and a secret in its environment, looked at from outside
    while it runs, as another user of the node would with ps."""
    token = canary()
    log = tmp_path / "engine.log"
    p = transport.spawn(["sh", "-c", 'echo "started with $HF_TOKEN"; exec sleep 300'], env={"HF_TOKEN": token},
                        log_path=str(log))
    try:
        wait_until(lambda: log.exists() and "started with" in log.read_text(), what="the spawned command's log")
        assert token in log.read_text()  # it got the value
        assert cmdlines_holding(token) == []
    finally:
        p.kill_group(grace_s=1)
        p.wait(10)
    if isinstance(transport, SSHTransport):
        assert token not in recording_sshd.record.read_text()


def test_a_session_gets_its_environment_and_keeps_its_stdin(transport, recording_sshd):
    if not transport.supports_sessions:
        pytest.skip("no sessions")
    token = canary()
    p = transport.open_session(["sh", "-c", 'printf "%s\\n" "$KV_SECRET"; while read -r l; do echo "got $l"; done'],
                               env={"KV_SECRET": token})
    try:
        p.send(b"one\n")
        assert p.wait_stdout_bytes(len(token) + 1 + len("got one\n"), 60)
        assert p.stdout_so_far() == f"{token}\ngot one\n".encode()
        assert cmdlines_holding(token) == []
        p.close_stdin()
        assert p.wait(30) == 0
    finally:
        p.kill_group(grace_s=1)
    if isinstance(transport, SSHTransport):
        assert token not in recording_sshd.record.read_text()


def test_step_records_over_ssh_hold_no_secret(recording_sshd, tmp_path):
    token = canary()
    t = ssh_to(recording_sshd)
    try:
        steps = StepLog(tmp_path / "run")
        r = steps.run(t, "echo", ["sh", "-c", 'echo "token $HF_TOKEN"'], env={"HF_TOKEN": token}, timeout_s=60)
        assert r.ok and r.stdout == f"token {token}\n"  # the command printed it ...
        for f in (tmp_path / "run").rglob("*"):  # ... and no byte kvgate wrote holds it
            assert not f.is_file() or token.encode() not in f.read_bytes(), f
    finally:
        t.close()
    assert token not in recording_sshd.record.read_text()


def test_a_file_fetched_from_a_node_is_redacted_in_its_copy(sshd, tmp_path):
    """An engine's log, fetched over SFTP into the run directory, that echoes a secret kvgate passed."""
    token = canary()
    t = SSHTransport("127.0.0.1", sshd.port, sshd.user, str(sshd.client_key), known_hosts_path=str(sshd.known_hosts))
    try:
        remote = tmp_path / "node" / "engine.log"
        remote.parent.mkdir()
        r = t.run(["sh", "-c", f'echo "debug: HF_TOKEN=$HF_TOKEN" > {remote}'], env={"HF_TOKEN": token}, timeout_s=60)
        assert r.ok and token in remote.read_text()
        t.get(str(remote), tmp_path / "run" / "engine.log")
        copy = (tmp_path / "run" / "engine.log").read_text()
        assert copy.startswith("debug: HF_TOKEN=") and token not in copy
    finally:
        t.close()


def test_a_value_with_a_newline_is_refused_not_sent(recording_sshd):
    t = ssh_to(recording_sshd)
    try:
        before = recording_sshd.record.read_text() if recording_sshd.record.exists() else ""
        r = t.run(["true"], env={"KV_A": "two\nlines"})
        assert r.error is not None and "newline" in r.error
        assert (recording_sshd.record.read_text() if recording_sshd.record.exists() else "") == before
    finally:
        t.close()
