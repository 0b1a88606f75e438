"""The README test command's two lanes (`pytest -n 2`, tests/conftest.py): integration tests measure bandwidth,
skew and TTFT on this machine, so two engine modules must never run side by side, nor two qemu guests or rigs
(one lane each: tests/lanes.py); unit and e2e tests may run beside either. Checked by running a small suite laid
out like ours through pytest-xdist with the suite's own conftest, each test recording which worker ran it and
when."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lanes import GUEST_LANE, lane_of

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parents[1]

BODY = """\
import json, os, time

import pytest

@pytest.mark.parametrize("i", range({n}))
def test_case(i):
    start = time.monotonic()
    time.sleep({sleep_s})
    with open(os.environ["LANES_LOG"], "a") as f:
        f.write(json.dumps({{"module": "{name}", "worker": os.environ.get("PYTEST_XDIST_WORKER"),
                            "start": start, "end": time.monotonic()}}) + "\\n")
"""


def _overlaps(rows: list[dict]) -> bool:
    rows = sorted(rows, key=lambda r: r["start"])
    return any(b["start"] < a["end"] for a, b in zip(rows, rows[1:]))


def test_every_guest_lane_module_exists():
    # a renamed module would silently leave the guest lane (and run, slower, in the serial one)
    assert all((TESTS / m).is_file() for m in GUEST_LANE), sorted(m for m in GUEST_LANE if not (TESTS / m).is_file())


@pytest.mark.parametrize("nodeid,lane", [
    ("tests/integration/test_kv_read_loopback.py::test_x[a]", "guest"),
    ("integration/test_faults_guest.py::test_y", "guest"),
    ("tests/e2e/test_loopback_main_command.py::test_z", "guest"),
    ("tests/integration/test_g3_rig.py::test_a", "guest"),  # a rig: no engine
    ("tests/integration/test_g2_gain_cpu_reference.py::test_e", "integration"),
    ("/abs/checkout/tests/integration/test_pd_vllm_cpu.py::Test::test_b", "integration"),
    ("tests/e2e/test_cli_run.py::test_c", None),
    ("tests/unit/test_integration_names.py::test_d", None),
])
def test_lane_of_a_node_id(nodeid, lane):
    assert lane_of(nodeid) == lane


def test_integration_tests_never_overlap_nor_guests_and_the_two_lanes_run_on_different_workers(pytester,
                                                                                                 monkeypatch):
    (pytester.path / "tests").mkdir()
    for name in ("conftest.py", "lanes.py"):
        (pytester.path / "tests" / name).write_text((TESTS / name).read_text())
    modules = {
        "integration/test_engine_a.py": (3, 0.3),
        "integration/test_engine_b.py": (3, 0.3),
        "integration/test_kv_read_loopback.py": (2, 0.3),
        "e2e/test_loopback_main_command.py": (2, 0.3),
        "integration/test_g3_rig.py": (2, 0.3),  # a rig: guest lane, after the guests though collected first
        "e2e/test_cli.py": (4, 0.1),
        "unit/test_pure.py": (12, 0.05),  # more tests than the guest lane: still not ahead of it
    }
    for name, (n, sleep_s) in modules.items():
        path = pytester.path / "tests" / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(BODY.format(n=n, sleep_s=sleep_s, name=name))
    log = pytester.path / "lanes.jsonl"
    monkeypatch.setenv("LANES_LOG", str(log))
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider", "tests")
    result.assert_outcomes(passed=28)
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    lane = {"integration": [r for r in rows if r["module"].startswith("integration/test_engine")],
            "guest": [r for r in rows if r["module"].endswith(("kv_read_loopback.py", "main_command.py", "g3_rig.py"))]}
    assert len(lane["integration"]) == 6 and len(lane["guest"]) == 6
    # the qemu guests first, the rig after them, kv-read's guest last of all (tests/lanes.py: GUEST_LANE_LAST)
    of = lambda end: [r for r in lane["guest"] if r["module"].endswith(end)]  # noqa: E731
    guests, rig, kv_read = of("main_command.py"), of("g3_rig.py"), of("kv_read_loopback.py")
    assert max(r["end"] for r in guests) <= min(r["start"] for r in rig)
    assert max(r["end"] for r in rig) <= min(r["start"] for r in kv_read)
    for rs in lane.values():
        assert not _overlaps(rs) and len({r["worker"] for r in rs}) == 1
    assert {r["worker"] for r in lane["integration"]} != {r["worker"] for r in lane["guest"]}
    # each lane starts first on its worker, whatever the size of the other modules
    for rs in lane.values():
        worker = rs[0]["worker"]
        assert min(r["start"] for r in rs) == min(r["start"] for r in rows if r["worker"] == worker)
    # unit and e2e modules go wherever a worker is free, each whole to one worker (module fixtures set up once)
    for module in ("e2e/test_cli.py", "unit/test_pure.py"):
        assert len({r["worker"] for r in rows if r["module"] == module}) == 1
    assert {r["worker"] for r in rows} == {"gw0", "gw1"}


def test_the_guest_lane_runs_its_qemu_modules_first_and_kv_reads_guest_last():
    from lanes import run_order
    ids = ["tests/integration/test_kv_read_loopback.py::t", "tests/integration/test_g3_rig.py::t",
           "tests/unit/test_x.py::t", "tests/integration/test_faults_guest.py::t",
           "tests/integration/test_nvmeof_guest.py::t"]
    assert sorted(ids, key=run_order) == [
        "tests/integration/test_nvmeof_guest.py::t", "tests/integration/test_faults_guest.py::t",
        "tests/integration/test_g3_rig.py::t", "tests/unit/test_x.py::t",
        "tests/integration/test_kv_read_loopback.py::t"]
