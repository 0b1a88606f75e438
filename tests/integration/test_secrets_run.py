"""A whole run holding secrets, through every writer to the signed bundle: a launched engine whose profile
has a token and a licence in its environment (and echoes both into its log), an attached engine whose URL
carries user:password@ and whose restart command sends an Authorization header. The nodes are scripted
(harness.transport.doubles), the engines are real HTTP servers on loopback (the runner talks to them over the
network as in production), and afterwards no byte of the run directory, the bundle directory, its archive or
the progress lines holds any of the secrets, while the engines did get them."""

import base64
import http.server
import json
import secrets
import tarfile
import threading
from pathlib import Path

import pytest
import yaml

from harness.config import load_config
from harness.gates.reevaluate import reevaluate_bundle
from harness.gates.verdict import Outcome
from harness.report.bundle import generate_keypair, load_private_key, verify_bundle
from harness.suite.runner import run_suite
from harness.transport.doubles import Reply, ScriptedTransport
from harness.workloads import WORKLOADS
from harness.workloads.kit.base import DROP_CACHES_ARGV

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PREFLIGHT_CPU_REFERENCE = (ROOT / "tests" / "fixtures" / "preflight" / "cpu-reference.stdout").read_text()
MODEL = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 2048, "torch_dtype": "bfloat16"}


def canary() -> str:
    return "kvcanary" + secrets.token_hex(12)


class EngineServer:
    """An engine's HTTP API on 127.0.0.1: /health, Prometheus counters (``prefix``), streamed completions.
    Prompts hit once ``cold_starts()`` says the engine restarted since it stored them. Keeps the
    Authorization headers it was sent."""

    def __init__(self, hit_name: str, query_name: str, extra_metrics: str = ""):
        self.hit_name, self.query_name, self.extra = hit_name, query_name, extra_metrics
        self.query = self.hit = 0
        self.stored: set[str] = set()
        self.start_time = 1000.0
        self.auth: list[str] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, body=b"", ctype="text/plain"):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                outer.auth.append(self.headers.get("Authorization", ""))
                if self.path == "/health":
                    return self._send(200, b"{}", "application/json")
                if self.path == "/metrics":
                    text = (f"{outer.query_name} {outer.query}\n{outer.hit_name} {outer.hit}\n"
                            f"process_start_time_seconds {outer.start_time}\n"
                            + outer.extra.format(hit=outer.hit))
                    return self._send(200, text.encode())
                return self._send(404)

            def do_POST(self):
                outer.auth.append(self.headers.get("Authorization", ""))
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                key, n = json.dumps(body["prompt"]), len(body["prompt"])
                outer.query += n
                if key in outer.stored:
                    outer.hit += n
                outer.stored.add(key)
                sse = b'data: {"choices": [{"text": " t"}]}\n\ndata: {"choices": [{"text": " u"}]}\n\ndata: [DONE]\n\n'
                return self._send(200, sse, "text/event-stream")

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def restart(self):
        self.start_time += 1
        self.query = self.hit = 0

    def stop(self):
        self.srv.shutdown()


def all_bytes(root: Path):
    """(name, bytes) of every regular file under ``root``, and of every member of every archive there."""
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            yield str(p), p.read_bytes()
            if p.name.endswith(".tar.gz"):
                with tarfile.open(p) as tf:
                    for m in tf.getmembers():
                        if m.isfile():
                            yield f"{p}:{m.name}", tf.extractfile(m).read()


def test_no_secret_reaches_any_file_of_the_run_or_the_bundle(tmp_path):
    token, licence, password, bearer = canary(), canary(), canary(), canary()
    launched = EngineServer("kvgate_cpu_ref_external_hit_tokens_total", "kvgate_cpu_ref_external_query_tokens_total",
                            "kvgate_cpu_ref_external_read_bytes_total {hit}0\n")
    attached = EngineServer("vllm:external_prefix_cache_hits_total", "vllm:external_prefix_cache_queries_total")
    # the launched engine's profile: the shipped cpu-reference one with a token and a licence in its env
    prof = yaml.safe_load((ROOT / "workloads" / "engines" / "cpu-reference.yaml").read_text())
    prof["env"].update(HF_TOKEN=token, VENDOR_LICENSE=licence)
    prof["secret_env"] = ["VENDOR_LICENSE"]
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "secret-engine.yaml").write_text(yaml.safe_dump(prof))
    suite = yaml.safe_load((ROOT / "gates" / "g2-cpu-reference.yaml").read_text())
    g2 = suite["gates"][0]
    g2.pop("stop_loss")  # the fake engines' timings decide nothing here: the attached gate must run after it
    g2["params"].update(engine=str(tmp_path / "cfg" / "secret-engine.yaml"), python="/engine/bin/python",
                        port=launched.port, populate_timeout_s=1)
    g2a = {"id": "G2a", "title": "attached", "workload": "g2-ttft", "metric": "readback_speedup_p50",
           "pass": ">= 1.5 x", "params": {
               "engine": "vllm-attach", "served_model_name": "m", "model_config_inline": MODEL,
               "prompt_tokens": [64], "prompts_per_length": 2, "pool_node": "n1", "pool_path": "/mnt/kvpool",
               "populate_timeout_s": 0.2,
               "attach": {"url": f"http://kvuser:{password}@127.0.0.1:{attached.port}", "connect_timeout_s": 5,
                          "restart": [{"node": "n1", "run": f"curl -fsS -H 'Authorization: Bearer {bearer}' "
                                                           "-X POST http://deploy.example/restart"}],
                          "log": {"node": "n1", "run": "kubectl logs deploy/x"}}}}
    suite["gates"] = [g2, g2a]
    (tmp_path / "cfg" / "gates.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    (tmp_path / "cfg" / "inv.yaml").write_text(yaml.safe_dump({"nodes": [
        {"name": "n1", "transport": "local", "work_dir": "/w"}]}))
    cfg = load_config(tmp_path / "cfg" / "inv.yaml", tmp_path / "cfg" / "gates.yaml", WORKLOADS)

    reads = iter(range(1000, 10 ** 9, 40000))
    spawned_env: list[dict] = []

    def handler(call):
        argv = call.argv
        if call.spawned:  # the launched engine prints its secrets into its log, as engines do at debug level
            spawned_env.append(dict(call.env))
            return Reply(stdout=f"INFO starting, HF_TOKEN={call.env['HF_TOKEN']} licence {call.env['VENDOR_LICENSE']}\n"
                                f"INFO serving on http://kvuser:{password}@0.0.0.0:{attached.port}\n")
        if argv[:2] == ("sh", "-c") and "restart" in argv[2]:
            attached.restart()
            return Reply(stdout=f"restarted (sent Authorization: Bearer {bearer})\n")
        if argv[:2] == ("sh", "-c") and "kubectl logs" in argv[2]:
            return Reply(stdout=f"engine up, basic auth kvuser:{password}, token {token}\n")
        if argv[0] == "find":
            n = len(launched.stored) + len(attached.stored) + 1
            return Reply(stdout="".join(f"{10_000_000}\n" for _ in range(n)))
        if "kvgate-pool-blockstat" in argv:  # the pool device probe: device and its counters
            return Reply(stdout=f"kvgate-pool-device 252:16 /dev/vdb\n1 0 {next(reads)} 0 0 0 0 0 0 0 0\n")
        if argv[0] == "/engine/bin/python":  # the engine pre-flight, as the real interpreter answered it
            return Reply(stdout=PREFLIGHT_CPU_REFERENCE)
        return Reply()  # facts, mkdir, drop caches: nothing to say

    node = ScriptedTransport(handler, name="n1")
    key, pub = generate_keypair(tmp_path / "op")
    lines: list[str] = []
    try:
        out = run_suite(cfg, tmp_path / "out", load_private_key(key), transports={"n1": node},
                        progress=lines.append)
    finally:
        launched.stop()
        attached.stop()

    # the run really went through both engines and kept its evidence ...
    for v in out.verdicts:
        assert v.outcome in (Outcome.PASS, Outcome.FAIL), (v.gate_id, v.outcome, v.reason)
    assert out.bundle is not None and verify_bundle(out.bundle.path, pub).ok
    # ... and the secrets reached what needed them: the engine's environment, the attached engine's auth
    assert spawned_env and all(e["HF_TOKEN"] == token and e["VENDOR_LICENSE"] == licence for e in spawned_env)
    basic = "Basic " + base64.b64encode(f"kvuser:{password}".encode()).decode()
    assert basic in attached.auth
    assert any(e.kind == "get" for e in node.events)  # engine logs were copied into the run
    # the bundle is all that is left of the run directory (renamed), and its archive beside it
    secrets_ = {"token": token, "licence": licence, "password": password, "bearer": bearer}
    leaks = [f"{name}: {what}" for name, data in all_bytes(tmp_path / "out")
             for what, value in secrets_.items() if value.encode() in data]
    assert leaks == []
    assert [ln for ln in lines if any(v in ln for v in secrets_.values())] == []
    # what was redacted is still recognisable as what it was
    g2a_steps = sorted((out.bundle.path / "steps").glob("*g2-attach-restart-0*"))
    assert "Authorization: REDACTED" in (g2a_steps[0] / "argv.json").read_text()
    spawn = json.loads(next((out.bundle.path / "steps").glob("*-spawn-*/argv.json")).read_text())
    assert spawn["env"]["HF_TOKEN"] == spawn["env"]["VENDOR_LICENSE"] == "REDACTED"
    assert spawn["env"]["PYTHONHASHSEED"] == "0"
    # the bundle's redacted config still loads, and its verdicts are re-derived from its redacted files
    assert "http://REDACTED@127.0.0.1:" in (out.bundle.path / "config" / "gates.yaml").read_text()
    signed = json.loads((out.bundle.path / "verdicts.json").read_text())
    again = reevaluate_bundle(out.bundle.path, {"verdicts": signed["verdicts"], "overall": signed["overall"]})
    assert again.same, again.differences
