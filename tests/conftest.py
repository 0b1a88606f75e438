import json
import os
from pathlib import Path

import pytest
from lanes import KV_READ, next_scope, run_order, scope_of  # tests/lanes.py: the lanes under `-n`, and when

FIXTURES = Path(__file__).parent / "fixtures"


def pytest_xdist_make_scheduler(config, log):
    """Under `-n`, the lanes of tests/lanes.py."""
    # pytest-xdist's own loadgroup marks do not group on pytest 9.2 (pytest-xdist issue #1386): the lanes are
    # scopes of its load-scope scheduler instead, decided from the test's path, which the controller has.
    from xdist.scheduler import LoadScopeScheduling

    class LaneScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

        def _kv_read(self):
            """The worker holding kv-read's unit (None: none does) and whether its tests are all complete."""
            for node, work in self.assigned_work.items():
                if KV_READ in work:
                    return node, all(work[KV_READ].values())
            return None, False

        def _assign_work_unit(self, node) -> None:
            # which unit, and whether one now, is tests/lanes.py's next_scope; xdist sends the queue's first
            scope = next_scope(self.workqueue, node, *self._kv_read())
            if scope is None:
                return
            self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

        def mark_test_complete(self, node, item_index: int, duration: float = 0) -> None:
            was_done = self._kv_read()[1]
            super().mark_test_complete(node, item_index, duration)
            if self._kv_read()[1] and not was_done:  # what the other worker waited for (next_scope) is done
                for other in self.nodes:
                    if other is not node:
                        self._reschedule(other)

    return LaneScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """kv-read's guest first, the qemu guests before the rigs in the guest lane (tests/lanes.py: run_order); the
    same order on every xdist worker and without -n."""
    items.sort(key=lambda item: run_order(item.nodeid))


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES


def pytest_runtest_logreport(report):
    """Every test phase's wall-clock start and stop, one JSON line per phase into ``timeline-<worker>.jsonl`` beside
    the run's base temporary directory (under -n, pytest-N/; without, pytest-N itself): which tests ran beside which
    on a shared machine (a test whose figures or time moved is read against its neighbours)."""
    if hasattr(report, "node"):  # under -n, the controller's copy of a worker's report: the worker wrote it
        return
    start, stop = getattr(report, "start", None), getattr(report, "stop", None)
    if start is None or stop is None or _BASETEMP[0] is None:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    line = json.dumps({"worker": worker, "nodeid": report.nodeid, "when": report.when, "start": start, "stop": stop,
                       "outcome": report.outcome})
    with open(_BASETEMP[0] / f"timeline-{worker}.jsonl", "a") as f:
        f.write(line + "\n")


_BASETEMP: list[Path | None] = [None]


def pytest_sessionstart(session):
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None:
        return
    base = factory.getbasetemp()
    _BASETEMP[0] = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
