"""The layer contract (pyproject.toml [tool.importlinter]): imports in harness/ run one way and no folder has
an import cycle. Checked with import-linter's own command, on the package and on copies with one bad import,
so the test fails when the contract would not."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(root: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(root))
    return subprocess.run([str(LINT), "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_harness_keeps_its_layers_and_has_no_cycles():
    r = lint(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 kept, 0 broken" in r.stdout


@pytest.mark.parametrize("module, line, broken", [
    # a parser that reaches up into the workloads: the old workloads/base.py -> verdict kind of import
    ("parsers/fio.py", "from ..workloads import base", "harness.parsers is not allowed to import harness.workloads"),
    # the executor importing G3 maths from a workload: fanout.py -> g3 was one
    ("execute/fanout.py", "from ..workloads import g3_shared_read", "harness.execute is not allowed to import"),
    # configuration importing the workload registry (the cycle config.py -> workloads had)
    ("config/loading.py", "from ..workloads import WORKLOADS", "harness.config is not allowed to import"),
    # two modules of one folder importing each other
    ("workloads/kit/base.py", "from . import engine", "No cycles are allowed in harness.workloads"),
    # a workload reusing another workload's parts (g2-gain once made its own G2Load and G2Ttft): the parts go to the
    # kit; every pair of workload modules is checked, not only this one
    ("workloads/g2_gain/__init__.py", "from .. import g2_load", "harness.workloads.g2_gain is not allowed to import "
                                                        "harness.workloads.g2_load"),
    ("workloads/pd_handoff.py", "from .g2_ttft import G2Ttft", "harness.workloads.pd_handoff is not allowed to import "
                                                              "harness.workloads.g2_ttft"),
    # the kit reaching up into a workload
    ("workloads/kit/load/points.py", "from ... import g2_load", "harness.workloads.kit is not allowed to import "
                                                         "harness.workloads.g2_load"),
])
def test_a_wrong_way_import_or_a_cycle_breaks_the_contract(tmp_path, module, line, broken):
    shutil.copytree(ROOT / "harness", tmp_path / "harness", ignore=shutil.ignore_patterns("__pycache__", "_data"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with (tmp_path / "harness" / module).open("a") as f:
        f.write(f"\n{line}  # noqa\n")
    r = lint(tmp_path)
    assert r.returncode != 0 and broken in r.stdout, r.stdout
