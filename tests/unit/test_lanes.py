"""The README test command's two lanes (`pytest -n 2`, tests/conftest.py): integration tests measure bandwidth,
skew and TTFT on this machine, so two engine modules must never run side by side, nor two qemu guests or rigs
(one lane each: tests/lanes.py); unit and e2e tests may run beside either. kv-read's guest runs first, on its own,
with only free modules beside it, and its worker goes on to the guest lane. Checked by the scheduling decision
(tests/lanes.py: next_scope) as a pure function, and by running a small suite laid out like ours through
pytest-xdist with the suite's own conftest, each test recording which worker ran it and when."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lanes import GUEST_LANE, KV_READ, lane_of, next_scope, scope_of

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


@pytest.mark.parametrize("nodeid,scope", [
    ("tests/integration/test_kv_read_loopback.py::test_x[a]", KV_READ),  # its own unit, though in the guest lane
    ("tests/integration/test_g3_rig.py::test_a", "guest"),
    ("tests/integration/test_g2_gain_cpu_reference.py::test_e", "integration"),
    ("tests/unit/test_x.py::TestY::test_d", "tests/unit/test_x.py"),
])
def test_scope_of_a_node_id(nodeid, scope):
    assert scope_of(nodeid) == scope


U1, U2, E1 = "tests/unit/test_a.py", "tests/unit/test_b.py", "tests/e2e/test_c.py"


def test_the_first_worker_to_ask_takes_kv_reads_guest_and_then_the_guest_lane():
    assert next_scope([E1, "integration", "guest", KV_READ, U1], "gw0", None, False) == KV_READ
    assert next_scope([E1, "integration", "guest", U1], "gw0", "gw0", False) == "guest"


def test_beside_kv_read_the_other_worker_takes_unit_then_e2e_modules_not_the_engine_lane():
    queue = [E1, "integration", U1, U2]  # e2e collected before unit
    assert next_scope(queue, "gw1", "gw0", False) == U1
    assert next_scope([E1, "integration", U2], "gw1", "gw0", False) == U2
    assert next_scope([E1, "integration"], "gw1", "gw0", False) == E1


def test_the_other_worker_takes_the_engine_lane_once_kv_read_is_complete_or_no_free_module_is_left():
    assert next_scope([E1, "integration", U1], "gw1", "gw0", True) == "integration"
    assert next_scope(["integration", "guest"], "gw1", "gw0", False) == "integration"  # never idle
    assert next_scope([E1, U1], "gw1", "gw0", True) == U1


def test_the_guest_lane_goes_beside_kv_read_never_to_the_other_worker():
    assert next_scope(["guest"], "gw1", "gw0", False) is None  # nothing now: asked again when kv-read completes
    assert next_scope(["guest", E1], "gw1", "gw0", False) == E1
    assert next_scope(["guest"], "gw1", "gw0", True) == "guest"  # kv-read's guest is down


def test_kv_reads_worker_with_no_guest_lane_left_takes_free_modules_then_the_engine_lane():
    assert next_scope(["integration", E1, U1], "gw0", "gw0", False) == U1
    assert next_scope(["integration"], "gw0", "gw0", True) == "integration"


def test_without_kv_read_each_worker_starts_with_a_lane_as_before():
    assert next_scope([U1, "guest", "integration"], "gw0", None, False) == "integration"
    assert next_scope([U1, "guest"], "gw1", None, False) == "guest"
    assert next_scope([E1, U1], "gw1", None, False) == U1
    assert next_scope([], "gw0", None, False) is None


def _run_lanes(pytester, monkeypatch, modules: dict[str, tuple[int, float]]) -> list[dict]:
    (pytester.path / "tests").mkdir()
    for name in ("conftest.py", "lanes.py"):
        (pytester.path / "tests" / name).write_text((TESTS / name).read_text())
    for name, (n, sleep_s) in modules.items():
        path = pytester.path / "tests" / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(BODY.format(n=n, sleep_s=sleep_s, name=name))
    log = pytester.path / "lanes.jsonl"
    monkeypatch.setenv("LANES_LOG", str(log))
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider", "tests")
    result.assert_outcomes(passed=sum(n for n, _ in modules.values()))
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_integration_tests_never_overlap_nor_guests_and_kv_reads_guest_runs_first_beside_free_modules_only(
        pytester, monkeypatch):
    rows = _run_lanes(pytester, monkeypatch, {
        "integration/test_engine_a.py": (3, 0.3),
        "integration/test_engine_b.py": (3, 0.3),
        "integration/test_kv_read_loopback.py": (2, 0.3),
        "e2e/test_loopback_main_command.py": (2, 0.3),
        "integration/test_g3_rig.py": (2, 0.3),  # a rig: guest lane, after the guests though collected first
        "e2e/test_cli.py": (4, 0.3),
        "unit/test_pure.py": (12, 0.1),  # the free modules take longer than kv-read's guest
    })
    of = lambda end: [r for r in rows if r["module"].endswith(end)]  # noqa: E731
    engines, kv_read = of("_engine_a.py") + of("_engine_b.py"), of("kv_read_loopback.py")
    guests, rig = of("main_command.py"), of("g3_rig.py")
    guest_lane = kv_read + guests + rig
    assert len(engines) == 6 and len(guest_lane) == 6
    for rs in (engines, guest_lane):
        assert not _overlaps(rs) and len({r["worker"] for r in rs}) == 1
    assert {r["worker"] for r in engines} != {r["worker"] for r in guest_lane}
    # kv-read's guest first on its worker, then the qemu guests, then the rig
    kv_worker = kv_read[0]["worker"]
    assert min(r["start"] for r in kv_read) == min(r["start"] for r in rows if r["worker"] == kv_worker)
    assert max(r["end"] for r in kv_read) <= min(r["start"] for r in guests)
    assert max(r["end"] for r in guests) <= min(r["start"] for r in rig)
    # beside it only free modules, unit first: the engine lane starts after kv-read's tests are all complete
    other = [r for r in rows if r["worker"] != kv_worker]
    assert min(r["start"] for r in other) == min(r["start"] for r in of("unit/test_pure.py"))
    assert min(r["start"] for r in engines) >= max(r["end"] for r in kv_read)
    # unit and e2e modules each whole to one worker (module fixtures set up once)
    for module in ("e2e/test_cli.py", "unit/test_pure.py"):
        assert len({r["worker"] for r in rows if r["module"] == module}) == 1
    assert {r["worker"] for r in rows} == {"gw0", "gw1"}


def test_without_kv_read_each_lane_starts_first_on_its_own_worker(pytester, monkeypatch):
    rows = _run_lanes(pytester, monkeypatch, {
        "integration/test_engine_a.py": (3, 0.2),
        "e2e/test_loopback_main_command.py": (2, 0.2),
        "integration/test_g3_rig.py": (2, 0.2),
        "unit/test_pure.py": (12, 0.05),  # more tests than either lane: still not ahead of them
    })
    lanes = {"integration": [r for r in rows if r["module"].endswith("_engine_a.py")],
             "guest": [r for r in rows if r["module"].endswith(("main_command.py", "g3_rig.py"))]}
    assert {r["worker"] for r in lanes["integration"]} != {r["worker"] for r in lanes["guest"]}
    for rs in lanes.values():
        worker = rs[0]["worker"]
        assert not _overlaps(rs) and len({r["worker"] for r in rs}) == 1
        assert min(r["start"] for r in rs) == min(r["start"] for r in rows if r["worker"] == worker)


def test_the_guest_lane_runs_kv_reads_guest_first_then_its_qemu_modules():
    from lanes import run_order
    ids = ["tests/integration/test_g3_rig.py::t", "tests/unit/test_x.py::t",
           "tests/integration/test_faults_guest.py::t", "tests/integration/test_kv_read_loopback.py::t",
           "tests/integration/test_nvmeof_guest.py::t"]
    assert sorted(ids, key=run_order) == [
        "tests/integration/test_kv_read_loopback.py::t", "tests/integration/test_nvmeof_guest.py::t",
        "tests/integration/test_faults_guest.py::t", "tests/integration/test_g3_rig.py::t",
        "tests/unit/test_x.py::t"]
