"""The README's table of every shipped gate cannot drift from gates/: every suite is listed once, every inventory
it names is there (a rig's rendered as `kvgate rig up` writes it), and each suite is valid against its inventory
with `kvgate validate` (the command as a user runs it, in-process: every file a gate names checked too). A row that
says "your own" is a suite to edit first, and says so in its own comments."""

import contextlib
import io
import re
from pathlib import Path

import pytest

from harness.cli.main import main
from harness.rigs.netns import RigSpec, render_inventory

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = ["Suite", "The question it answers", "Inventory", "First", "Time", "Test command"]


def table() -> list[dict[str, str]]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Every shipped gate", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    assert head == COLUMNS
    return [dict(zip(head, (c.strip() for c in line.strip("|").split(" | ")))) for line in lines[2:]]


def validate(inventory: Path, gates: Path) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(["validate", "-i", str(inventory), "-g", str(gates)])
    return rc, err.getvalue()


def test_every_shipped_suite_is_in_the_table_once_with_all_its_columns():
    rows = table()
    listed = [re.fullmatch(r"`([\w.-]+\.yaml)`", r["Suite"]).group(1) for r in rows]
    assert sorted(listed) == sorted(p.name for p in (ROOT / "gates").glob("*.yaml")) and len(set(listed)) == len(listed)
    for r in rows:
        assert all(r[c] for c in COLUMNS), r
        assert r["Test command"].split()[0].rstrip(",") in ("yes", "no"), r


@pytest.mark.parametrize("row", table(), ids=lambda r: r["Suite"].strip("`"))
def test_each_suite_validates_against_the_inventory_the_table_gives(row, tmp_path):
    gates = ROOT / "gates" / row["Suite"].strip("`")
    inv_cell = row["Inventory"]
    if inv_cell.startswith("your own"):
        assert "Edit" in gates.read_text().split("suite:", 1)[0], f"{gates.name}: a suite to edit says so"
        return
    path = re.match(r"`([^`]+)`", inv_cell).group(1)
    rig = re.fullmatch(r"/var/tmp/kvgate-rig/kvg/inventory\.yaml", path)
    if rig:  # the rig's inventory as `kvgate rig up --nodes N` writes it, N as the First column says
        n = int(re.search(r"rig up --nodes (\d+)", row["First"]).group(1))
        assert f"({n} node" in inv_cell
        spec = RigSpec(node_count=n, state_dir=tmp_path)
        inventory = tmp_path / "inventory.yaml"
        inventory.write_text(render_inventory(spec, {w: 20000 + i for i, w in enumerate(spec.node_names() + ["storage"])}))
    else:
        inventory = ROOT / path
        assert path.startswith("inventory/") and inventory.is_file(), path
    rc, err = validate(inventory, gates)
    assert rc == 0, err


@pytest.mark.parametrize("row", [r for r in table() if r["Test command"].startswith("yes")],
                         ids=lambda r: r["Suite"].strip("`"))
def test_each_row_the_test_command_runs_names_the_test_that_runs_it_and_as_shipped_means_exactly_these_files(row):
    """"yes, as shipped (`FILE`)": FILE calls readme_run with exactly this row's suite and inventory (the files run
    unchanged, from the checkout's root); "yes (`FILE`...)": FILE names the suite."""
    cell = row["Test command"]
    suite = row["Suite"].strip("`")
    m = re.fullmatch(r"yes, as shipped \(`(tests/[\w/]+\.py)`\)", cell) or re.fullmatch(r"yes \((tests/[\w/]+\.py)[,:].*\)",
                                                                                       cell)
    assert m, f"{suite}: the test command column names the test that runs it: {cell!r}"
    text = (ROOT / m.group(1)).read_text()
    if cell.startswith("yes, as shipped"):
        inventory = re.match(r"`inventory/([\w.-]+\.yaml)`", row["Inventory"])
        assert inventory, f"{suite}: an as-shipped row runs a shipped inventory: {row['Inventory']!r}"
        call = re.compile(r'readme_run\(\s*"' + re.escape(suite) + r'",\s*"' + re.escape(inventory.group(1)) + '"')
        assert call.search(text), f"{m.group(1)} runs {suite} on inventory/{inventory.group(1)} through readme_run"
    else:
        assert suite in text or suite.removesuffix(".yaml") in text, f"{m.group(1)} runs {suite}"
