"""The streaming client's timing with a scripted clock: TTFT, ITL, e2e, queueing, failures as records."""

import asyncio
import json

import httpx
import pytest

from harness.engines.client import CompletionRequest, run_requests, stream_completion, summarize
from harness.parsers.sse import parse_sse_lines
from harness.stats import percentile


class FakeClock:
    """A scripted clock: time moves only when the stream script says so."""

    def __init__(self, t0: float = 100.0):
        self.t = t0

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def sse(event) -> bytes:
    return b"data: " + (event.encode() if isinstance(event, str) else json.dumps(event).encode()) + b"\n\n"


def text_event(text: str) -> dict:
    return {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": text,
                                                                     "finish_reason": None}]}


def scripted_transport(clock: FakeClock, script, status: int = 200):
    """Each script item is (delay_s, bytes): the clock advances by delay_s before the bytes arrive."""

    async def body():
        for delay, data in script:
            clock.advance(delay)
            await asyncio.sleep(0)
            yield data

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=body(), headers={"content-type": "text/event-stream"})

    return httpx.MockTransport(handler)


async def one(transport, clock, req=None):
    async with httpx.AsyncClient(transport=transport) as client:
        return await stream_completion(client, "http://engine/v1/completions",
                                       req or CompletionRequest("r0", "hello", max_tokens=3, prompt_tokens=5),
                                       "m", clock=clock)


def test_ttft_counts_from_send_to_first_token_chunk_and_invariant_holds():
    clock = FakeClock()
    script = [(0.5, sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})),  # preamble
              (0.25, sse({"choices": []})),          # no choice: not a token
              (1.0, sse(text_event("a"))),          # first token at 1.75 s
              (0.1, sse(text_event("b"))),
              (0.3, sse(text_event("c"))),
              (0.05, sse("[DONE]"))]
    rec = asyncio.run(one(scripted_transport(clock, script), clock))
    assert rec.error is None
    assert rec.ttft_s == pytest.approx(1.75)
    assert rec.itl_s == pytest.approx((0.1, 0.3))
    assert rec.latency_s - rec.ttft_s == pytest.approx(sum(rec.itl_s))
    assert rec.e2e_s == pytest.approx(2.2)
    assert rec.output_text == "abc" and rec.output_chunks == 3 and rec.prompt_tokens == 5


def test_chunk_split_across_network_reads_is_timed_when_complete():
    clock = FakeClock()
    ev = sse(text_event("tok"))
    script = [(1.0, ev[:7]), (2.0, ev[7:]), (0.0, sse("[DONE]"))]
    rec = asyncio.run(one(scripted_transport(clock, script), clock))
    assert rec.ttft_s == pytest.approx(3.0)


@pytest.mark.parametrize("script,status,expect", [
    ([(0.1, sse("[DONE]"))], 200, "without a token chunk"),
    ([(0.1, sse(text_event("x")))], 200, "without [DONE]"),
    ([(0.1, b"data: {not json\n\n")], 200, "malformed stream event"),
    ([(0.1, sse({"error": {"message": "boom", "code": 500}}))], 200, "server error in stream"),
    ([(0.1, b'{"error": "model not loaded"}')], 503, "HTTP 503: model not loaded"),
])
def test_failed_streams_are_records_not_exceptions(script, status, expect):
    clock = FakeClock()
    rec = asyncio.run(one(scripted_transport(clock, script, status), clock))
    assert not rec.ok
    assert expect in rec.error
    assert rec.http_status == status


def test_connection_refused_is_a_record():
    def handler(request):
        raise httpx.ConnectError("connection refused", request=request)
    clock = FakeClock()
    rec = asyncio.run(one(httpx.MockTransport(handler), clock))
    assert not rec.ok and "ConnectError" in rec.error and rec.ttft_s is None and rec.http_status is None


def test_client_side_queueing_is_measured_separately_from_ttft():
    clock = FakeClock()

    async def body():
        clock.advance(2.0)
        await asyncio.sleep(0)
        yield sse(text_event("x"))
        yield sse("[DONE]")

    transport = httpx.MockTransport(lambda r: httpx.Response(200, content=body()))
    reqs = [CompletionRequest(f"r{i}", "p") for i in range(3)]
    recs = asyncio.run(run_requests("http://engine", reqs, "m", concurrency=1, clock=clock, transport=transport))
    assert [r.request_id for r in recs] == ["r0", "r1", "r2"]
    assert [r.ttft_s for r in recs] == pytest.approx([2.0, 2.0, 2.0])
    assert [r.queue_s for r in recs] == pytest.approx([0.0, 2.0, 4.0])


def test_request_payload_streams_and_sends_prompt():
    seen = {}

    def handler(request):
        seen.update(json.loads(request.content))
        seen["path"] = request.url.path
        return httpx.Response(200, content=sse(text_event("x")) + sse("[DONE]"))

    recs = asyncio.run(run_requests("http://engine/", [CompletionRequest("r", [1, 2, 3], max_tokens=4)], "tiny",
                                    transport=httpx.MockTransport(handler)))
    assert recs[0].ok
    assert seen["path"] == "/v1/completions" and seen["stream"] is True
    assert seen["prompt"] == [1, 2, 3] and seen["max_tokens"] == 4 and seen["model"] == "tiny"


def test_captured_stream_fixture_parses(fixtures):
    path = fixtures / "g2" / "cpu_reference_stream.sse"
    events = parse_sse_lines(path.read_text().splitlines())
    assert events[-1] == "[DONE]"
    assert all(isinstance(e, dict) and e["object"] == "text_completion" for e in events[:-1])


def test_percentile_matches_linear_interpolation_and_summary_skips_failures():
    assert percentile([1, 2, 3, 4], 50) == pytest.approx(2.5)
    assert percentile([5.0], 99) == 5.0
    assert percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 90) == pytest.approx(9.1)
    with pytest.raises(ValueError):
        percentile([], 50)
    clock = FakeClock()
    ok = asyncio.run(one(scripted_transport(clock, [(1.0, sse(text_event("a"))), (0, sse("[DONE]"))]), clock))
    bad = asyncio.run(one(scripted_transport(clock, [(1.0, sse("[DONE]"))]), clock))
    s = summarize([ok, bad])
    assert s["ok"] == 1 and s["failed"] == 1 and s["ttft_p50_s"] == pytest.approx(1.0)


def test_a_token_whose_text_is_empty_still_counts_for_ttft():
    """A generated token can decode to '' (a special token, part of a multi-byte character): it was still
    generated, so TTFT ends there, as `vllm bench serve` counts it."""
    clock = FakeClock()
    script = [(0.4, sse(text_event(""))), (0.1, sse(text_event("b"))), (0.0, sse("[DONE]"))]
    rec = asyncio.run(one(scripted_transport(clock, script), clock))
    assert rec.ok and rec.ttft_s == pytest.approx(0.4) and rec.output_chunks == 2 and rec.output_text == "b"


def test_logprobs_of_a_captured_vllm_stream_are_kept_token_by_token(fixtures):
    """A real `vllm serve` (CPU build) stream with logprobs=5 and return_tokens_as_token_ids (captured): the client
    keeps every generated token id with its logprob and top alternatives, in order, and they survive to_dict."""
    raw = (fixtures / "g2" / "vllm_cpu_logprobs_stream.sse").read_text()
    clock = FakeClock()
    script = [(0.01, (line + "\n").encode()) for line in raw.splitlines()]
    req = CompletionRequest("r0", "hello", max_tokens=8, extra={"logprobs": 5, "return_tokens_as_token_ids": True})
    rec = asyncio.run(one(scripted_transport(clock, script), clock, req))
    assert rec.ok, rec.error
    assert len(rec.tokens) == 8 == len(rec.token_logprobs) == len(rec.top_logprobs)
    assert rec.tokens[:3] == ("token_id:1490", "token_id:1867", "token_id:1867")
    assert rec.token_logprobs[0] == pytest.approx(-6.675073146820068)
    assert len(rec.top_logprobs[0]) == 5 and rec.top_logprobs[0]["token_id:109"] == pytest.approx(-6.686791896820068)
    # greedy: each chosen token is its position's best alternative
    assert all(max(top, key=top.get) == tok for tok, top in zip(rec.tokens, rec.top_logprobs))
    d = rec.to_dict()
    assert d["tokens"][0] == "token_id:1490" and json.loads(json.dumps(d))["top_logprobs"][1]["token_id:598"] < 0


def test_a_stream_without_logprobs_records_no_tokens():
    clock = FakeClock()
    rec = asyncio.run(one(scripted_transport(clock, [(0.1, sse(text_event("a"))), (0, sse("[DONE]"))]), clock))
    assert rec.ok and rec.tokens == () and rec.token_logprobs == () and rec.top_logprobs == ()


def test_chunk_logprobs_keeps_a_null_logprob_as_none_never_a_guess():
    from harness.parsers.sse import chunk_logprobs
    ev = {"choices": [{"text": "x", "logprobs": {"tokens": ["a", "b"], "token_logprobs": [None, -1.5],
                                                  "top_logprobs": [None, {"b": -1.5, "c": "junk"}]}}]}
    assert chunk_logprobs(ev) == [("a", None, {}), ("b", -1.5, {"b": -1.5})]
    assert chunk_logprobs({"choices": [{"text": "x", "logprobs": None}]}) == []
