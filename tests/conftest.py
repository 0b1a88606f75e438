from pathlib import Path

import pytest
from lanes import LANES, lane_of, run_order  # tests/lanes.py: which lane a test runs in under `-n`, and when

FIXTURES = Path(__file__).parent / "fixtures"


def pytest_xdist_make_scheduler(config, log):
    """Under `-n`, the lanes of tests/lanes.py."""
    # pytest-xdist's own loadgroup marks do not group on pytest 9.2 (pytest-xdist issue #1386): the lanes are
    # scopes of its load-scope scheduler instead, decided from the test's path, which the controller has.
    from xdist.scheduler import LoadScopeScheduling

    class LaneScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            # outside the lanes a module is the unit, so its module-scoped fixtures are set up once
            return lane_of(nodeid) or nodeid.split("::", 1)[0]

        def _assign_work_unit(self, node) -> None:
            # the two lanes are the long units: each worker starts with one, free modules fill in after
            for lane in LANES[::-1]:
                if lane in self.workqueue:
                    self.workqueue.move_to_end(lane, last=False)
            super()._assign_work_unit(node)

    return LaneScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """The qemu guests before the rigs in the guest lane (tests/lanes.py: run_order); the same order on every
    xdist worker and without -n."""
    items.sort(key=lambda item: run_order(item.nodeid))


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES
