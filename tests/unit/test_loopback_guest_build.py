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


def _image(tmp_path):
    return G.GuestImage("k", tmp_path, tmp_path / "vmlinuz", tmp_path / "initrd.cpio", "6.1.0-1-amd64", "p 1",
                        tmp_path / "id", "ssh-ed25519 AAAA", {})


def test_host_tree_is_shared_read_only_and_only_when_an_engine_python_is_named(tmp_path):
    plain = G.qemu_argv(_image(tmp_path), 2222, tmp_path / "console.log")
    assert "-fsdev" not in plain and not any("9p" in a for a in plain)
    assert "kvgate.engine_python" not in plain[plain.index("-append") + 1]
    argv = G.qemu_argv(_image(tmp_path), 2222, tmp_path / "console.log", engine_python="/opt/venv/bin/python")
    fsdev = argv[argv.index("-fsdev") + 1].split(",")
    assert fsdev[0] == "local" and "path=/" in fsdev and "readonly=on" in fsdev  # qemu refuses every guest write
    # inode numbers of the host's filesystems remapped per device: /proc and /sys (both inode 1) stay two
    # directories in the guest, so the engine's chroot gets the guest's procfs at /proc
    assert "multidevs=remap" in fsdev
    assert f"mount_tag={G.HOST_SHARE_TAG}" in argv[argv.index("-fsdev") + 3]
    assert argv[argv.index("-append") + 1].endswith(" kvgate.engine_python=/opt/venv/bin/python")
    # the guest mounts it read-only too, and the wrapper refuses to run on a share that is not read-only
    assert f"mount -t 9p -o ro," in G.RCS and f'" {G.HOST_SHARE_DIR} 9p ro[, ]"' in G.ENGINE_WRAPPER


def test_engine_python_must_be_an_absolute_executable_path_without_blanks(tmp_path):
    assert G.check_engine_python(sys.executable) == sys.executable
    for bad, why in (("python3", "absolute path"), ("/opt/my venv/python", "absolute path"),
                     (str(tmp_path / "missing"), "not an executable")):
        try:
            G.check_engine_python(bad)
        except G.GuestError as exc:
            assert why in str(exc)
        else:
            raise AssertionError(f"{bad!r} accepted")


def test_guest_up_with_a_wrong_engine_python_is_bad_input_before_anything_starts(tmp_path, capsys):
    from harness.cli.main import main
    assert main(["loopback", "guest-up", "--state-dir", str(tmp_path), "--engine-python", "venv/bin/nope"]) == 2
    err = capsys.readouterr().err
    assert "--engine-python" in err and "not an executable file" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "guest.json").exists()


def test_the_engine_wrapper_and_its_modules_are_part_of_the_build_cache_key(monkeypatch):
    key = G._cache_key("linux-image-x", "1", {"fio": "3"})
    assert "9p" in G.GUEST_MODULES and "9pnet_virtio" in G.GUEST_MODULES
    assert "/usr/sbin/mke2fs" in G.HOST_BINARIES and "/usr/bin/findmnt" in G.HOST_BINARIES
    monkeypatch.setattr(G, "ENGINE_WRAPPER", G.ENGINE_WRAPPER + "# changed\n")
    assert G._cache_key("linux-image-x", "1", {"fio": "3"}) != key
    # the real tools that busybox's applets must not shadow are part of the key too (an image built before tc was
    # skipped ran busybox's tc for the slow path)
    assert "tc" in G.BUSYBOX_SKIP and "/usr/sbin/tc" in G.HOST_BINARIES
    before = G._cache_key("linux-image-x", "1", {"fio": "3"})
    monkeypatch.setattr(G, "BUSYBOX_SKIP", G.BUSYBOX_SKIP - {"tc"})
    assert G._cache_key("linux-image-x", "1", {"fio": "3"}) != before


def test_qemu_pids_finds_only_qemu_booting_that_initrd(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", str(tmp_path / "initrd.cpio")])
    try:  # not qemu, though its command line names the initrd
        assert proc.pid not in G.qemu_pids(str(tmp_path / "initrd.cpio"))
    finally:
        proc.kill()
        proc.wait()


def test_guest_up_with_a_kernel_package_that_is_no_package_name_is_bad_input_before_anything_starts(tmp_path, capsys):
    from harness.cli.main import main
    for bad in ("linux image", "vim", "linux-image-amd64=6.1", "linux-image-../x", "linux-image-"):
        assert main(["loopback", "guest-up", "--state-dir", str(tmp_path), "--kernel-package", bad]) == 2, bad
        err = capsys.readouterr().err
        assert "--kernel-package" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "guest.json").exists()


def test_a_kernel_metapackage_resolves_to_the_image_it_depends_on_and_an_image_to_itself(monkeypatch):
    """apt-cache show as bookworm answers it: linux-image-6.12-amd64 depends on the versioned image, which
    depends on no other image."""
    shown = {
        "linux-image-6.12-amd64": "Package: linux-image-6.12-amd64\nVersion: 6.12.118-1~deb12u1\n"
                                  "Depends: linux-image-6.12.118+deb12-amd64 (= 6.12.118-1~deb12u1)\n",
        "linux-image-6.12.118+deb12-amd64": "Package: linux-image-6.12.118+deb12-amd64\n"
                                            "Version: 6.12.118-1~deb12u1\nDepends: kmod, linux-base (>= 4.3~)\n",
    }

    def run(argv, check=True, **kw):
        text = shown.get(argv[-1])
        return subprocess.CompletedProcess(argv, 0 if text else 100, (text or "").encode(),
                                           b"" if text else b"E: No packages found")
    monkeypatch.setattr(G, "_run", run)
    assert G.resolve_kernel_package("linux-image-6.12-amd64") == ("linux-image-6.12.118+deb12-amd64",
                                                                   "6.12.118-1~deb12u1")
    assert G.resolve_kernel_package("linux-image-6.12.118+deb12-amd64") == ("linux-image-6.12.118+deb12-amd64",
                                                                             "6.12.118-1~deb12u1")
    try:
        G.resolve_kernel_package("linux-image-9.9-amd64")
    except G.GuestError as exc:
        assert "apt-cache knows no linux-image-9.9-amd64" in str(exc)
    else:
        raise AssertionError("an unknown package resolved")
