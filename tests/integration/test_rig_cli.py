"""`kvgate rig down` and `rig status` act on the rig `rig up` recorded (its node count, prefix and state), whatever
flags they are given, and say what they left: a real 3-node rig (namespaces, sshds, sshfs) built by the CLI and torn
down by `rig down --nodes 1`, and a rig whose record is gone swept by its prefix. Needs root, /dev/fuse, iproute2,
openssh-server, sshfs (CI is root). Every rig is torn down in a finally, also when a test fails."""

import subprocess

import pytest

from harness.rigs.netns import RigSpec, check_prerequisites, existing_namespaces, rig_down
from kvgate_cli import kvgate

pytestmark = pytest.mark.integration

missing = check_prerequisites()
if missing:
    pytest.skip(f"rig prerequisites missing: {', '.join(missing)}", allow_module_level=True)

PREFIX = "kvrc-"   # this test's own rigs: never the default kvg- one


def ours() -> list[str]:
    return sorted(ns for ns in existing_namespaces() if ns.startswith(PREFIX))


def rig(*args, state_dir) -> subprocess.CompletedProcess:
    return kvgate("rig", *args, "--prefix", PREFIX, "--state-dir", state_dir, timeout=300)


def test_down_and_status_take_the_rig_up_recorded_whatever_node_count_they_are_given(tmp_path):
    sd = tmp_path / "rig"
    try:
        up = rig("up", "--nodes", "3", "--port-rate-mbit", "500", state_dir=sd)
        assert up.returncode == 0, up.stdout + up.stderr
        assert ours() == sorted(f"{PREFIX}{n}" for n in ("n1", "n2", "n3", "st", "hub"))
        st = rig("status", "--nodes", "8", state_dir=sd)   # flags that disagree with the rig that is there
        assert st.returncode == 0, st.stdout + st.stderr
        assert f"rig of 3 nodes as `rig up` recorded it ({sd}/rig.json); --nodes 8 ignored" in st.stdout
        assert "ssh: all reachable" in st.stdout and f"{PREFIX}n3" in st.stdout and f"{PREFIX}n4" not in st.stdout
        down = rig("down", "--nodes", "1", state_dir=sd)
        assert down.returncode == 0, down.stdout + down.stderr
        assert down.stdout.startswith(f"rig down: {PREFIX} rig of 3 nodes as `rig up` recorded it")
        assert "deleted 5 namespaces; left: no namespace, no process" in down.stdout and "--nodes 1 ignored" in down.stdout
        assert ours() == [] and not (sd / "rig.json").exists() and (sd / "keys").is_dir()
        again = rig("down", state_dir=sd)
        assert again.returncode == 0 and "deleted 0 namespaces" in again.stdout and "no record" in again.stdout
    finally:
        rig_down(RigSpec(prefix=PREFIX, state_dir=sd, node_count=3))
    assert ours() == []


def test_a_rig_whose_record_is_gone_is_swept_by_its_prefix_beyond_the_flags_node_count(tmp_path):
    sd = tmp_path / "rig"
    try:
        assert rig("up", "--nodes", "3", state_dir=sd).returncode == 0
        (sd / "rig.json").unlink()
        down = rig("down", "--nodes", "1", state_dir=sd)
        assert down.returncode == 0, down.stdout + down.stderr
        assert "no record of `rig up`" in down.stdout and "deleted 5 namespaces" in down.stdout
        assert ours() == []
    finally:
        rig_down(RigSpec(prefix=PREFIX, state_dir=sd, node_count=3))
