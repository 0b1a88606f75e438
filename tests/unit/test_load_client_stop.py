"""The load client stopped mid-load (a gate's Cancellation), its schedule split over several client loops and
merged back, and the server's usage counts in a record. The server is an httpx MockTransport whose streams
are scripted; the open loop's clock and sleep are scripted, so nothing here times anything."""

import asyncio
import dataclasses
import json

import httpx
import pytest

from harness.engines.client import CANCELLED, ApiShape, CompletionRequest, RequestRecord, stream_completion
from harness.engines.load import (LoadRecord, closed_loop, merge_records, open_loop, open_loop_processes,
                                  split_schedule)
from harness.execute.cancel import Cancellation
from harness.execute.clock import Clock

CHUNK = b'data: {"choices": [{"text": "a"}]}\n\n'
DONE = b"data: [DONE]\n\n"


class ScriptedTime:
    def __init__(self):
        self.now = 0.0

    def clock(self):
        return self.now

    async def sleep(self, d):
        self.now += d
        await asyncio.sleep(0)


class HangingServer:
    """Answers the first ``answer`` requests whole; the next one streams a chunk and then hangs, and on that
    request the gate is cancelled (as its timeout or a Ctrl-C would). Records what it saw and which streams
    were closed by the client."""

    def __init__(self, cancel: Cancellation, answer: int):
        self.cancel, self.answer = cancel, answer
        self.seen: list[str] = []
        self.closed: list[str] = []
        self.forever = asyncio.Event()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        rid = f"r{len(self.seen)}"
        self.seen.append(rid)
        if len(self.seen) <= self.answer:
            return httpx.Response(200, content=CHUNK + CHUNK + DONE)
        server = self

        class Stream(httpx.AsyncByteStream):
            async def __aiter__(self):
                yield CHUNK
                server.cancel.cancel("the gate timed out")
                await server.forever.wait()  # never set: only the client's close ends this stream
                yield DONE

            async def aclose(self):
                server.closed.append(rid)

        return httpx.Response(200, stream=Stream())


def reqs(n):
    return [CompletionRequest(f"r{i}", [1, 2, 3], max_tokens=2) for i in range(n)]


def test_a_cancelled_open_loop_sends_nothing_more_closes_its_streams_and_keeps_its_records():
    cancel = Cancellation(clock=Clock())
    server, t = HangingServer(cancel, answer=2), ScriptedTime()
    offsets = [0.0, 0.1, 0.2, 5.0, 5.1, 5.2]
    recs = asyncio.run(asyncio.wait_for(open_loop("http://e", reqs(6), offsets, "m", clock=t.clock, sleep=t.sleep,
                                                  transport=httpx.MockTransport(server), stop=cancel), 30))
    assert server.seen == ["r0", "r1", "r2"]  # nothing sent after the stop
    assert server.closed == ["r2"]            # the stream in flight was closed by the client
    assert [r.record.request_id for r in recs] == ["r0", "r1", "r2"]
    assert recs[0].record.ok and recs[1].record.ok and recs[0].record.output_text == "aa"
    assert recs[2].record.error == CANCELLED and (recs[2].due_s, recs[2].sent_s) == (0.2, 0.2)
    assert t.now < 5.0  # the wait for r3 ended at the stop, not at r3's send time


def test_an_open_loop_cancelled_before_it_starts_sends_nothing():
    cancel = Cancellation(clock=Clock())
    cancel.cancel("Ctrl-C")
    server = HangingServer(cancel, answer=10)
    recs = asyncio.run(open_loop("http://e", reqs(3), [0, 0.1, 0.2], "m", transport=httpx.MockTransport(server),
                                 stop=cancel))
    assert recs == [] and server.seen == []


def test_a_cancelled_closed_loop_takes_no_further_request_and_keeps_its_records():
    cancel = Cancellation(clock=Clock())
    server = HangingServer(cancel, answer=3)
    recs = asyncio.run(asyncio.wait_for(closed_loop("http://e", reqs(8), 1, "m",
                                                    transport=httpx.MockTransport(server), stop=cancel), 30))
    assert server.seen == ["r0", "r1", "r2", "r3"] and server.closed == ["r3"]
    assert [r.record.ok for r in recs] == [True, True, True, False]
    assert recs[3].record.error == CANCELLED


def test_the_schedule_is_dealt_round_robin_in_send_order_and_merged_back_in_request_order():
    offsets = [0.5, 0.0, 0.3, 0.1, 0.2, 0.4, 0.6]
    shares = split_schedule(offsets, 3)
    assert shares == [[1, 2, 6], [3, 5], [4, 0]]  # send order 1 3 4 2 5 0 6, dealt in turn
    assert sorted(i for s in shares for i in s) == list(range(7))
    for s in shares:  # each loop's share is in send order and about a third of the rate
        assert [offsets[i] for i in s] == sorted(offsets[i] for i in s)
    assert split_schedule(offsets, 1) == [sorted(range(7), key=lambda i: offsets[i])]
    with pytest.raises(ValueError):
        split_schedule(offsets, 0)

    rs = reqs(7)

    def rec(i):
        r = RequestRecord(f"r{i}", None, 0.0, 0.1, (), 0.1, 0.1, 1, "a", 200)
        return LoadRecord(offsets[i], offsets[i] + 0.001, r)

    parts = [[rec(i) for i in s] for s in shares]
    merged = merge_records(rs, parts)
    assert [m.record.request_id for m in merged] == [f"r{i}" for i in range(7)]
    assert [m.due_s for m in merged] == offsets
    assert [m.record.request_id for m in merge_records(rs, parts[:1])] == sorted(
        (f"r{i}" for i in shares[0]), key=lambda x: int(x[1:]))  # a loop that sent nothing: no records
    with pytest.raises(ValueError, match="two client loops"):
        merge_records(rs, [parts[0], parts[0]])
    with pytest.raises(ValueError, match="not asked for"):
        merge_records(rs[:2], parts)


def test_the_split_follows_the_python_order_of_equal_send_times():
    assert split_schedule([0.0, 0.0, 0.0, 0.0], 2) == [[0, 2], [1, 3]]


def test_several_client_processes_refuse_a_mismatched_schedule_or_a_clock_of_their_own():
    with pytest.raises(ValueError):
        open_loop_processes("http://e", reqs(2), [0.0], "m", loops=2)
    with pytest.raises(ValueError, match="clock"):
        open_loop_processes("http://e", reqs(2), [0.0, 0.1], "m", loops=2, clock=lambda: 0.0)


def test_a_record_keeps_the_servers_usage_and_the_usage_event_is_no_token():
    sse = (b'data: {"choices": [{"delta": {"role": "assistant", "content": ""}}]}\n\n'
           b'data: {"choices": [{"delta": {"content": "x"}}]}\n\n'
           b'data: {"choices": [{"delta": {"content": "y"}}]}\n\n'
           b'data: {"choices": [], "usage": {"prompt_tokens": 17, "completion_tokens": 2, "total_tokens": 19}}\n\n'
           + DONE)
    bodies = []

    def handler(request):
        bodies.append(request.content)
        return httpx.Response(200, content=sse)

    t = ScriptedTime()
    recs = asyncio.run(open_loop("http://e", [CompletionRequest("c", "hello", max_tokens=2)], [0.0], "m",
                                 clock=t.clock, sleep=t.sleep, transport=httpx.MockTransport(handler),
                                 path="/v1/chat/completions", api=ApiShape(kind="chat", include_usage=True)))
    r = recs[0].record
    assert r.ok and r.output_chunks == 2 and r.output_text == "xy"
    assert (r.usage_prompt_tokens, r.usage_completion_tokens) == (17, 2)
    assert json.loads(bodies[0])["stream_options"] == {"include_usage": True}
    # not asked for: not sent (a strict server may refuse stream_options), and no usage recorded when none came
    plain = CompletionRequest("p", [1, 2], max_tokens=1).payload("m")
    assert "stream_options" not in plain


def test_the_first_event_with_choices_is_timed_apart_from_the_first_token():
    # a chat server's role-only preamble: vllm bench serve's TTFT stops on it, kvgate's ttft_s on the first token
    sse = (b'data: {"choices": [{"delta": {"role": "assistant", "content": ""}}]}\n\n'
           b'data: {"choices": [{"delta": {"content": "x"}}]}\n\n'
           b'data: {"choices": [{"delta": {"content": "y"}}]}\n\n' + DONE)
    ticks = iter(range(100))

    def clock():  # one tick per read: send, three events with choices, end of stream
        return next(ticks) * 0.1

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(200, content=sse))) as c:
            return await stream_completion(c, "http://e/v1/chat/completions", CompletionRequest("c", "hi", 2), "m",
                                           clock=clock, api=ApiShape(kind="chat"))

    r = asyncio.run(go())
    assert r.ok and r.first_event_s == pytest.approx(0.1) and r.ttft_s == pytest.approx(0.2)
    assert r.itl_s == pytest.approx((0.1,)) and r.latency_s == pytest.approx(0.3) and r.e2e_s == pytest.approx(0.4)
    assert r.usage_prompt_tokens is None and r.usage_completion_tokens is None  # none sent: none recorded


def test_token_figures_use_the_servers_count_when_it_sent_one():
    from harness.engines.load import load_point
    # 4 tokens by the server's count, 2 stream events (two tokens' text held back): TPOT over 3 gaps, not 1
    r = RequestRecord("u", 10, 0.0, 0.1, (0.3,), 0.4, 0.5, 2, "ab", 200, usage_completion_tokens=4)
    p = load_point([LoadRecord(0.0, 0.0, r)])
    assert p.tpot_p50_s == pytest.approx(0.1) and p.output_token_rate_tps == pytest.approx(4 / 0.5)
    no_usage = dataclasses.replace(r, usage_completion_tokens=None)
    assert load_point([LoadRecord(0.0, 0.0, no_usage)]).tpot_p50_s == pytest.approx(0.3)
