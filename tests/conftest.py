from pathlib import Path

import pytest
from lanes import lane_of  # tests/lanes.py: which lane a test runs in under `-n`

FIXTURES = Path(__file__).parent / "fixtures"


def pytest_xdist_make_scheduler(config, log):
    """Under `-n`, the lanes of tests/lanes.py."""
    # pytest-xdist's own loadgroup marks do not group on pytest 9.2 (pytest-xdist issue #1386): the lanes are
    # scopes of its load-scope scheduler instead, decided from the test's path, which the controller has.
    from xdist.scheduler import LoadScopeScheduling

    class LaneScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return lane_of(nodeid) or nodeid

    return LaneScheduling(config, log)


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES
