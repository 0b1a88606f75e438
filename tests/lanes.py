"""The README test command's two lanes under pytest-xdist (tests/conftest.py installs the scheduler)."""

# The README test command runs the suite in two lanes (`-n 2`, pytest-xdist with conftest.py's scheduler). The modules
# that boot a qemu TCG guest keep one core busy emulating for most of their run; they form one lane, with the
# integration modules that start no engine (namespace rigs, Slurm, fio on loop devices, transports, Chromium), run
# one after another by one worker. Every integration module that starts an engine (vLLM, cpu-reference, LMCache
# readers: TTFT and hits measured on this machine) forms the other lane, also one at a time, on the other worker.
# So no two guests, no two engine modules and no two rigs ever run side by side; a rig's shaped bandwidth and
# start skew are measured beside an engine module, as they were beside a guest before, and the lanes' sums are
# about equal. Unit and e2e tests, which check contracts rather than speeds,
# fill whichever worker is free, a module at a time (its module-scoped fixtures are set up once). An integration
# module in neither list runs in the engine lane: never side by side with another integration module.
# Paths under tests/, matched on the node id's end, so they hold whatever directory pytest runs from.
# The qemu guests, in the order the guest lane runs them (after kv-read's guest: KV_READ_FIRST), longest first, then
# the rigs below. The engine
# lane starts with the load gates (g2-gain, g2-load: goodput, and a client-lag bound that makes a starved client's
# run INVALID); a rig's tens of sshd, slurmd and reader processes beside them starved the client (one full run:
# client lag p99 628 ms against the gate's 250 ms while test_g3_rig32 and test_g3_slurm ran), a qemu guest (one
# emulating core) did not.
GUEST_LANE_ORDER = (
    "integration/test_nvmeof_guest.py",
    "integration/test_faults_guest.py",
    "integration/test_loopback_guest.py",
    "e2e/test_loopback_main_command.py",
)
# no engine: beside the guests, after them
NO_ENGINE = (
    "integration/test_g3_rig.py",
    "integration/test_g3_rig32.py",
    "integration/test_g3_slurm.py",
    "integration/test_slurm_launch.py",
    "integration/test_cost_from_g1_run.py",
    "integration/test_fanout_local.py",
    "integration/test_fio_buffered_cold.py",
    "integration/test_integrity_guard_loop.py",
    "integration/test_library_chromium.py",
    "integration/test_load_client_processes.py",
    "integration/test_loopback_link_guard.py",
    "integration/test_pooldev_loop.py",
    "integration/test_pool_cold_regime.py",
    "integration/test_report_html_chromium.py",
    "integration/test_scoped_transport.py",
    "integration/test_secrets_transport.py",
    "integration/test_shipped_local.py",
    "integration/test_third_party_verification.py",
    "integration/test_transport_contract.py",
    "integration/test_write_guard_loop.py",
)
# kv-read's guest imports torch and LMCache (~5,000 modules) on one emulated core: 172 s alone on the 2-core machine,
# 247 s beside the unit tests only (both in a warm checkout); in full runs (2026-12-05, fresh clones) 503 s run first
# in the guest lane beside g2-gain's two vLLM engines, and 501 s run last, after the rigs, beside the engine lane's
# tail. So it is a work unit of its own (KV_READ), the first one its worker takes, and its worker goes on to the guest
# lane after it; the other worker runs unit modules, then e2e modules, one at a time, until kv-read's tests are all
# complete, and only then the engine lane (at once if the free modules run out first: never idle). See next_scope.
# Measured so (2026-12-05, warm checkout, the gate's import_vllm: false): 147 / 180 / 203 s alone in three runs,
# 226 s beside the unit tests only (`-n 2 tests/unit tests/integration/test_kv_read_loopback.py`, one run, between
# the first two alone); in clean-clone CI runs 380 s (import 332 s) and, with fio's drop gone, 340 s (import 305 s):
# still 2-2.7x the import alone, what ran beside it then not recorded (issue 39). Two more clean-clone runs
# (2026-12-05): 322 s; then 470 s (import 399 s), the first with tests/conftest.py's timeline: the other worker was
# busy 467.9 of its 470.1 s, with unit then e2e modules (the longest: e2e/test_gpu_check_script 85 s, which builds
# and installs wheels; test_bad_inputs, test_library, test_cli_run, test_g3_collect_cli, test_bundle_mutations,
# test_wheel_install 27-35 s each). The guest's import under TCG is CPU work: it takes what the neighbour leaves.
# Since the gate defers transformers (defer_imports; 2026-12-05): 97 / 99 s alone (import 43 / 40 s), and in a
# clean-clone CI run 116.5 s (import 63.7 s): no longer the suite's slowest test, still its worker's first unit.
KV_READ_FIRST = ("integration/test_kv_read_loopback.py",)
KV_READ = "kv-read"
GUEST_LANE = frozenset(GUEST_LANE_ORDER + NO_ENGINE + KV_READ_FIRST)


def _in(nodeid: str, modules) -> bool:
    module = "/" + nodeid.split("::", 1)[0]
    return any(module.endswith("/" + m) for m in modules)


def run_order(nodeid: str) -> int:
    """Sort key (stable): kv-read's guest first (KV_READ_FIRST), then the guest lane's qemu modules in
    GUEST_LANE_ORDER; everything else after, as collected."""
    if _in(nodeid, KV_READ_FIRST):
        return -1
    module = "/" + nodeid.split("::", 1)[0]
    for i, m in enumerate(GUEST_LANE_ORDER):
        if module.endswith("/" + m):
            return i
    return len(GUEST_LANE_ORDER)


LANES = ("integration", "guest")


def lane_of(nodeid: str) -> str | None:
    """The lane a test runs in under `-n`: "guest", "integration", or None (any free worker)."""
    module = "/" + nodeid.split("::", 1)[0]
    if any(module.endswith("/" + m) for m in GUEST_LANE):
        return "guest"
    if "/integration/" in module:
        return "integration"
    return None


def scope_of(nodeid: str) -> str:
    """The work unit a test belongs to under `-n`: kv-read's guest alone (KV_READ), a lane, or else its module (so
    its module-scoped fixtures are set up once)."""
    if _in(nodeid, KV_READ_FIRST):
        return KV_READ
    return lane_of(nodeid) or nodeid.split("::", 1)[0]


def _free_first(queue) -> list[str]:
    """The queue's free modules (no lane), unit modules before the others (e2e), each kind in queue order."""
    return sorted((s for s in queue if s not in LANES and s != KV_READ), key=lambda s: "/unit/" not in "/" + s)


def next_scope(queue, node, kv_read_node, kv_read_done: bool) -> str | None:
    """The work unit (a scope of ``queue``, in its order) the worker ``node`` takes next, or None: nothing now.

    ``kv_read_node``: the worker that holds kv-read's unit (None: no worker does); ``kv_read_done``: its tests are
    all complete. The first worker to ask takes kv-read's guest; that worker then takes the guest lane (it runs
    after kv-read, on the same worker), then free modules, then the engine lane. The other worker takes free
    modules, unit ones first, until kv-read is complete (the engine lane only if none is left: never idle), then
    the engine lane first; it takes the guest lane only after kv-read is complete (never two guests). Without
    kv-read the lanes go first, one to each worker, as before."""
    queue = list(queue)
    if KV_READ in queue:
        return KV_READ
    free = _free_first(queue)
    if kv_read_node is None:
        order = [lane for lane in LANES if lane in queue] + free
    elif node == kv_read_node:
        order = ["guest"] + free + ["integration"]
    elif not kv_read_done:
        order = free + ["integration"]
    else:
        order = ["integration"] + free + ["guest"]
    return next((s for s in order if s in queue), None)
