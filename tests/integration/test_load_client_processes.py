"""The open loop spread over several client processes (``open_loop_processes``) against a real HTTP server on
loopback (a stdlib threading server streaming SSE): every request sent once, by one of the processes, on the
common schedule, the records merged back in request order; a stop set mid-load ends every process's sending."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from harness.engines.client import CompletionRequest
from harness.engines.load import arrival_offsets, open_loop_processes

pytestmark = [pytest.mark.integration]


class Sse(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[str] = []
    lock = threading.Lock()
    stop_after: int | None = None
    stop: threading.Event | None = None

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.lock:
            self.seen.append(body["kvgate_id"])
            if self.stop_after is not None and len(self.seen) >= self.stop_after:
                self.stop.set()
        payload = b'data: {"choices": [{"text": "a"}]}\n\ndata: {"choices": [{"text": "b"}]}\n\ndata: [DONE]\n\n'
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *a):
        pass


@pytest.fixture()
def server():
    Sse.seen, Sse.stop_after, Sse.stop = [], None, None
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Sse)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def reqs(n):
    return [CompletionRequest(f"p{i}", [1, 2, 3], max_tokens=2, extra={"kvgate_id": f"p{i}"}) for i in range(n)]


def test_two_client_processes_send_every_request_once_on_one_schedule(server):
    offsets = arrival_offsets(40, 40.0, seed=2)
    recs = open_loop_processes(server, reqs(40), offsets, "m", loops=2)
    assert sorted(Sse.seen) == sorted(f"p{i}" for i in range(40))  # each once
    assert [r.record.request_id for r in recs] == [f"p{i}" for i in range(40)]
    assert all(r.record.ok and r.record.output_text == "ab" for r in recs)
    assert [r.due_s for r in recs] == offsets
    # one origin for both processes: no request sent before it was due (a process's own origin would show
    # its share early or late by the difference)
    assert all(r.sent_s >= r.due_s for r in recs)


def test_a_stop_set_mid_load_ends_the_sending_of_every_process(server):
    stop = threading.Event()
    Sse.stop_after, Sse.stop = 5, stop
    offsets = [0.0, 0.01, 0.02, 0.03, 0.04] + [2.0 + 0.01 * i for i in range(15)]
    recs = open_loop_processes(server, reqs(20), offsets, "m", loops=2, stop=stop)
    assert len(Sse.seen) == 5 and len(recs) == 5
    assert [r.record.request_id for r in recs] == [f"p{i}" for i in range(5)]
