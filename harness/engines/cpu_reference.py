"""cpu-reference engine: a small OpenAI-compatible streaming server whose prompt KV lives in LMCache.

For CI and for trying kvgate without GPUs. The model is a Llama-architecture transformers model built
from a config with seeded random weights (nothing is downloaded). Each prompt's KV cache is looked up
in, retrieved from and stored to the real LMCache engine (CPU, with an fs:// pool from the LMCache YAML
kvgate writes) through ``CPUKVConnector``, a connector that copies between LMCache's memory objects and
the model's per-layer key/value tensors. A prompt whose KV is in the pool is served by reading it back
and computing only the last token; otherwise it is prefilled in full and its KV stored.

Endpoints: ``GET /health``, ``GET /metrics`` (Prometheus text, this engine's own hit counters),
``POST /v1/completions`` (``stream: true`` SSE, or a single JSON body). Prompts are token-id lists, or
text mapped to ids byte by byte (there is no tokenizer).

Run: ``python3 -m harness.engines.cpu_reference --port 8000 --model-config model.json
--lmcache-config lmcache.yaml``, or as a file: the engine workloads put this file into the run directory on
a node and run it with the engine's interpreter (``python3 cpu_reference.py ...``), so a node needs torch,
transformers and lmcache (the ``cpu-engine`` extra), not kvgate. Its imports at the top are the standard
library only; with kvgate importable it checks its input files with kvgate's hardened readers first (as a
lone file it reads them plainly: kvgate wrote and checked them before the launch).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import traceback
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ENGINE_NAME = "kvgate-cpu-reference"
METRIC_PREFIX = "kvgate_cpu_ref_"
LMCACHE_VERSION = "0.5.6"  # the LMCache this engine is built against (the cpu-engine extra pins it)

# A model small enough that CI prefill of a few thousand tokens takes seconds, not minutes.
DEFAULT_MODEL_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "vocab_size": 4096,
    "max_position_embeddings": 65536,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "torch_dtype": "float32",
    "tie_word_embeddings": False,
}


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {ENGINE_NAME}: {msg}", file=sys.stderr, flush=True)


class Counters:
    """Monotonic counters exposed on /metrics; all updates under one lock."""

    NAMES = {
        "requests_total": "Completion requests served",
        "prompt_tokens_total": "Prompt tokens received",
        "external_query_tokens_total": "Prompt tokens looked up in the KV pool",
        "external_hit_tokens_total": "Prompt tokens whose KV was read back from LMCache (its RAM level or the pool)",
        "ram_hit_tokens_total": "Of those, prompt tokens whose KV LMCache held in its RAM level (local_cpu)",
        "external_read_bytes_total": "KV bytes read back from the KV pool",
        "external_stored_tokens_total": "Prompt tokens whose KV was handed to LMCache for storing",
        "prefill_tokens_total": "Prompt tokens computed by the model (not read back)",
        "gpu_hit_tokens_total": "Prompt tokens whose KV was reused from the in-memory prefix cache",
        "gpu_evicted_tokens_total": "Tokens of KV evicted from the in-memory prefix cache",
        "generation_tokens_total": "Tokens generated",
    }

    def __init__(self):
        self._lock = threading.Lock()
        self.values = {k: 0 for k in self.NAMES}

    def add(self, **kw: int) -> None:
        with self._lock:
            for k, v in kw.items():
                self.values[k] += int(v)

    def render(self) -> str:
        with self._lock:
            lines = []
            for k, help_ in self.NAMES.items():
                name = METRIC_PREFIX + k
                lines += [f"# HELP {name} {help_}", f"# TYPE {name} counter", f"{name} {self.values[k]}"]
            return "\n".join(lines) + "\n"


class Engine:
    """The model plus its LMCache engine; ``complete`` yields generated token ids one by one."""

    def __init__(self, model_config: dict[str, Any], lmcache_config: str | None, seed: int, threads: int | None,
                 model_name: str, instance_id: str, gpu_cache_tokens: int = 0, kv_tier: bool = True):
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        if threads:
            torch.set_num_threads(threads)
        self.torch = torch
        cfg = {k: v for k, v in model_config.items() if k not in ("architectures", "model_type", "torch_dtype")}
        self.config = LlamaConfig(**cfg)
        torch.manual_seed(seed)
        self.model = LlamaForCausalLM(self.config).eval()
        self.dtype = torch.float32
        self.model_name = model_name
        self.layers = self.config.num_hidden_layers
        self.kv_heads = self.config.num_key_value_heads
        self.head_dim = getattr(self.config, "head_dim", None) or self.config.hidden_size // self.config.num_attention_heads
        self.kv_bytes_per_token = self.layers * 2 * self.kv_heads * self.head_dim * 4
        self.lock = threading.Lock()
        self.counters = Counters()
        self.instance_id = instance_id
        self.lmc = None
        self.chunk_size = 256
        # The engine's own KV memory ("GPU memory" of a real engine): a bounded LRU prefix cache.
        self.gpu_cache = PrefixKVCache(gpu_cache_tokens) if gpu_cache_tokens > 0 else None
        if lmcache_config and kv_tier:
            self._init_lmcache(lmcache_config)

    def _init_lmcache(self, path: str) -> None:
        import torch
        from lmcache.v1.cache_engine import LMCacheEngineBuilder
        from lmcache.v1.config import LMCacheEngineConfig
        from lmcache.v1.metadata import LMCacheMetadata

        cfg = LMCacheEngineConfig.from_file(path)
        self.chunk_size = int(cfg.chunk_size)
        meta = LMCacheMetadata(
            model_name=self.model_name, world_size=1, local_world_size=1, worker_id=0, local_worker_id=0,
            kv_dtype=self.dtype, kv_shape=(self.layers, 2, self.chunk_size, self.kv_heads, self.head_dim),
            chunk_size=self.chunk_size)
        self.lmc = LMCacheEngineBuilder.get_or_create(
            self.instance_id, cfg, meta, make_cpu_connector(self.layers, self.kv_heads, self.head_dim),
            lambda t, r: None, lambda o, r: o)
        # The storage manager (and with it the fs:// pool) exists only after post_init.
        self.lmc.post_init()
        _log(f"LMCache engine up: chunk_size={self.chunk_size} remote_url={cfg.remote_url} "
             f"local_cpu={cfg.local_cpu} max_local_cpu_size={cfg.max_local_cpu_size}")

    def _ram_tokens(self, ids) -> int:
        """How many of the prompt's leading tokens LMCache holds in its RAM level (local_cpu), asked before the
        retrieve (which copies what it reads from the pool into that level). LMCache looks a prompt's chunks up
        backend by backend, RAM first, by prefix: the RAM level's share is the first tokens of the hit."""
        chunks = [(key, start, end) for start, end, key in self.lmc.token_database.process_tokens(tokens=ids)]
        mapping = self.lmc.storage_manager.get_block_mapping(chunks)
        return sum(end - start for _, start, end in mapping.get("LocalCPUBackend", []))

    def close(self) -> None:
        if self.lmc is not None:
            from lmcache.v1.cache_engine import LMCacheEngineBuilder
            LMCacheEngineBuilder.destroy(self.instance_id)
            self.lmc = None

    def _empty_kv(self, n: int):
        t = self.torch
        return ([t.zeros(1, self.kv_heads, n, self.head_dim, dtype=self.dtype) for _ in range(self.layers)],
                [t.zeros(1, self.kv_heads, n, self.head_dim, dtype=self.dtype) for _ in range(self.layers)])

    def _cache_from(self, keys, values, n: int):
        from transformers import DynamicCache
        cache = DynamicCache()
        for i in range(self.layers):
            cache.update(keys[i][:, :, :n].contiguous(), values[i][:, :, :n].contiguous(), i)
        return cache

    def complete(self, tokens: list[int], max_tokens: int, logprobs: int = 0):
        """Generator of (token id, logprobs or None); the first arrives after prefill (or read-back plus one step).
        With ``logprobs`` > 0 each token comes with :func:`token_logprobs` of its position (its log-probability and
        the ``logprobs`` most likely tokens'), as an OpenAI completions server reports them."""
        t = self.torch
        with self.lock, t.inference_mode():
            n = len(tokens)
            ids = t.tensor(tokens, dtype=t.long)
            hit = 0
            keys = values = None
            gpu_hit, gpu_kv = self.gpu_cache.match(tokens) if self.gpu_cache is not None else (0, None)
            gpu_hit = min(gpu_hit, n - 1)
            if self.lmc is not None:
                self.counters.add(external_query_tokens_total=n)
                # Like a real connector, the tier is asked only for what the engine's memory lacks.
                # (at most n - 1 tokens are reused: an exact repeat the engine holds is not asked for again)
                if self.gpu_cache is None or min(self.lmc.lookup(ids), n - 1) > gpu_hit:
                    in_ram = self._ram_tokens(ids)
                    keys, values = self._empty_kv(n)
                    mask = self.lmc.retrieve(ids, kvcaches=(keys, values), req_id=uuid.uuid4().hex)
                    hit = int(mask.sum().item())
                    self.counters.add(external_hit_tokens_total=hit, ram_hit_tokens_total=min(in_ram, hit),
                                      external_read_bytes_total=hit * self.kv_bytes_per_token)
            # At least the last prompt token is computed: its logits give the first output token.
            if min(hit, n - 1) > gpu_hit:
                reuse = min(hit, n - 1)
                cache = self._cache_from(keys, values, reuse)
            elif gpu_hit > 0:
                reuse = gpu_hit
                cache = self._cache_from(gpu_kv[0], gpu_kv[1], reuse)
                self.counters.add(gpu_hit_tokens_total=reuse)
            else:
                reuse, cache = 0, None
            out = self.model(input_ids=ids[reuse:].unsqueeze(0), past_key_values=cache, use_cache=True,
                             position_ids=t.arange(reuse, n).unsqueeze(0))
            cache = out.past_key_values
            self.counters.add(requests_total=1, prompt_tokens_total=n, prefill_tokens_total=n - reuse)
            full_k = [cache.layers[i].keys[:, :, :n] for i in range(self.layers)]
            full_v = [cache.layers[i].values[:, :, :n] for i in range(self.layers)]
            if self.lmc is not None and hit < n:
                skip = (hit // self.chunk_size) * self.chunk_size
                mask = None
                if skip:
                    mask = t.ones(n, dtype=t.bool)
                    mask[:skip] = False
                self.lmc.store(ids, mask=mask, kvcaches=(full_k, full_v), req_id=uuid.uuid4().hex)
                self.counters.add(external_stored_tokens_total=n - skip)
            if self.gpu_cache is not None:
                evicted = self.gpu_cache.put(tokens, [k.clone() for k in full_k], [v.clone() for v in full_v])
                self.counters.add(gpu_evicted_tokens_total=evicted)
            nxt = int(out.logits[0, -1].argmax().item())
            for step in range(max_tokens):
                self.counters.add(generation_tokens_total=1)
                yield nxt, (token_logprobs(t, out.logits[0, -1], nxt, logprobs) if logprobs > 0 else None)
                if step + 1 == max_tokens:
                    break
                out = self.model(input_ids=t.tensor([[nxt]]), past_key_values=cache, use_cache=True,
                                 position_ids=t.tensor([[n + step]]))
                cache = out.past_key_values
                nxt = int(out.logits[0, -1].argmax().item())


def token_logprobs(t, logits, chosen: int, k: int) -> tuple[float, dict[str, float]]:
    """The chosen token's log-probability and the ``k`` most likely tokens' (``token_id:N`` -> logprob, as vLLM
    names tokens with ``return_tokens_as_token_ids``), from one position's logits, in float32."""
    lp = t.log_softmax(logits.float(), dim=-1)
    values, ids = lp.topk(min(k, lp.shape[-1]))
    return float(lp[chosen].item()), {f"token_id:{int(i)}": float(v) for v, i in zip(values.tolist(), ids.tolist())}


def logprobs_object(tok: int, info: tuple[float, dict[str, float]] | None, offset: int) -> dict | None:
    """A completions choice's ``logprobs`` for one token (None when the request did not ask)."""
    if info is None:
        return None
    return {"tokens": [f"token_id:{tok}"], "token_logprobs": [info[0]], "top_logprobs": [info[1]],
            "text_offset": [offset]}


class PrefixKVCache:
    """A bounded in-memory KV prefix cache (the engine's "GPU memory"): entries are whole prompts with
    their per-layer KV; a lookup reuses the longest common prefix with any entry; least recently used
    entries are evicted when the total exceeds ``capacity_tokens``."""

    def __init__(self, capacity_tokens: int):
        self.capacity_tokens = capacity_tokens
        self.entries: dict[tuple[int, ...], tuple[list, list]] = {}  # insertion order = LRU order
        self.tokens = 0

    def match(self, tokens: list[int]) -> tuple[int, tuple[list, list] | None]:
        best, best_key = 0, None
        for key in self.entries:
            m = common_prefix_len(key, tokens)
            if m > best:
                best, best_key = m, key
        if best_key is None:
            return 0, None
        kv = self.entries.pop(best_key)
        self.entries[best_key] = kv  # most recently used
        return best, kv

    def put(self, tokens: list[int], keys: list, values: list) -> int:
        """Insert; returns the number of tokens evicted. A prompt larger than the cache is not kept."""
        key = tuple(tokens)
        if key in self.entries:
            self.tokens -= len(key)
            del self.entries[key]
        evicted = 0
        if len(key) > self.capacity_tokens:
            return 0
        while self.entries and self.tokens + len(key) > self.capacity_tokens:
            old = next(iter(self.entries))
            del self.entries[old]
            self.tokens -= len(old)
            evicted += len(old)
        self.entries[key] = (keys, values)
        self.tokens += len(key)
        return evicted


def common_prefix_len(a, b) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def make_cpu_connector(layers: int, kv_heads: int, head_dim: int):
    """An LMCache connector for CPU tensors: LMCache's [2, layers, tokens, heads*dim] memory objects
    <-> the model's per-layer [1, heads, tokens, dim] key and value tensors (``kvcaches=(keys, values)``)."""
    import torch
    from lmcache.v1.gpu_connector.gpu_connectors import GPUConnectorInterface

    class CPUKVConnector(GPUConnectorInterface):
        def from_gpu(self, memory_obj, start, end, **kwargs):
            keys, values = kwargs["kvcaches"]
            dst = memory_obj.tensor
            for i in range(layers):
                for j, src in enumerate((keys[i], values[i])):
                    dst[j, i].copy_(src[0, :, start:end, :].transpose(0, 1).reshape(end - start, kv_heads * head_dim))

        def to_gpu(self, memory_obj, start, end, **kwargs):
            keys, values = kwargs["kvcaches"]
            src = memory_obj.tensor
            for i in range(layers):
                for j, dst in enumerate((keys[i], values[i])):
                    dst[0, :, start:end, :].copy_(src[j, i].reshape(end - start, kv_heads, head_dim).transpose(0, 1))

        def batched_from_gpu(self, memory_objs, starts, ends, **kwargs):
            for m, s, e in zip(memory_objs, starts, ends):
                self.from_gpu(m, s, e, **kwargs)

        def batched_to_gpu(self, memory_objs, starts, ends, **kwargs):
            for m, s, e in zip(memory_objs, starts, ends):
                self.to_gpu(m, s, e, **kwargs)

        def get_shape(self, num_tokens):
            return torch.Size([layers, 2, num_tokens, kv_heads, head_dim])

        def initialize_kvcaches_ptr(self, **kwargs):
            pass

    return CPUKVConnector()


def prompt_ids(prompt: Any, vocab_size: int) -> list[int]:
    """Token ids from an OpenAI ``prompt``: a list of ids, or text mapped byte by byte."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (list, str)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = list(prompt.encode())
    elif isinstance(prompt, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in prompt):
        ids = prompt
    else:
        raise ValueError("prompt must be a string or a list of token ids")
    if not ids:
        raise ValueError("prompt is empty")
    bad = [x for x in ids if not 0 <= x < vocab_size]
    if bad:
        raise ValueError(f"token id {bad[0]} outside the vocabulary (size {vocab_size})")
    return ids


def _completion_params(raw: bytes, vocab_size: int) -> tuple[dict, list[int], int, int]:
    """A completion request's body, prompt ids, max_tokens and logprobs; ValueError (or TypeError) if invalid."""
    body = json.loads(raw or b"{}")
    ids = prompt_ids(body.get("prompt"), vocab_size)
    max_tokens = int(body.get("max_tokens", 16))
    if max_tokens < 1:
        raise ValueError("max_tokens must be >= 1")
    logprobs = int(body.get("logprobs") or 0)
    if not 0 <= logprobs <= 20:
        raise ValueError("logprobs must be 0 to 20")
    return body, ids, max_tokens, logprobs


def _respond_whole(handler, gen, ids: list[int], event) -> None:
    """Answer a non-streaming completion: every token in one JSON response with its usage, or a 500."""
    try:
        out = [f" t{tok}" for tok, _ in gen]
    except Exception as exc:  # noqa: BLE001 - reported to the client, logged here
        _log("request failed: " + traceback.format_exc())
        return handler._error(500, f"{type(exc).__name__}: {exc}")
    resp = event("".join(out), "length")
    resp["usage"] = {"prompt_tokens": len(ids), "completion_tokens": len(out),
                     "total_tokens": len(ids) + len(out)}
    return handler._send(200, json.dumps(resp).encode())


def _respond_stream(handler, gen, max_tokens: int, event) -> None:
    """Answer a streaming completion: one server-sent event per token (chunked), an error event, then [DONE]."""
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    try:
        offset = 0
        for i, (tok, info) in enumerate(gen):
            finish = "length" if i + 1 == max_tokens else None
            text = f" t{tok}"
            lp = logprobs_object(tok, info, offset)
            offset += len(text)
            handler._chunk(b"data: " + json.dumps(event(text, finish, lp)).encode() + b"\n\n")
    except (BrokenPipeError, ConnectionResetError):
        return
    except Exception as exc:  # noqa: BLE001 - the stream carries the error to the client
        _log("request failed: " + traceback.format_exc())
        handler._chunk(b"data: " + json.dumps({"error": {"message": f"{type(exc).__name__}: {exc}",
                                                         "code": 500}}).encode() + b"\n\n")
    handler._chunk(b"data: [DONE]\n\n")
    handler._chunk(b"")


def make_handler(engine: Engine):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = ENGINE_NAME

        def log_message(self, fmt, *args):
            _log("http " + (fmt % args))

        def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _error(self, code: int, msg: str) -> None:
            self._send(code, json.dumps({"error": {"message": msg, "code": code}}).encode())

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def do_GET(self):
            if self.path == "/health":
                self._send(200, b"{}")
            elif self.path == "/metrics":
                self._send(200, engine.counters.render().encode(), "text/plain; version=0.0.4")
            elif self.path == "/v1/models":
                self._send(200, json.dumps({"object": "list", "data": [
                    {"id": engine.model_name, "object": "model", "owned_by": ENGINE_NAME}]}).encode())
            else:
                self._error(404, f"no route {self.path}")

        def do_POST(self):
            if self.path != "/v1/completions":
                return self._error(404, f"no route {self.path}")
            try:
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                body, ids, max_tokens, logprobs = _completion_params(raw, engine.config.vocab_size)
            except (ValueError, TypeError, json.JSONDecodeError) as exc:
                return self._error(400, str(exc))
            cid = f"cmpl-{uuid.uuid4().hex[:16]}"
            created = int(time.time())
            model = body.get("model") or engine.model_name

            def event(text: str, finish: str | None, lp: dict | None = None) -> dict:
                return {"id": cid, "object": "text_completion", "created": created, "model": model,
                        "choices": [{"index": 0, "text": text, "logprobs": lp, "finish_reason": finish}]}

            gen = engine.complete(ids, max_tokens, logprobs)
            if not body.get("stream"):
                return _respond_whole(self, gen, ids, event)
            _respond_stream(self, gen, max_tokens, event)

    return Handler


def _kvgate():
    """kvgate's hardened readers and LMCache check, or None when this file runs by itself on a node."""
    try:
        from .. import errors, safeio
        from . import lmcache
    except ImportError:
        return None
    return errors, safeio, lmcache


def load_model_config(path: str | None) -> dict[str, Any]:
    """The model's config.json (hardened reader: size cap, UTF-8, nesting limit); InputFileError if unusable.
    As a lone file on a node: plain JSON (kvgate wrote the file)."""
    if path is None:
        return dict(DEFAULT_MODEL_CONFIG)
    kv = _kvgate()
    if kv is None:
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a JSON object (a HF config.json)")
        return data
    safeio = kv[1]
    data = safeio.load_json(path, max_bytes=safeio.MAX_CONFIG_BYTES, what="model config", follow_symlinks=True)
    if not isinstance(data, dict):
        raise safeio.InputFileError(path, 1, "expected a JSON object (a HF config.json)")
    return data


def check_inputs(args) -> list[str]:
    """One line per problem in the files the engine is given, before torch or LMCache sees them (LMCache
    reads its YAML with no limits, so a bad file would otherwise hang it or end in a traceback). Nothing to
    check as a lone file on a node: kvgate wrote both files and checked them before the launch."""
    kv = _kvgate()
    if kv is None:
        return []
    errors, safeio, lmcache = kv
    problems: list[str] = []
    try:
        load_model_config(args.model_config)
    except safeio.InputFileError as exc:
        problems.append(str(exc))
    if args.lmcache_config and not args.no_kv_tier:
        try:
            lmcache.check_lmcache_file(args.lmcache_config, LMCACHE_VERSION)
        except errors.ConfigError as exc:
            problems.extend(str(i) for i in exc.issues)
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m harness.engines.cpu_reference", description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model-config", help="HF-style config.json of a Llama-architecture model (default: built-in small)")
    ap.add_argument("--model-name", default="kvgate-cpu-reference")
    ap.add_argument("--lmcache-config", help="LMCache YAML; without it no KV pool is used (pure re-compute)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--gpu-cache-tokens", type=int, default=0,
                    help="capacity of the in-memory LRU prefix cache, in tokens (0: none, every prompt is new)")
    ap.add_argument("--no-kv-tier", action="store_true",
                    help="do not use LMCache even when --lmcache-config is given (the without-tier baseline)")
    args = ap.parse_args(argv)

    if not args.host.startswith("127."):
        # The reference engine has no authentication: loopback only.
        print(f"{ENGINE_NAME}: --host must be a loopback address (127.0.0.0/8), got {args.host}", file=sys.stderr)
        return 2
    problems = check_inputs(args)
    if problems:
        for line in problems:
            print(f"{ENGINE_NAME}: {line}", file=sys.stderr)
        return 2
    os.environ.setdefault("PYTHONHASHSEED", "0")
    if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        d = Path(os.environ.get("TMPDIR", "/tmp")) / f"kvgate-cpu-ref-prom-{os.getpid()}"
        d.mkdir(parents=True, exist_ok=True)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(d)
    t0 = time.perf_counter()
    engine = Engine(load_model_config(args.model_config), args.lmcache_config, args.seed, args.threads,
                    args.model_name, f"kvgate-cpu-ref-{os.getpid()}", gpu_cache_tokens=args.gpu_cache_tokens,
                    kv_tier=not args.no_kv_tier)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(engine))
    server.daemon_threads = True

    def stop(signum, frame):
        _log(f"signal {signum}: closing LMCache and exiting")
        try:
            engine.close()
        finally:
            # LMCache leaves non-daemon threads behind; exit without waiting for them.
            os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    _log(f"ready on http://{args.host}:{args.port} after {time.perf_counter() - t0:.1f} s "
         f"(kv_bytes_per_token={engine.kv_bytes_per_token}, gpu_cache_tokens={args.gpu_cache_tokens}, "
         f"kv_tier={engine.lmc is not None})")
    server.serve_forever()
    return 0


if __name__ == "__main__":
    try:
        rc = main()
    except BaseException:  # noqa: BLE001 - a crash at start must leave its traceback in the log
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    os._exit(rc)
