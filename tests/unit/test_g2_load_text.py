"""g2-load on a server that takes text only (llama.cpp's, llama-cpp-python's, `transformers serve`): the profile's
``api.prompt_format: text`` (or a chat API) makes g2-load send text built with the model's tokenizer, prompts that
share token ids sharing their tokens; a server refusing the prompts ends the run with one line naming its error,
the whole body in the requests file. The engine here is a MockTransport handler that encodes the prompts it gets
with the same tokenizer (the real server's test: tests/integration/test_g2_load_text_only.py)."""

import json
from pathlib import Path

import httpx
import pytest
import yaml

import doubles
from harness.config import load_config
from harness.engines.prompts import HFTokenizers, IdsAsText
from harness.errors import ConfigError
from harness.node.make_model import train_tokenizer
from harness.transport.doubles import Reply, ScriptedTransport
from harness.workloads import WORKLOADS

ROOT = Path(__file__).resolve().parents[2]
# llama-cpp-python 0.3.36's real answer to g2-load's 1,024 token ids (tests/fixtures/http_errors/README.md)
REFUSAL = (ROOT / "tests" / "fixtures" / "http_errors" / "llama-cpp-python-0.3.36-500-token-ids.json").read_text()
PREFIX, PROMPT = 32, 64


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> Path:
    """kvgate's random model's tokenizer (harness/node/make_model.py: byte-level BPE trained on seeded text)."""
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_tokenizer(2048, 13).save(str(path))
    return path


class TextOnlyEngine:
    """A server that takes text only, as llama-cpp-python's (``prompt: str | list[str]``): token ids get its
    captured 500 listing 1,025 validation errors; text is encoded with the model's tokenizer."""

    def __init__(self, tokenizer: Path):
        self.tok = HFTokenizers.from_file(tokenizer)
        self.encoded: list[list[int]] = []
        self.paths: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        if request.url.path == "/health":
            return httpx.Response(200, json={})
        if request.url.path == "/metrics":
            return httpx.Response(404, json={"detail": "Not Found"})
        body = json.loads(request.content)
        text = body["messages"][-1]["content"] if "messages" in body else body["prompt"]
        if not isinstance(text, str):
            return httpx.Response(500, text=REFUSAL, headers={"content-type": "application/json"})
        self.encoded.append(self.tok.encode(text))
        event = ({"choices": [{"delta": {"content": " a"}}]} if "messages" in body else {"choices": [{"text": " a"}]})
        return httpx.Response(200, text=f"data: {json.dumps(event)}\n\ndata: [DONE]\n\n",
                              headers={"content-type": "text/event-stream"})


def _profile(tmp_path: Path, **api) -> str:
    """The shipped openai-attach profile, its api block changed by ``api``."""
    prof = yaml.safe_load((ROOT / "workloads" / "engines" / "openai-attach.yaml").read_text())
    prof["api"].update(api)
    path = tmp_path / "text-server.yaml"
    path.write_text(yaml.safe_dump(prof, sort_keys=False))
    return str(path)


def _config(tmp_path: Path, engine: str, tokenizer: Path | None):
    params = {"engine": engine, "served_model_name": "m", "pool_path": "/mnt/kvpool", "trials": 2, "ttft_slo_s": 1.0,
              "max_tokens": 2, "load": {"concurrency": [1, 2]}, "requests_per_point": 4, "prompt_tokens": PROMPT,
              "shared_prefix_tokens": PREFIX, "prefix_groups": 2, "attach": {"url": "http://127.0.0.1:8000"},
              "model_config_inline": {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2,
                                      "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 2048,
                                      "torch_dtype": "bfloat16"}}
    if tokenizer is not None:
        params["tokenizer"] = str(tokenizer)
    gate = {"id": "L", "title": "load", "workload": "g2-load", "params": params, "metric": "knee_concurrency",
            "pass": ">= 2"}
    (tmp_path / "g.yaml").write_text(yaml.safe_dump({"suite": {"name": "t", "version": "1"}, "gates": [gate]}))
    (tmp_path / "i.yaml").write_text(yaml.safe_dump({"nodes": [{"name": "n1", "transport": "local",
                                                                "work_dir": "/w"}]}))
    return load_config(tmp_path / "i.yaml", tmp_path / "g.yaml", WORKLOADS, trials_rule=False)


def _run(tmp_path: Path, engine: str, tokenizer: Path, server: TextOnlyEngine):
    cfg = _config(tmp_path, engine, tokenizer)

    def node(call):
        if "kvgate-pool-blockstat" in call.argv:
            return Reply(stdout="kvgate-pool-device 8:1 /dev/sda1\n1 0 5000 0 1 0 4096 0 0 0 0\n")
        return Reply(rc=127, stderr=f"{call.argv[0]}: not expected")
    ctx = doubles.gate_context(tmp_path, cfg, transports={"n1": ScriptedTransport(node, name="n1")}, http=server)
    return WORKLOADS["g2-load"]().run(ctx), ctx.gate_dir


def test_a_text_only_server_gets_text_whose_tokens_share_exactly_the_prefix_of_their_group(tmp_path, tokenizer_file):
    server = TextOnlyEngine(tokenizer_file)
    result, _ = _run(tmp_path, "openai-attach", tokenizer_file, server)  # the shipped profile: prompt_format text
    assert result.error is None and result.invalid_reason is None, (result.error, result.invalid_reason)
    ev = result.evidence
    assert ev.prompt_kind == "text" and ev.tokenizer == str(tokenizer_file)
    assert len(server.encoded) == 1 + 2 * 2 * 4  # the warm-up, then 2 trials x 2 points x 4 requests
    ladder = server.encoded[1:]
    assert all(len(ids) == PROMPT for ids in ladder)  # this tokenizer adds no BOS: exactly the prompt's tokens
    point = ladder[:4]  # one point: groups round-robin, so requests 0 and 2 share a prefix, 0 and 1 do not
    assert point[0][:PREFIX] == point[2][:PREFIX] != point[1][:PREFIX]
    assert point[0][PREFIX:] != point[2][PREFIX:]
    assert ladder[4][:PREFIX] != point[0][:PREFIX]  # the next point's prompts are new to the engine
    assert all(p.figures.ok == 4 for p in ev.points) and sum(p.accounting.prompt_tokens for p in ev.points) == 16 * 64
    tier = next(c for c in ev.validity if c.name == "tier hits read from the pool")
    assert not tier.checked and "counts no tier hits" in tier.how  # no counter: no claim, and it says so


def test_a_chat_profile_sends_the_same_text_as_its_user_message(tmp_path, tokenizer_file):
    server = TextOnlyEngine(tokenizer_file)
    result, _ = _run(tmp_path, _profile(tmp_path, kind="chat", prompt_format="token_ids_or_text"), tokenizer_file,
                     server)
    assert result.error is None and result.invalid_reason is None, (result.error, result.invalid_reason)
    assert set(server.paths) >= {"/v1/chat/completions"} and "/v1/completions" not in server.paths
    assert result.evidence.prompt_kind == "text" and all(len(ids) == PROMPT for ids in server.encoded[1:])


def test_token_ids_sent_to_a_text_only_server_end_the_run_with_one_line_and_the_body_in_the_requests_file(
        tmp_path, tokenizer_file):
    """The issue's run: a profile that lets g2-load send ids (as every profile did) to a server that refuses
    them. The verdict's reason is one line; the 136 kB body is in each request's record."""
    server = TextOnlyEngine(tokenizer_file)
    result, gate_dir = _run(tmp_path, _profile(tmp_path, prompt_format="token_ids_or_text"), None, server)
    assert result.error is not None and "\n" not in result.error and len(result.error) < 400
    assert result.error.endswith("HTTP 500: 1025 validation errors; first: body.prompt.str: Input should be a "
                                 "valid string (internal_server_error)")
    rec = json.loads((gate_dir / "requests-c1-t1.jsonl").read_text().splitlines()[0])
    assert rec["error"].startswith("HTTP 500: 1025 validation errors") and rec["error_body"] == REFUSAL
    assert rec["output_text"] == ""


def test_a_text_only_profile_without_a_tokenizer_is_refused_by_validate_naming_the_field(tmp_path):
    with pytest.raises(ConfigError) as exc:
        _config(tmp_path, "openai-attach", None)
    assert "takes text prompts only" in str(exc.value) and "tokenizer" in str(exc.value)
    assert "g.yaml:" in str(exc.value)


def test_ids_as_text_is_pure_and_a_prefix_of_ids_is_a_prefix_of_tokens(tokenizer_file):
    tok = HFTokenizers.from_file(tokenizer_file)
    codec = IdsAsText(tok)
    a = list(range(10, 300))
    b = a[:100] + list(range(700, 890))
    ta, tb = codec.text(a), codec.text(b)
    assert IdsAsText(tok).text(a) == ta  # the same ids, the same text, in another run
    ea, eb = tok.encode(ta), tok.encode(tb)
    assert len(ea) == len(eb) == 290 and ea[:100] == eb[:100] and ea[100] != eb[100]


def test_a_profile_that_takes_text_only_and_token_ids_only_is_refused():
    from harness.engines.profiles import EngineProfile
    prof = yaml.safe_load((ROOT / "workloads" / "engines" / "openai-attach.yaml").read_text())
    prof["capabilities"] = {"token_ids_only": True}
    with pytest.raises(ValueError, match="no prompt could be sent"):
        EngineProfile.model_validate(prof)


def _prof(**api):
    from harness.engines.profiles import EngineProfile
    prof = yaml.safe_load((ROOT / "workloads" / "engines" / "openai-attach.yaml").read_text())
    prof["api"].update(api)
    return EngineProfile.model_validate(prof)


def test_g2_gain_sends_both_arms_the_same_text_when_either_arms_api_takes_text_only(tokenizer_file):
    from types import SimpleNamespace

    from harness.workloads.g2_gain import arm_prompts
    from harness.workloads.kit.load import G2LoadEvidence
    setups = {a: SimpleNamespace(ev=SimpleNamespace(tokenizer=str(tokenizer_file))) for a in ("tier", "no_tier")}
    ev = {a: G2LoadEvidence() for a in ("tier", "no_tier")}
    prompts = arm_prompts({"tier": _prof(prompt_format="token_ids_or_text"), "no_tier": _prof()}, setups, 2048, ev)
    assert prompts.text is not None and {e.prompt_kind for e in ev.values()} == {"text"}
    ids = {a: G2LoadEvidence() for a in ("tier", "no_tier")}
    both_ids = arm_prompts({a: _prof(prompt_format="token_ids_or_text") for a in ("tier", "no_tier")}, setups, 2048,
                           ids)
    assert both_ids.text is None and {e.prompt_kind for e in ids.values()} == {"token_ids"}
