"""`kvgate loopback up` on this machine (a local node): a target path holding a file kvgate did not make is refused
before anything is done, in one line naming the inventory's FILE:LINE of ``path``, exit 2; the file is untouched
and only the read-only probes ran (this kernel has no nvmet: nothing further could run anyway)."""

import pytest

from harness.cli.exits import EXIT_INPUT
from harness.cli.main import main

pytestmark = pytest.mark.integration


def test_the_cli_refuses_in_one_line_naming_the_inventory_line_of_path(tmp_path, capsys):
    theirs = tmp_path / "kv0-link"
    theirs.write_text("their data\n")
    inv = tmp_path / "inv.yaml"
    inv.write_text("nodes:\n  - name: n1\n    transport: local\n    targets:\n"
                   "      - name: kv0\n        kind: nvmeof-loopback\n        nqn: nqn.2024-01.io.kvgate:it-kv0\n"
                   "        backing: null_blk\n"
                   f"        path: {theirs}\n")
    steps = tmp_path / "steps"
    assert main(["loopback", "up", "-i", str(inv), "--steps-dir", str(steps)]) == EXIT_INPUT
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("steps: ")]
    assert err == [f"kvgate loopback up: {inv}:9: nodes[0].targets[0].path: {theirs} holds a regular file that "
                   "kvgate did not make; kvgate replaces only its own link (remove it, or name another path)"]
    assert theirs.read_text() == "their data\n" and not theirs.is_symlink()
    ran = sorted(p.name.split("-", 2)[2] for p in (steps / "steps").iterdir())
    assert all(n.startswith("probe-") for n in ran), ran  # only the read-only probes ran
