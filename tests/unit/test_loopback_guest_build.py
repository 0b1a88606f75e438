"""Guest build/run helpers that need no qemu: package resolution, the qemu command line, stop safety."""

import json
import subprocess
import sys
from pathlib import Path

from harness.rigs import guest as G


def test_kernel_package_from_depends():
    assert G.parse_apt_depends("linux-image-6.1.0-57-amd64 (= 6.1.192-3)") == "linux-image-6.1.0-57-amd64"
    assert G.parse_apt_depends("linux-image-6.12.9-amd64-unsigned | linux-image-6.12.9-amd64, foo") == \
        "linux-image-6.12.9-amd64-unsigned"
    assert G.parse_apt_depends("initramfs-tools, linux-base") is None


def test_qemu_argv_is_tcg_and_forwards_only_loopback(tmp_path):
    img = G.GuestImage("k", tmp_path, tmp_path / "vmlinuz", tmp_path / "initrd.cpio", "6.1.0-1-amd64", "p 1",
                       tmp_path / "id", "ssh-ed25519 AAAA", {})
    argv = G.qemu_argv(img, 2222, tmp_path / "console.log")
    joined = " ".join(argv)
    assert "-accel tcg,thread=multi" in joined and "-cpu max" in joined and "-smp 2" in joined
    netdev = argv[argv.index("-netdev") + 1]
    assert "restrict=on" in netdev and "hostfwd=tcp:127.0.0.1:2222-:22" in netdev
    assert argv[argv.index("-serial") + 1] == f"file:{tmp_path / 'console.log'}"


def test_stop_guest_never_signals_a_process_that_is_not_our_qemu(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        state = G.GuestState(pid=proc.pid, ssh_port=1, host="127.0.0.1", user="root", identity_file="i",
                             known_hosts_path="k", console_log="c", initrd_path=str(tmp_path / "initrd.cpio"),
                             kernel_release="r", started_at=0.0)
        (tmp_path / "guest.json").write_text(state.to_json())
        assert G.stop_guest(tmp_path) is False
        assert proc.poll() is None  # still running: its command line is not qemu with our initrd
        assert not (tmp_path / "guest.json").exists()
    finally:
        proc.kill()
        proc.wait()


def test_stop_guest_without_state_is_a_no_op(tmp_path):
    assert G.stop_guest(tmp_path) is False
    assert G.guest_running(tmp_path) is None


def test_missing_tool_names_the_package(monkeypatch):
    try:
        G._run(["definitely-not-a-tool-kvgate"])
    except G.GuestError as exc:
        assert "definitely-not-a-tool-kvgate not found" in str(exc)
    else:
        raise AssertionError("expected GuestError")
    try:
        G._run(["qemu-system-x86_64-missing"])
    except G.GuestError as exc:
        assert "install" in str(exc)


def test_free_port_is_bindable():
    from harness.transport.local import free_port  # the one free-port helper, also the guest's
    port = free_port()
    assert G.port_is_free(port)
