"""A gate's view of a node transport: cancel stops exactly the gate's process groups and starts nothing more,
while the node's connection keeps serving the next gate. Real processes on this machine."""

import time

import pytest

from harness.errors import TransportError
from harness.transport import LocalTransport, ScopedTransport

pytestmark = pytest.mark.integration


def test_cancel_stops_only_the_views_processes_and_refuses_new_ones(tmp_path):
    node = LocalTransport("n1")
    other = node.spawn(["sleep", "300"])  # started outside the gate: not the gate's to stop
    try:
        view = ScopedTransport(node)
        # a shell that starts a child: killing the group must take the child too
        mine = view.spawn(["sh", "-c", "sleep 300 & echo $! > \"$1\"; wait", "sh", str(tmp_path / "child")])
        assert view.run(["true"], timeout_s=60).ok
        deadline = time.monotonic() + 60
        while not _read(tmp_path / "child").strip() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert view.cancel("gate G9 timed out after 3 s", grace_s=2.0) == 1
        assert mine.wait(30) is not None
        assert other.poll() is None
        refused = view.run(["true"], timeout_s=60)
        assert not refused.ok and "gate G9 timed out after 3 s" in refused.error
        with pytest.raises(TransportError, match="timed out"):
            view.spawn(["true"])
        with pytest.raises(TransportError, match="timed out"):
            view.put(tmp_path / "child", str(tmp_path / "copy"))
        assert node.run(["true"], timeout_s=60).ok  # the connection itself is untouched
        child = int((tmp_path / "child").read_text())
        assert not _alive(child)
        assert view.name == "n1" and view.cancelled.startswith("gate G9")
    finally:
        node.abort()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


def _read(path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
