"""pd-handoff: the prefill/decode hand-off's run on scripted nodes and engines (the plan is what it sends, a
hand-off that loads from the tier PASSes its proofs), and its evaluator on captured counters for each proof that
can fail: a consumer that re-computed, one process serving both roles, a device that read nothing, a producer
whose store never reached the pool's device, prompts that were not new."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import yaml

from harness.config import load_config
from harness.errors import ConfigError
from harness.suite.plan import gate_plan, plan_mismatch
from harness.transport.doubles import Call, Reply, ScriptedTransport
from harness.workloads import WORKLOADS
from harness.workloads.pd_handoff import PdInstance, PdPrompt, evaluate_pd
from doubles import (EngineServer, Router, argv_has, argv_is, argv_starts, gate_context, ok, pool_loop, preflight,
                     spawned)

ROOT = Path(__file__).resolve().parents[2]
PREFLIGHT_VLLM = (ROOT / "tests" / "fixtures" / "preflight" / "vllm-cpu-build.stdout").read_text()
BPT = 4 * 2 * 2 * 64 * 2  # the gate's model: 4 layers, K and V, 2 KV heads of 64, bfloat16


def pd_config(tmp_path, nodes=("n1",), attach=None, storage=None, **params):
    """The shipped gate on ``nodes`` (local, each with the kvpool directory target); ``attach``: the attach block
    given instead of the launch settings (True: two URLs on p1 and d1); ``storage``: one more node, the pool's
    storage side, whose kvpool target is the pool as stored there (/srv/pool)."""
    suite = yaml.safe_load((ROOT / "gates" / "pd-vllm-cpu.yaml").read_text())
    gp = suite["gates"][0]["params"]
    if attach is None:
        gp.update(python="/engine/bin/python")
        if len(nodes) > 1 or storage:  # the shipped loop pool is one node's: two mount one pool (as shared)
            del gp["pool_device"]
    else:
        for key in ("random_weights", "pool_target", "pool_device"):
            del gp[key]
        gp.update(producer_engine="vllm-attach", consumer_engine="vllm-attach",
                  attach=ATTACH if attach is True else attach)
    gp.update(populate_timeout_s=5, **params)
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(suite))
    (tmp_path / "i.yaml").write_text(yaml.safe_dump({"nodes": [
        {"name": n, "transport": "local", "work_dir": "/w",
         "targets": [{"name": "kvpool", "kind": "directory", "path": "/mnt/pool"}]} for n in nodes]
        + ([{"name": storage, "transport": "local", "work_dir": "/w",
             "targets": [{"name": "kvpool", "kind": "directory", "path": "/srv/pool"}]}] if storage else [])}))
    return load_config(tmp_path / "i.yaml", tmp_path / "g.yaml", WORKLOADS)


class Tier:
    """The shared pool as both engines and the node see it: a prompt the producer serves is stored (its KV's bytes
    appear in the pool and are written to the device); the consumer hits a stored prompt and reads it from the
    device (``consumer_hits=False``: a consumer without the connector, computing everything)."""

    def __init__(self, consumer_hits: bool = True, block: int = 128, device_on=None):
        self.block = block
        self.device_on = device_on  # the nodes where the pool has a block device (None: every node)
        self.engines: dict[int, EngineServer] = {}
        self.roles: dict[int, str] = {}
        self.files: list[int] = []
        self.read_sectors = self.write_sectors = 0
        self.consumer_hits = consumer_hits
        self.stored: set[str] = set()

    def spawn(self, call: Call) -> Reply:
        port = int(call.argv[call.argv.index("--port") + 1])
        role = json.loads(call.argv[call.argv.index("--kv-transfer-config") + 1])["kv_role"]
        self.engines[port], self.roles[port] = EngineServer(), role
        return Reply(stdout="INFO ready\n")

    def http(self, request: httpx.Request) -> httpx.Response:
        port = request.url.port
        eng, role = self.engines[port], self.roles[port]
        if request.url.path.startswith("/v1/"):
            prompt = json.dumps(json.loads(request.content)["prompt"])
            n = len(json.loads(prompt))
            if role == "kv_producer":
                if prompt not in self.stored:
                    self.stored.add(prompt)
                    self.files.append(n // self.block * self.block * BPT + 100)
                    self.write_sectors += (n // self.block * self.block * BPT) // 512 + 8
            elif self.consumer_hits and prompt in self.stored:
                eng.stored.add(prompt)  # the engine server counts it as a hit
                self.read_sectors += (n // self.block * self.block * BPT) // 512
        return eng(request)

    def node(self, name: str = "n1") -> ScriptedTransport:
        def stat(call: Call) -> Reply:
            if self.device_on is not None and name not in self.device_on:  # a network mount: no block device
                return Reply(rc=1, stdout="kvgate-pool-device 0:53 root@10.77.0.100:/srv/pool\n",
                             stderr="cat: /sys/dev/block/0:53/stat: No such file or directory\n")
            return Reply(stdout=f"kvgate-pool-device 7:3 /dev/loop3\n1 0 {self.read_sectors} 0 1 0 "
                                f"{self.write_sectors} 0 0 0 0\n")
        return ScriptedTransport(Router(
            preflight(PREFLIGHT_VLLM), (argv_has("kvgate-pool-blockstat"), stat),
            (argv_starts("find"), lambda c: Reply(stdout="".join(f"{n}\n" for n in self.files))),
            (spawned, self.spawn), (argv_has("make_model.py"), Reply(stdout='{"model_type": "llama"}\n')),
            pool_loop("/dev/loop3", "7:3"),
            *ok(argv_starts("mkdir"), argv_is("sh", "-c", "sync && echo 3 > /proc/sys/vm/drop_caches"),
                argv_is("sync"))), name=name)


def run_pd(tmp_path, tier: Tier, nodes=("n1",), storage=None, storage_node=None, **params):
    cfg = pd_config(tmp_path, nodes, storage=storage, **params)
    transports = {n: tier.node(n) for n in nodes}
    if storage:
        transports[storage] = storage_node or tier.node(storage)
    ctx = gate_context(tmp_path / "run", cfg, transports=transports, http=tier.http)
    return cfg, transports, WORKLOADS["pd-handoff"]().run(ctx)


def test_a_hand_off_from_the_tier_proves_every_check_and_sends_exactly_the_plan(tmp_path):
    cfg, nodes, res = run_pd(tmp_path, Tier())
    assert res.error is None and res.invalid_reason is None, (res.error, res.invalid_reason)
    ev = res.evidence
    assert all(c.ok for c in ev.validity), [c for c in ev.validity if not c.ok]
    assert {c.name for c in ev.validity} >= {"two instances", "hand-off hits", "consumer read the tier",
                                             "producer wrote the tier", "no fall-back"}
    assert res.metrics["hit_rate"] == 1.0 and res.metrics["consumer_device_read_bytes"] > 0
    assert res.metrics["producer_device_write_bytes"] >= 3 * 4096 * BPT
    assert res.metrics["kv_bytes_per_request"] == 4096 * BPT + 100
    for key in ("ttft_prefill_p50_s", "ttft_handoff_p50_s", "ttft_recompute_p50_s", "store_to_first_token_p50_s",
                "handoff_gb_s_p50", "handoff_speedup_p50"):
        assert key in res.metrics, key
    assert len(ev.prompts) == 3 and all(x.handoff_hit_tokens == 4098 for x in ev.prompts)
    assert ev.instances["producer"].pid != ev.instances["consumer"].pid
    assert ev.instances["producer"].base_url != ev.instances["consumer"].base_url
    assert ev.page_cache_dropped is True and ev.pool_device == {"producer": "/dev/loop3 (7:3)",
                                                                "consumer": "/dev/loop3 (7:3)"}
    # the shipped gate's pool: a loop device of its own, made once on the shared pool directory after it exists,
    # its inverse registered with the run's undo log before the make was sent
    assert ev.pool["kind"] == "loop" and ev.pool["loop"] == {"device": "/dev/loop3", "maj_min": "7:3", "direct_io": True}
    sent = [tuple(c) for c in nodes["n1"].commands]
    makes = [i for i, a in enumerate(sent) if "kvgate-pool-loop" in a]
    mkdirs = [i for i, a in enumerate(sent) if a[:2] == ("mkdir", "-p")]
    assert len(makes) == 1 and mkdirs[0] < makes[0] and sent[makes[0]][-3] == sent[mkdirs[0]][3]
    gate = cfg.suite.gates[0]
    planned = gate_plan(cfg, gate)
    assert plan_mismatch([s for s in planned if s.node == "n1"], nodes["n1"].commands) is None
    # the plan names both instances, their roles and the route
    text = "\n".join(s.description for s in planned)
    assert "producer (kv_producer): start" in text and "consumer (kv_consumer): start" in text
    assert "route: prompt -> producer on n1" in text and "-> consumer on n1" in text
    # every request kept, per phase
    gate_dir = tmp_path / "run" / "gates" / "PD"
    for phase in ("prefill", "handoff", "recompute"):
        assert len((gate_dir / f"requests-{phase}.jsonl").read_text().splitlines()) == 3


def test_a_consumer_that_recomputed_is_invalid_never_pass(tmp_path):
    _, _, res = run_pd(tmp_path, Tier(consumer_hits=False))
    assert res.error is None
    assert res.invalid_reason is not None and res.invalid_reason.startswith("hand-off hits"), res.invalid_reason
    bad = {c.name for c in res.evidence.validity if not c.ok}
    assert bad == {"hand-off hits", "consumer read the tier"}


def test_without_dropping_the_page_cache_the_store_is_still_synced_before_its_writes_are_counted(tmp_path):
    cfg, nodes, res = run_pd(tmp_path, Tier(), drop_caches=False)
    assert res.error is None and res.evidence.page_cache_dropped is False
    sent = nodes["n1"].commands
    assert ("sync",) in sent and not any("drop_caches" in " ".join(c) for c in sent)
    assert plan_mismatch([s for s in gate_plan(cfg, cfg.suite.gates[0]) if s.node == "n1"], sent) is None


def test_on_two_nodes_each_side_is_probed_on_its_own_node(tmp_path):
    tier = Tier()
    cfg, nodes, res = run_pd(tmp_path, tier, nodes=("p1", "d1"))
    assert res.invalid_reason is None and res.error is None, (res.invalid_reason, res.error)
    planned = gate_plan(cfg, cfg.suite.gates[0])
    for n in ("p1", "d1"):
        assert plan_mismatch([s for s in planned if s.node == n], nodes[n].commands) is None, n
    # each side's pool device is read on its own node: the producer's around prefills, the consumer's around hand-offs
    for n in ("p1", "d1"):
        assert sum("kvgate-pool-blockstat" in c for c in nodes[n].commands) == 2 * 3, n
    assert sum(c[0] == "find" for c in nodes["d1"].commands) == 0  # the store is watched from the producer's node
    assert res.evidence.instances["producer"].node == "p1" and res.evidence.instances["consumer"].node == "d1"


def test_over_a_network_mount_the_pool_device_is_counted_on_its_storage_side_for_both_phases(tmp_path):
    # p1 and d1 mount the pool over sshfs (no block device there); "st" holds it on a block device
    tier = Tier(device_on={"st"})
    cfg, nodes, res = run_pd(tmp_path, tier, nodes=("p1", "d1"), storage="st", pool_storage="st:kvpool")
    assert res.invalid_reason is None and res.error is None, (res.invalid_reason, res.error)
    ev = res.evidence
    assert ev.pool_device_side == "storage" and ev.pool_device_node == {"producer": "st", "consumer": "st"}
    assert ev.pool_device == {"producer": "/dev/loop3 (7:3)", "consumer": "/dev/loop3 (7:3)"}
    # the storage side's path of the run's pool: the same <pool_subdir>/run-<tag> under its own target
    run = ev.pool_dir.rsplit("/", 1)[1]
    assert ev.pool_dir == f"/mnt/pool/kvgate-pd/{run}" and ev.pool_device_dir["consumer"] == f"/srv/pool/kvgate-pd/{run}"
    # one device, attributed by phase: the prefills' writes, the hand-offs' reads
    assert res.metrics["producer_device_write_bytes"] >= 3 * 4096 * BPT
    assert res.metrics["consumer_device_read_bytes"] == 3 * 4096 * BPT
    wrote = next(c for c in ev.validity if c.name == "producer wrote the tier").how
    assert "/dev/loop3 (7:3) on st, the pool's storage side" in wrote
    planned = gate_plan(cfg, cfg.suite.gates[0])
    for n in ("p1", "d1", "st"):
        assert plan_mismatch([s for s in planned if s.node == n], nodes[n].commands) is None, n
    st = nodes["st"].commands
    assert sum("kvgate-pool-blockstat" in " ".join(c) for c in st) == 4 * 3  # before/after each prefill and hand-off
    assert all(c[-1] == ev.pool_device_dir["producer"] for c in st if "kvgate-pool-blockstat" in c)
    assert sum("drop_caches" in " ".join(c) for c in st) == 3  # its page cache too: reads reach its device
    assert not any("kvgate-pool-blockstat" in c for n in ("p1", "d1") for c in nodes[n].commands)
    # the store is watched there too: a network mount's listing on p1 can lag the files d1 wrote
    assert any(c[:2] == ("find", ev.pool_device_dir["producer"]) for c in st)
    assert not any(c[0] == "find" for n in ("p1", "d1") for c in nodes[n].commands)
    assert "on the pool's storage side" in "\n".join(s.description for s in planned if s.node == "st")


def test_over_a_network_mount_without_the_storage_side_the_device_proofs_fail_invalid(tmp_path):
    _, _, res = run_pd(tmp_path, Tier(device_on=set()), nodes=("p1", "d1"))
    assert res.error is None and res.invalid_reason.startswith("consumer read the tier"), res.invalid_reason
    assert "no device counted: producer: on p1" in res.invalid_reason  # the first probe that failed, named


@pytest.mark.parametrize("storage_node, why", [
    # the storage node's sshd does not answer
    (ScriptedTransport(Router((lambda c: True, Reply(rc=255, stderr="ssh: connect to host 127.0.0.1 port 2200: "
                                                                     "Connection refused\n"))), name="st"),
     "Connection refused"),
    # it answers, but the pool's directory there is on no block device (tmpfs, a typo'd target path)
    (None, "No such file or directory"),
])
def test_a_storage_side_unreachable_or_without_a_device_is_invalid_never_pass(tmp_path, storage_node, why):
    tier = Tier(device_on=set())
    _, _, res = run_pd(tmp_path, tier, nodes=("p1", "d1"), storage="st", pool_storage="st:kvpool",
                       storage_node=storage_node)
    assert res.error is None, res.error
    assert res.invalid_reason is not None and res.invalid_reason.startswith("consumer read the tier"), res.invalid_reason
    failed = {c.name for c in res.evidence.validity if not c.ok}
    assert {"consumer read the tier", "producer wrote the tier"} <= failed
    assert res.evidence.pool_device == {} and why in res.evidence.pool_device_error
    assert "on st" in res.evidence.pool_device_error
    assert "no device counted" in res.invalid_reason and why in res.invalid_reason
    assert "consumer_device_read_bytes" not in res.metrics and "producer_device_write_bytes" not in res.metrics


def test_pool_storage_names_a_gate_node_with_a_directory_target_and_is_refused_beside_attach(tmp_path):
    with pytest.raises(ConfigError) as exc:
        pd_config(tmp_path, ("p1", "d1"), pool_storage="st:kvpool")
    assert "pool_storage: node 'st' is not one of the gate's nodes" in str(exc.value)
    with pytest.raises(ConfigError) as exc:
        pd_config(tmp_path, ("p1", "d1"), storage="st", pool_storage="st:nope")
    assert "pool_storage: node 'st' has no directory target 'nope'" in str(exc.value)
    with pytest.raises(ConfigError) as exc:
        pd_config(tmp_path, ("p1", "d1"), pool_storage="st")
    assert "expected NODE:TARGET" in str(exc.value)
    with pytest.raises(ConfigError) as exc:
        pd_config(tmp_path, ("p1", "d1"), attach=True, storage="st", pool_storage="st:kvpool")
    assert "pool_storage: a launch parameter: kvgate does not launch attached instances" in str(exc.value)
    # two engine nodes besides the storage node, not three
    with pytest.raises(ConfigError) as exc:
        pd_config(tmp_path, ("p1", "d1", "x1"), storage="st", pool_storage="st:kvpool")
    assert "pd-handoff runs on one node or two, got 3 besides the pool_storage node 'st'" in str(exc.value)


def test_a_loop_pool_is_one_nodes_and_refused_across_two_nodes_or_a_storage_side(tmp_path):
    with pytest.raises(ConfigError) as exc:
        pd_config(tmp_path, ("p1", "d1"), pool_device={"kind": "loop"})
    assert "pool_device.kind: a loop pool is made on the one node that runs both roles" in str(exc.value)
    with pytest.raises(ConfigError) as exc:
        pd_config(tmp_path, ("p1", "d1"), storage="st", pool_storage="st:kvpool", pool_device={"kind": "loop"})
    assert "pool_device.kind: a loop pool" in str(exc.value)
    with pytest.raises(ConfigError) as exc:
        pd_config(tmp_path, ("p1", "d1"), attach=True, pool_device={"kind": "loop"})
    assert "pool_device: a launch parameter: kvgate does not launch attached instances" in str(exc.value)


def test_validation_names_the_missing_pool_and_a_profile_without_counters(tmp_path):
    bad = tmp_path / "nohits.yaml"
    prof = yaml.safe_load((ROOT / "workloads" / "engines" / "vllm-cpu-consumer.yaml").read_text())
    del prof["hit_metrics"]
    bad.write_text(yaml.safe_dump(prof))
    with pytest.raises(ConfigError) as exc:
        pd_config(tmp_path, consumer_engine=str(bad), pool_target="nope")
    msg = str(exc.value)
    assert "consumer_engine: pd-handoff proves hits from counters" in msg
    assert "pool_target: node 'n1' has no directory target 'nope'" in msg


# --------------------------------------------------------------------------- the evaluator, on captured counters

# one hand-off prompt as the real gate recorded it (vLLM 0.32 CPU build, 4098-token prompt)
GOOD = dict(request_id="s13-n4098-i0", prompt_tokens=4098, prefill_ttft_s=1.02, handoff_ttft_s=0.31,
            recompute_ttft_s=1.01, expected_kv_bytes=4096 * BPT, pool_bytes_added=4096 * BPT + 4 * 88,
            store_wait_s=0.01, cold_s=0.2, store_to_first_token_s=0.52, producer_hit_tokens=0.0,
            handoff_hit_tokens=4096.0, handoff_query_tokens=4098.0, recompute_hit_tokens=0.0,
            producer_write_bytes=4096 * BPT + 65536, consumer_read_bytes=4096 * BPT)
TWO = {"producer": PdInstance(role="producer", node="n1", profile="p", base_url="http://127.0.0.1:1", run_dir="/a",
                              pid=100),
       "consumer": PdInstance(role="consumer", node="n1", profile="c", base_url="http://127.0.0.1:2", run_dir="/b",
                              pid=200)}


def _eval(instances=TWO, fallback=None, **change):
    return evaluate_pd([PdPrompt(**{**GOOD, **change})], instances, BPT, 0.95, 0.5, 0.5, fallback=fallback)


def test_the_evaluator_passes_a_proven_hand_off_with_its_figures():
    res = _eval()
    assert res.invalid_reason is None and res.error is None
    m = res.metrics
    assert m["handoff_speedup_p50"] == pytest.approx(1.01 / 0.31)
    assert m["hit_rate"] == pytest.approx(4096 / 4098) and m["read_fraction"] == pytest.approx(1.0)
    assert m["handoff_gb_s_p50"] == pytest.approx((4096 * BPT + 352) / 0.31 / 1e9)
    assert m["store_to_first_token_p50_s"] == 0.52


@pytest.mark.parametrize("change, check", [
    (dict(handoff_hit_tokens=0.0), "hand-off hits"),                   # flat hit counters: it re-computed
    (dict(handoff_hit_tokens=None, handoff_query_tokens=None), "hand-off hits"),  # no counters: unproven
    (dict(consumer_read_bytes=0), "consumer read the tier"),           # served from memory or a cache
    (dict(consumer_read_bytes=4096 * BPT // 10), "consumer read the tier"),
    (dict(producer_write_bytes=0), "producer wrote the tier"),
    (dict(pool_bytes_added=1000), "stored"),                           # the store never completed
    (dict(producer_hit_tokens=4096.0), "new prompts"),
    (dict(recompute_hit_tokens=4096.0), "recompute computed"),
])
def test_each_failed_proof_makes_the_hand_off_invalid(change, check):
    res = _eval(**change)
    assert res.invalid_reason is not None and res.invalid_reason.startswith(check), res.invalid_reason
    assert [c.name for c in res.evidence.validity if not c.ok][0] == check


def test_one_process_serving_both_roles_is_invalid():
    same = {r: i.model_copy(update={"pid": 100}) for r, i in TWO.items()}
    res = _eval(instances=same)
    assert res.invalid_reason.startswith("two instances") and "process 100" in res.invalid_reason
    one_url = {r: i.model_copy(update={"base_url": "http://x"}) for r, i in TWO.items()}
    assert _eval(instances=one_url).invalid_reason.startswith("two instances")


def test_a_fall_back_line_outranks_every_figure():
    res = _eval(fallback="the consumer engine's log: degraded mode")
    assert res.invalid_reason == "the consumer engine's log: degraded mode"
    assert not next(c for c in res.evidence.validity if c.name == "no fall-back").ok


def test_a_failed_request_is_an_error_with_its_text():
    res = _eval(errors=["handoff: HTTP 500"])
    assert res.error == "1 request(s) failed; first: s13-n4098-i0: handoff: HTTP 500"


def test_the_gpu_profiles_pair_validates_and_plans_with_their_roles(tmp_path):
    # not run here (no GPU): vLLM + LMCache as producer and consumer on a shared fs:// pool
    cfg = pd_config(tmp_path, producer_engine="vllm-lmcache-producer", consumer_engine="vllm-lmcache-consumer")
    text = "\n".join(s.description for s in gate_plan(cfg, cfg.suite.gates[0]))
    assert "producer (kv_producer): start a fresh vllm-lmcache-producer" in text
    assert "consumer (kv_consumer): start a fresh vllm-lmcache-consumer" in text


# ------------------------------------------------------------------------------- attach: two URLs, no launch

ATTACH = {"producer": {"url": "http://10.0.0.1:8100", "log": {"node": "p1", "run": "journalctl -u vllm-prefill"}},
          "consumer": {"url": "http://10.0.0.2:8200", "log": {"node": "d1", "run": "journalctl -u vllm-decode"}},
          "pool_path": "/mnt/pool/kv"}


def attached(tmp_path, same_start=False, **params):
    """A deployment's prefill and decode instances on p1 and d1 (engines answering at two URLs, their logs by the
    operator's command), the pool mounted on both."""
    tier = Tier(block=1)
    for port, role, start in ((8100, "kv_producer", 1000.0), (8200, "kv_consumer", 1000.0 if same_start else 2000.0)):
        tier.engines[port], tier.roles[port] = EngineServer(), role
        tier.engines[port].start = start
    cfg = pd_config(tmp_path, ("p1", "d1"), attach=True, **params)
    nodes = {n: tier.node(n) for n in ("p1", "d1")}
    for node in nodes.values():
        node.handler.on(lambda c: c.argv[:2] == ("sh", "-c") and c.argv[2].startswith("journalctl"),
                        Reply(stdout="INFO serving\n"))
    return cfg, tier, nodes


def test_attached_instances_hand_off_through_the_tier_and_the_run_sends_exactly_the_plan(tmp_path):
    cfg, tier, nodes = attached(tmp_path)
    ctx = gate_context(tmp_path / "run", cfg, transports=nodes, http=tier.http)
    res = WORKLOADS["pd-handoff"]().run(ctx)
    assert res.error is None and res.invalid_reason is None, (res.error, res.invalid_reason)
    ev = res.evidence
    assert ev.attached and ev.prompt_seed != 13  # new to engines that outlive the run
    assert ev.instances["producer"].pid is None and ev.instances["consumer"].start_time_s == 2000.0
    assert "started at 1000.0" in next(c for c in ev.validity if c.name == "two instances").how
    planned = gate_plan(cfg, cfg.suite.gates[0])
    for n in ("p1", "d1"):
        assert plan_mismatch([s for s in planned if s.node == n], nodes[n].commands) is None, n
    assert not any(e.kind == "spawn" for n in nodes.values() for e in n.events)  # kvgate started nothing
    text = "\n".join(s.description for s in planned)
    assert "route: prompt -> producer on p1 (http://10.0.0.1:8100" in text


def test_attached_urls_that_report_one_process_are_invalid(tmp_path):
    cfg, tier, nodes = attached(tmp_path, same_start=True)
    res = WORKLOADS["pd-handoff"]().run(gate_context(tmp_path / "run", cfg, transports=nodes, http=tier.http))
    assert res.invalid_reason.startswith("two instances") and "one process start time" in res.invalid_reason


def test_attach_refuses_launch_parameters_and_unknown_log_nodes(tmp_path):
    bad = {**ATTACH, "consumer": {**ATTACH["consumer"], "log": {"node": "nope", "run": "true"}}}
    with pytest.raises(ConfigError) as exc:
        pd_config(tmp_path, ("p1", "d1"), attach=bad, python="/x/python")
    msg = str(exc.value)
    assert "attach.consumer.log.node: node 'nope' is not one of the gate's nodes" in msg
    assert "python: a launch parameter: kvgate does not launch attached instances" in msg


def _pd_rederived(tmp_path, tier, edit=None, **params):
    """The hand-off run, then `kvgate report`'s pd-handoff re-deriver on its bundle after ``edit(gate_dir, signed)``."""
    cfg, _, res = run_pd(tmp_path, tier, **params)
    signed = json.loads(json.dumps(res.as_dict(), default=str))
    gate_dir = tmp_path / "run" / "gates" / "PD"
    if edit:
        edit(gate_dir, signed)
    return res, WORKLOADS["pd-handoff"].rederive(gate_dir, signed, cfg.params["PD"], {"bundle_dir": tmp_path / "run"})


def test_pd_handoff_re_derives_the_same_figures_from_its_request_records_steps_and_logs(tmp_path):
    res, again = _pd_rederived(tmp_path, Tier())
    assert again.invalid_reason is None and again.error is None
    assert again.metrics.keys() == res.metrics.keys()
    assert all(again.metrics[k] == pytest.approx(v) for k, v in res.metrics.items())


def test_pd_handoff_device_bytes_reparsed_a_claimed_consumer_read_follows_the_probe_steps(tmp_path):
    """The consumer re-computed (it read nothing); a signer claims its device read the KV: the steps say 0."""
    def edit(gate_dir, signed):
        for x in signed["evidence"]["prompts"]:
            x["consumer_read_bytes"] = 10 ** 9
    res, again = _pd_rederived(tmp_path, Tier(consumer_hits=False), edit)
    assert again.metrics["consumer_device_read_bytes"] == 0 and again.invalid_reason is not None


def test_pd_handoff_engine_log_rescanned_a_fall_back_line_is_invalid(tmp_path):
    def edit(gate_dir, signed):
        log = gate_dir / "engine-consumer.log"
        log.write_text(log.read_text() + "LMCache WARNING: System will operate in degraded mode (recompute)\n")
    _, again = _pd_rederived(tmp_path, Tier(), edit)
    assert again.invalid_reason.startswith("the engine fell back in the consumer engine's phase")


def test_pd_handoff_a_failed_request_in_its_raw_record_is_an_error_whatever_the_evidence_says(tmp_path):
    def edit(gate_dir, signed):
        p = gate_dir / "requests-handoff.jsonl"
        lines = [json.loads(line) for line in p.read_text().splitlines()]
        lines[1]["error"] = "HTTP 500: retrieve failed"
        p.write_text("".join(json.dumps(r) + "\n" for r in lines))
    _, again = _pd_rederived(tmp_path, Tier(), edit)
    assert again.error is not None and "HTTP 500: retrieve failed" in again.error


def test_pd_handoff_empty_requests_file_is_an_error(tmp_path):
    from harness.errors import HarnessError

    def edit(gate_dir, signed):
        (gate_dir / "requests-recompute.jsonl").write_text("")
    with pytest.raises(HarnessError, match="requests-recompute.jsonl: the recompute requests is empty"):
        _pd_rederived(tmp_path, Tier(), edit)


@pytest.mark.parametrize("kw", [dict(nodes=("p1", "d1"), storage="st", pool_storage="st:kvpool"),
                                dict(nodes=("p1", "d1"))], ids=["storage side", "no device"])
def test_pd_handoff_re_derives_the_same_verdict_whether_the_device_was_counted_on_the_storage_side_or_not(tmp_path, kw):
    res, again = _pd_rederived(tmp_path, Tier(device_on={"st"}), **kw)
    assert again.invalid_reason == res.invalid_reason and again.error == res.error
    assert again.metrics == pytest.approx(res.metrics)
