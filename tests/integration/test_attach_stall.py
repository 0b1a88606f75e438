"""A gate's timeout_s stops its HTTP-bound work too: G2 attached to an engine that stalls (an HTTP server on
loopback, here in the test, that accepts a completion and never answers, or streams a token now and then for
ever). The gate ends ERROR at its limit; the next gate starts only after the first gate's workload thread is
gone; no request of the first gate reaches the engine after its end; no file of it lands in its directory after
its end; the bundle verifies. (tests/unit/test_gate_cancel.py: the guard on a workload that writes after its end.)"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from harness.config import load_config
from harness.report.bundle import generate_keypair, load_private_key, verify_bundle
from harness.suite.runner import run_suite
from harness.transport.doubles import Reply, ScriptedTransport
from harness.workloads import WORKLOADS

pytestmark = pytest.mark.integration

MODEL = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 2048, "torch_dtype": "bfloat16"}
TIMEOUT_S = 2


class StallingEngine:
    """An engine at http://127.0.0.1:PORT/<gate>/...: health and metrics answer; a completion is accepted and
    then ``silent`` (no byte back) or ``slow`` (one token chunk every 0.2 s, never [DONE]). Every request is
    recorded with its arrival time and which gate threads of the run were alive when it came."""

    def __init__(self, mode: str):
        self.mode = mode
        self.requests: list[dict] = []
        self.release = threading.Event()
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def _note(self):
                engine.requests.append({"t": time.time(), "method": self.command, "path": self.path,
                                        "gate_threads": sorted(t.name for t in threading.enumerate()
                                                               if t.name.startswith("gate-"))})

            def do_GET(self):
                self._note()
                body = (b"process_start_time_seconds 1000\n" if self.path.endswith("/metrics") else b"ok")
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                self._note()
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if engine.mode == "silent":
                    engine.release.wait()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                try:
                    while not engine.release.wait(0.2):
                        self.wfile.write(b'data: {"choices": [{"text": " t"}]}\n\n')
                        self.wfile.flush()
                except OSError:  # the client went away
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(params=["silent", "slow"])
def engine(request):
    e = StallingEngine(request.param)
    yield e
    e.close()


def node(call):
    argv = call.argv
    if argv[0] == "find":
        return Reply(stdout="")
    if argv[0] == "findmnt":
        return Reply(stdout="/dev/nvme1n1\n")
    if argv[:2] == ("cat", "/sys/class/block/nvme1n1/stat"):
        return Reply(stdout="1 0 0 0 0 0 0 0 0 0 0\n")
    return Reply()  # facts, restart, drop caches: nothing to say


def gate(gid: str, port: int) -> dict:
    return {"id": gid, "title": f"{gid} on a stalling engine", "workload": "g2-ttft", "nodes": ["gpu1"],
            "metric": "readback_speedup_p50", "pass": ">= 1.5 x", "timeout_s": TIMEOUT_S,
            "params": {"engine": "vllm-attach", "served_model_name": "m", "model_config_inline": MODEL,
                       "prompt_tokens": [64], "prompts_per_length": 2, "pool_path": "/mnt/kvpool",
                       # on today's main a stalled request held the gate's thread this long, after its end
                       "request_timeout_s": 6,
                       "attach": {"url": f"http://127.0.0.1:{port}/{gid}", "connect_timeout_s": 5,
                                  "restart": [{"node": "gpu1", "run": "systemctl restart vllm"}]}}}


def test_a_stalled_attached_engine_ends_the_gate_at_its_limit_and_nothing_of_it_outlives_it(tmp_path, engine):
    (tmp_path / "g.yaml").write_text(yaml.safe_dump({"suite": {"name": "stall", "version": 1},
                                                    "gates": [gate("A", engine.port), gate("B", engine.port)]}))
    (tmp_path / "i.yaml").write_text(yaml.safe_dump({"nodes": [{"name": "gpu1", "transport": "local",
                                                                "work_dir": "/w"}]}))
    cfg = load_config(tmp_path / "i.yaml", tmp_path / "g.yaml", WORKLOADS)
    key, pub = generate_keypair(tmp_path / "op")
    out = run_suite(cfg, tmp_path / "out", load_private_key(key),
                    transports={"gpu1": ScriptedTransport(node, name="gpu1")}, progress=lambda m: None,
                    make_tar=False)
    # both gates end ERROR at their limit, and the run goes on to the second one
    assert [v.outcome.value for v in out.verdicts] == ["ERROR", "ERROR"], [v.reason for v in out.verdicts]
    assert all(f"timed out after {TIMEOUT_S} s" in v.reason for v in out.verdicts), [v.reason for v in out.verdicts]
    assert not [t.name for t in threading.enumerate() if t.name.startswith("gate-")]
    # the second gate started only after the first gate's workload thread was gone
    first_b = next(r for r in engine.requests if r["path"].startswith("/B/"))
    assert first_b["gate_threads"] == ["gate-B"], first_b
    # no request of gate A reached the engine after gate A ended (nor once gate B had started)
    assert out.bundle is not None
    a = json.loads((out.bundle.path / "gates" / "A" / "result.json").read_text())
    late = [r for r in engine.requests if r["path"].startswith("/A/")
            and (r["t"] > a["finished_unix_s"] or r["t"] >= first_b["t"])]
    assert not late, late
    assert any(r["method"] == "POST" for r in engine.requests if r["path"].startswith("/A/"))  # it did stall
    # nothing of gate A's landed in its directory after its end: only the runner's record of the gate is there
    assert sorted(p.name for p in (out.bundle.path / "gates" / "A").iterdir()) == ["result.json", "verdict.json"]
    assert a["evidence"]["workload_returned_after_stop"] is True
    v = verify_bundle(out.bundle.path, pub)
    assert v.ok, v.error
