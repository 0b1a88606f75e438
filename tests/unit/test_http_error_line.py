"""An HTTP error body becomes one bounded line for the verdict; the record keeps the body (captured bodies)."""

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from harness.engines.client import MAX_ERROR_BODY_BYTES, CompletionRequest, stream_completion
from harness.parsers.http_error import MAX_LINE_CHARS, error_line

FIXTURES = Path(__file__).parent.parent / "fixtures" / "http_errors"
FASTAPI_422 = (FIXTURES / "fastapi-422-token-ids.json").read_text()
LLAMA_CPP_PYTHON_500 = (FIXTURES / "llama-cpp-python-0.3.36-500-token-ids.json").read_text()


def test_1025_pydantic_validation_errors_are_one_line_naming_the_count_and_the_first():
    assert len(json.loads(FASTAPI_422)["detail"]) == 1025  # the captured body is what the issue met
    line = error_line(422, FASTAPI_422)
    assert line == "HTTP 422: 1025 validation errors; first: body.prompt.str: Input should be a valid string"
    assert "\n" not in line and len(line) <= MAX_LINE_CHARS


def test_llama_cpp_pythons_500_listing_1025_errors_in_its_message_is_one_line_naming_the_count_and_the_first():
    """The issue's run, captured: llama-cpp-python 0.3.36's server answers token ids with a 500 whose OpenAI-style
    message lists pydantic's 1,025 errors, one Python repr per line (136 kB with its traceback)."""
    assert len(LLAMA_CPP_PYTHON_500) > 100_000 and json.loads(LLAMA_CPP_PYTHON_500)["error"]["message"].count("\n") > 1000
    assert error_line(500, LLAMA_CPP_PYTHON_500) == ("HTTP 500: 1025 validation errors; first: body.prompt.str: Input "
                                                     "should be a valid string (internal_server_error)")


@pytest.mark.parametrize("status,body,expect", [
    (400, '{"error": {"message": "This model\'s maximum context length is 2048 tokens.\\nHowever you requested 4096",'
          ' "type": "BadRequestError", "param": null, "code": 400}}',
     "HTTP 400: This model's maximum context length is 2048 tokens. However you requested 4096 (BadRequestError)"),
    (400, '{"object": "error", "message": "prompt too long", "type": "BadRequestError", "code": 400}',
     "HTTP 400: prompt too long (BadRequestError)"),
    (404, '{"detail": "Not Found"}', "HTTP 404: Not Found"),
    (502, "\n\n<html><head><title>502 Bad Gateway</title></head>\n<body>nginx</body></html>\n",
     "HTTP 502: <html><head><title>502 Bad Gateway</title></head>"),
    (500, "", "HTTP 500: (empty body)"),
    (500, "Internal Server Error", "HTTP 500: Internal Server Error"),
])
def test_server_error_shapes_become_their_message(status, body, expect):
    assert error_line(status, body) == expect


def test_a_long_message_is_cut_to_the_bound_with_an_ellipsis():
    line = error_line(400, json.dumps({"error": {"message": "x" * 5000}}))
    assert len(line) == MAX_LINE_CHARS and line.endswith("…") and line.startswith("HTTP 400: xxx")


def _record(status: int, body: bytes):
    transport = httpx.MockTransport(lambda request: httpx.Response(status, content=body))

    async def go():
        async with httpx.AsyncClient(transport=transport) as client:
            return await stream_completion(client, "http://127.0.0.1:1/v1/completions",
                                           CompletionRequest("r0", list(range(10, 1034))), "m")
    return asyncio.run(go())


def test_the_record_has_the_line_as_its_error_and_the_whole_body_for_the_gates_files():
    rec = _record(422, FASTAPI_422.encode())
    assert rec.error == "HTTP 422: 1025 validation errors; first: body.prompt.str: Input should be a valid string"
    assert rec.error_body == FASTAPI_422 and rec.to_dict()["error_body"] == FASTAPI_422
    assert rec.http_status == 422 and not rec.ok
    assert rec.output_text == "" and rec.output_chunks == 0  # the body is not the model's output


def test_a_body_past_the_bound_is_kept_up_to_it_and_says_it_went_on():
    rec = _record(500, b"E" * (MAX_ERROR_BODY_BYTES * 3))
    assert rec.error == "HTTP 500: " + "E" * (MAX_LINE_CHARS - len("HTTP 500: ") - 1) + "…"
    assert rec.error_body.startswith("E" * MAX_ERROR_BODY_BYTES + "\n[... cut at")
    assert len(rec.error_body) < MAX_ERROR_BODY_BYTES + 100


def test_a_successful_stream_keeps_no_error_body():
    rec = _record(200, b'data: {"choices": [{"text": "a"}]}\n\ndata: [DONE]\n\n')
    assert rec.ok and rec.error_body is None
