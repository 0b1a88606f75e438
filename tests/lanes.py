"""The README test command's two lanes under pytest-xdist (tests/conftest.py installs the scheduler)."""

# The README test command runs the suite in two lanes (`-n 2`, pytest-xdist with conftest.py's scheduler). The modules
# that boot a qemu TCG guest keep one core busy emulating for most of their run; they form one lane, run one after
# another by one worker. Every other integration test (real engines, rigs, shaped links, Slurm: bandwidth, skew and
# TTFT measured on this machine) forms the other lane, also one at a time, on the other worker. So no two guests,
# and no two integration tests outside the guest lane, ever run side by side; unit and e2e tests, which check
# contracts rather than speeds, fill whichever worker is free, a module at a time (its module-scoped fixtures
# are set up once). An integration module missing from GUEST_LANE only
# runs in the serial lane: slower, never side by side with its kind.
# Paths under tests/, matched on the node id's end, so they hold whatever directory pytest runs from.
GUEST_LANE = frozenset({
    "integration/test_kv_read_loopback.py",
    "integration/test_nvmeof_guest.py",
    "integration/test_faults_guest.py",
    "integration/test_loopback_guest.py",
    "e2e/test_loopback_main_command.py",
})


LANES = ("integration", "guest")


def lane_of(nodeid: str) -> str | None:
    """The lane a test runs in under `-n`: "guest", "integration", or None (any free worker)."""
    module = "/" + nodeid.split("::", 1)[0]
    if any(module.endswith("/" + m) for m in GUEST_LANE):
        return "guest"
    if "/integration/" in module:
        return "integration"
    return None
