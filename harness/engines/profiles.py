"""Engine profiles (data in ``workloads/engines/*.yaml``): how to launch an engine on a node.

A profile says how to launch an engine (argv and environment templates, and the node program it runs, if
kvgate ships one), where its health and metrics endpoints are, which metrics prove hits from the KV tier,
and which LMCache version its LMCache YAML was written for. Everything here is pure: loading and checking
profiles, filling their templates, building ``vllm serve`` argv.
"""

from __future__ import annotations

import json
import re
import shlex
import string
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from ..config.models import check_secret_env
from ..config.yamlload import load_yaml, validate
from ..errors import ConfigError, ConfigIssue
from ..paths import data_path
from ..redact import add_secret_value, is_secret_name, redact_argv, redact_env
from .client import ApiShape
from .lmcache import LMCacheSettings, check_lmcache_config, lmcache_config, render_template


# ------------------------------------------------------------------------------------------ profiles


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class JsonArg(_Strict):
    """A structured argv value (``{json: ...}`` in a profile): the JSON is data whose string leaves are
    templates, filled one by one and serialized with ``json.dumps``, so a filled value (a pool directory with a
    ``"`` in it) stays one string of the engine's configuration and never becomes configuration of its own."""

    json_: Any = Field(alias="json")

    def render(self, values: dict[str, Any], where: str) -> str:
        def fill(v: Any, at: str) -> Any:
            if isinstance(v, str):
                return render_template(v, values, at)
            if isinstance(v, dict):
                return {k: fill(x, f"{at}.{k}") for k, x in v.items()}
            if isinstance(v, list):
                return [fill(x, f"{at}[{i}]") for i, x in enumerate(v)]
            return v
        return json.dumps(fill(self.json_, where), separators=(",", ":"))


def _placeholder_in_json_text(template: str) -> str | None:
    """Why a text template may not be filled: a placeholder inside text that is JSON (starts with an escaped
    ``{{`` or ``[``, or quotes around it), where a value with a quote would inject keys; None when fine."""
    fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None and f != ""]
    if not fields:
        return None
    literal = "".join(text for text, _, _, _ in string.Formatter().parse(template))
    if template.lstrip().startswith(("{{", "[")) or '"' in literal:
        return (f"placeholder inside JSON text ({{{fields[0]}}} in {template!r}): a value with a quote would "
                "inject into it; write the value as data, {json: ...}")
    return None


def _text_template(v: str) -> str:
    why = _placeholder_in_json_text(v)
    if why:
        raise ValueError(why)
    return v


TextTemplate = Annotated[str, AfterValidator(_text_template)]


class HitMetrics(_Strict):
    """Prometheus counters whose deltas over the read-back phase give the hit rate and bytes read; for
    g2-load's token accounting also the prompt tokens and the hits from the engine's own memory (its prefix
    cache), so prompt tokens = engine-memory hits + tier hits (``hit_tokens``) + recomputed."""

    hit_tokens: list[str]
    query_tokens: list[str]
    read_bytes: list[str] = Field(default_factory=list)
    memory_hit_tokens: list[str] = Field(default_factory=list)
    prompt_tokens: list[str] = Field(default_factory=list)


class HitLog(_Strict):
    """Engine-log lines that prove read-back hits: a regular expression searched per line (ANSI colours
    removed). With a named group ``hit_tokens`` each line adds that many hit tokens (and ``query_tokens``, if
    the pattern has it, the tokens looked up; otherwise the read-back prompts' tokens are the lookups);
    without it each matching line is one request served from the tier."""

    pattern: str

    @field_validator("pattern")
    @classmethod
    def _regex(cls, v: str) -> str:
        try:
            rx = re.compile(v)
        except re.error as exc:
            raise ValueError(f"hit_log pattern {v!r} is not a valid regular expression: {exc}") from None
        unknown = set(rx.groupindex) - {"hit_tokens", "query_tokens"}
        if unknown:
            raise ValueError(f"hit_log pattern {v!r}: named groups may be hit_tokens and query_tokens, "
                             f"not {', '.join(sorted(unknown))}")
        if "query_tokens" in rx.groupindex and "hit_tokens" not in rx.groupindex:
            raise ValueError(f"hit_log pattern {v!r}: a query_tokens group needs a hit_tokens group")
        return v


class ApiSettings(_Strict):
    """How G2 talks to the engine: the OpenAI-compatible completions or chat-completions API, streamed as
    server-sent events (``data: {...}`` lines, ``data: [DONE]`` at the end unless ``require_done`` is off).
    ``prompt_format`` says what its prompts may be: token-id lists or text (vLLM, SGLang), or text only
    (llama.cpp's and llama-cpp-python's servers, most hosted APIs; a chat API always): workloads then send text
    built with the model's tokenizer (harness/engines/prompts.py), never token ids."""

    kind: Literal["completions", "chat"] = "completions"
    prompt_format: Literal["token_ids_or_text", "text"] = "token_ids_or_text"
    path: str | None = None  # default /v1/completions or /v1/chat/completions
    stream_format: Literal["openai-sse"] = "openai-sse"
    require_done: bool = True
    ignore_eos: bool = True  # sent as "ignore_eos": vLLM and SGLang honour it; switch off for strict servers
    extra_body: dict[str, Any] = Field(default_factory=dict)  # merged into every request body

    @field_validator("path")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError(f"api path {v!r} must start with '/'")
        return v

    def shape(self) -> ApiShape:
        return ApiShape(kind=self.kind, ignore_eos=self.ignore_eos, require_done=self.require_done,
                        extra_body=dict(self.extra_body))

    @property
    def text_only(self) -> bool:
        """Prompts must be text: the profile says so, or it speaks chat (a user message is text)."""
        return self.kind == "chat" or self.prompt_format == "text"

    @property
    def request_path(self) -> str:
        return self.path or ("/v1/chat/completions" if self.kind == "chat" else "/v1/completions")


class Preflight(_Strict):
    """What the engine's interpreter must manage before kvgate launches the engine with it
    (harness/engines/preflight.py): import these modules; for vLLM, detect a device to run on."""
    modules: list[str] = Field(default_factory=list)
    vllm_device: bool = False

    @field_validator("modules")
    @classmethod
    def _modules(cls, v: list[str]) -> list[str]:
        for m in v:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", m):
                raise ValueError(f"preflight module {m!r} is not a Python module name")
        return v


class TenantKey(_Strict):
    """How a request names its tenant to the engine (g2-tenancy): the request-body field that keys the engine's
    KV by tenant, e.g. vLLM's ``cache_salt`` (its prefix cache salted with it); the gate sends each tenant's
    requests with a different value of it."""

    field: str

    @field_validator("field")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
            raise ValueError(f"tenant_key field {v!r} is not a request-body field name")
        return v


class Capabilities(_Strict):
    """What an engine can do that a workload relies on, declared by its profile (workloads never look at an
    engine's name)."""

    token_ids_only: bool = False        # takes prompts as token-id lists only (no tokenizer): G2 sends ids
    kv_dtype: Literal["float32", "float16", "bfloat16", "fp8"] | None = None  # KV kept in this dtype, whatever
                                        # the model config says (KV bytes per token are computed with it)
    builds_model: bool = False          # builds its model from the config kvgate stages ({model_config}; kvgate's
                                        # default config when the gate gives none): no model files needed
    engine_cache_flag: str | None = None  # argv flag taking a token count: caps its engine-memory KV (g2-gain)
    engine_cache_block_tokens: int | None = Field(default=None, ge=1)  # the flag counts KV blocks of this many
                                        # tokens instead (vLLM's --num-gpu-blocks-override)
    no_tier_flag: str | None = None     # argv flag: the same engine without the KV tier (g2-gain no-tier arm)
    # the tier switch as the profile launches it: argv flags (each with the value after it) and environment
    # names that turn the KV tier on; g2-gain's arm without the tier may lack exactly these, nothing else
    tier_flags: list[str] = Field(default_factory=list)
    tier_env: list[str] = Field(default_factory=list)
    level_counters: str | None = None   # prefix of its per-level token counters (prompt, prefill, gpu hit, gpu
                                        # evicted, external hit, ...: g2-gain's accounting)


class EngineProfile(_Strict):
    name: str
    description: str
    # openai: any OpenAI-compatible server (SGLang, TensorRT-LLM, llama.cpp, Dynamo, a vendor's fork ...):
    # kvgate knows only what the profile says about it
    engine: Literal["vllm", "dynamo-vllm", "sglang", "cpu-reference", "openai"]
    engine_version: str | None = None
    # The launch command; empty: kvgate never launches this engine, a gate attaches to it (G2 ``attach:``)
    # an element is a template string, or ``{json: ...}``: a structured value built as data (JsonArg)
    argv: list[TextTemplate | JsonArg] = Field(default_factory=list)
    env: dict[str, TextTemplate] = Field(default_factory=dict)
    # Names in env whose values are secrets, on top of the default patterns (TOKEN, KEY, PASSWORD, SECRET ...):
    # passed to the node through the transport's environment (never its command line) and redacted in
    # everything kvgate writes (harness.redact)
    secret_env: list[str] = Field(default_factory=list)
    health_path: str = "/health"
    metrics_path: str = "/metrics"
    ready_timeout_s: float = Field(default=600.0, gt=0)
    api: ApiSettings = Field(default_factory=ApiSettings)
    # How read-back hits are proven; any of: Prometheus counters, engine-log lines, the pool device's read
    # bytes (device_reads). A profile that can prove neither hits nor cold reads is refused.
    hit_metrics: HitMetrics | None = None
    hit_log: HitLog | None = None
    # The pool's block device must be read during read-back (its /sys/class/block/DEV/stat), covering
    # min_read_fraction of the KV the hits claim: proves the read-back was cold and from the tier.
    device_reads: bool = True
    lmcache: LMCacheSettings | None = None
    # A program of harness/engines/ (e.g. cpu_reference.py) that kvgate puts into the run directory on the node
    # before the launch; the argv names it as {program} (the engine then needs its own packages, not kvgate).
    program: str | None = None
    tokenizer: str | None = None  # local tokenizer.json (or its directory): G2 then sends text prompts
    # Engine-log lines (regular expressions) that mean the KV tier silently did nothing, on top of the
    # built-in LMCache / vLLM ones (harness/parsers/engine_log.py): a match makes G2 INVALID, quoted.
    fallback_patterns: list[str] = Field(default_factory=list)
    # The files the connector writes into the pool per stored chunk (LMCache's fs connector: finished
    # ``*.data``; vLLM's ExampleConnector: ``*.safetensors``), and the tokens it stores per whole block
    # (None: every prompt token; a connector storing whole blocks only leaves the partial last one out).
    pool_files: str = "*.data"
    # How the connector's read-backs reach the pool's device rather than the node's memory (harness/workloads/
    # pool.py): ``evict`` (kvgate drops each pool file's pages as a store lands and after each read: a connector
    # that reads through the page cache, such as vLLM's ExampleConnector), ``odirect`` (the connector itself reads
    # and writes with O_DIRECT; ``in_force_log`` proves it), ``none`` (nothing declared: the device proof alone).
    cold_regime: Literal["none", "evict", "odirect"] = "none"
    # Engine-log lines (regular expressions) that must appear once the engine is up: the cold regime (or the
    # tier) is really in force. A log without one of them makes the gate INVALID, naming the line.
    in_force_log: list[str] = Field(default_factory=list)
    kv_block_tokens: int | None = Field(default=None, ge=1)
    # The request-body field that names a request's tenant (vLLM: cache_salt); None: the engine has none, and
    # g2-tenancy refuses the profile at validation
    tenant_key: TenantKey | None = None
    notes: str = ""
    # Checked with the engine's interpreter before a launch: a node that cannot run the engine fails at once
    # with one line naming the engine_python to set, not 60 lines into the engine's log.
    preflight: Preflight | None = None
    capabilities: Capabilities = Field(default_factory=Capabilities)

    @field_validator("fallback_patterns", "in_force_log")
    @classmethod
    def _regexes(cls, v: list[str], info: ValidationInfo) -> list[str]:
        what = "fallback pattern" if info.field_name == "fallback_patterns" else "in_force_log pattern"
        for pat in v:
            try:
                re.compile(pat)
            except re.error as exc:
                raise ValueError(f"{what} {pat!r} is not a valid regular expression: {exc}") from None
        return v

    @model_validator(mode="after")
    def _prompts_possible(self) -> "EngineProfile":
        if self.capabilities.token_ids_only and self.api.text_only:
            raise ValueError("capabilities.token_ids_only and an API that takes text only (api.prompt_format text, "
                             "or kind chat): no prompt could be sent")
        return self

    @model_validator(mode="after")
    def _odirect_proven(self) -> "EngineProfile":
        if self.cold_regime == "odirect" and not self.in_force_log:
            raise ValueError("cold_regime odirect needs in_force_log: the engine-log line that shows O_DIRECT in "
                             "force (a silent fall-back to buffered I/O would otherwise pass)")
        return self

    @field_validator("pool_files")
    @classmethod
    def _glob(cls, v: str) -> str:
        if not v or "/" in v:
            raise ValueError(f"pool_files {v!r}: a file-name pattern such as '*.data' (no '/')")
        return v

    @field_validator("secret_env")
    @classmethod
    def _secret_env(cls, v: list[str], info: ValidationInfo) -> list[str]:
        env = info.data.get("env") or {}  # declared before secret_env, so validated by now
        unknown = [n for n in v if n not in env]
        if unknown:
            raise ValueError(f"{', '.join(unknown)} not in env (env has: {', '.join(env) or 'nothing'})")
        return check_secret_env(v)

    @model_validator(mode="after")
    def _secrets(self) -> "EngineProfile":
        for k, v in self.env.items():
            if is_secret_name(k) and "{" not in v:  # a literal secret: known to every writer from now on
                add_secret_value(v)
        return self

    @model_validator(mode="after")
    def _provable(self) -> "EngineProfile":
        if self.hit_metrics is None and self.hit_log is None and not self.device_reads:
            raise ValueError("the profile can prove neither hits (hit_metrics, hit_log) nor cold reads "
                             "(device_reads): G2 through it could never be valid")
        return self

    @property
    def launches(self) -> bool:
        """Whether kvgate can start this engine itself (a profile without argv is attached to)."""
        return bool(self.argv)

    def render_argv(self, values: dict[str, Any]) -> list[str]:
        """The launch argv with ``{placeholders}`` filled; a missing value is an error, not ''."""
        return [a.render(values, f"{self.name}: argv[{i}]") if isinstance(a, JsonArg)
                else render_template(a, values, f"{self.name}: argv") for i, a in enumerate(self.argv)]

    def render_env(self, values: dict[str, Any]) -> dict[str, str]:
        """The environment with ``{placeholders}`` filled; its secret values are registered for redaction."""
        env = {k: render_template(v, values, f"{self.name}: env.{k}") for k, v in self.env.items()}
        redact_env(env)  # registers the secret values (the result, redacted, is not what the engine gets)
        return env


class _SamplePaths(dict):
    def __contains__(self, key):
        return True

    def __missing__(self, key):
        return "/kvgate-sample"


def program_file(name: str) -> Path:
    """The file of an engine program a profile names (``program:``), to put on a node."""
    path = Path(__file__).resolve().parent / name
    if path.suffix != ".py" or path.parent != Path(__file__).resolve().parent or not path.is_file():
        raise ValueError(f"no engine program {name!r} in harness/engines/")
    return path


def list_profiles(directory: Path | None = None) -> list[str]:
    directory = directory or data_path("workloads", "engines")
    return sorted(p.stem for p in directory.glob("*.yaml"))


def load_profile(name_or_path: str | Path, directory: Path | None = None) -> EngineProfile:
    """Load and validate a profile by name (``workloads/engines/<name>.yaml``) or path; ConfigError names
    the file, line and field; the profile's LMCache block is checked against its pinned LMCache version."""
    directory = directory or data_path("workloads", "engines")
    p = Path(name_or_path)
    if not p.suffix:
        p = directory / f"{name_or_path}.yaml"
    if not p.exists() and not p.is_symlink():  # a symlink loop is reported by load_yaml, as such
        raise ConfigError(ConfigIssue(str(p), None, "", f"no engine profile {str(name_or_path)!r} "
                                      f"(known: {', '.join(list_profiles(directory)) or 'none'})"))
    data, index = load_yaml(p)
    prof = validate(EngineProfile, data, index)
    if prof.lmcache is not None:
        # Placeholders are filled at run time; check the keys and types with a sample path in each.
        issues = check_lmcache_config(lmcache_config(prof.lmcache, _SamplePaths()), prof.lmcache.version)
        if issues:
            raise ConfigError([index.issue(("lmcache", "config") + tuple(path), msg) for path, msg in issues])
    return prof


# --------------------------------------------------------------------------------------------- vLLM


def kv_transfer_config(connector: str = "LMCacheConnectorV1", role: str = "kv_both",
                       module_path: str | None = None) -> str:
    d: dict[str, Any] = {"kv_connector": connector, "kv_role": role}
    if module_path:
        d["kv_connector_module_path"] = module_path
    return json.dumps(d, separators=(",", ":"))


def vllm_serve_argv(model: str, host: str, port: int, *, kv_connector: str | None = "LMCacheConnectorV1",
                    kv_connector_module_path: str | None = None, max_model_len: int | None = None,
                    tensor_parallel_size: int = 1, gpu_memory_utilization: float | None = None,
                    prefix_caching: bool = False, served_model_name: str | None = None,
                    extra: list[str] | None = None) -> list[str]:
    """``vllm serve`` argv for G2: GPU prefix caching off (so hits come from the connector's tier)."""
    argv = ["vllm", "serve", model, "--host", host, "--port", str(port),
            "--tensor-parallel-size", str(tensor_parallel_size)]
    if max_model_len:
        argv += ["--max-model-len", str(max_model_len)]
    if gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", str(gpu_memory_utilization)]
    argv.append("--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching")
    if served_model_name:
        argv += ["--served-model-name", served_model_name]
    if kv_connector:
        argv += ["--kv-transfer-config", kv_transfer_config(kv_connector, module_path=kv_connector_module_path)]
    return argv + list(extra or [])


def shell_line(argv: list[str], env: dict[str, str] | None = None) -> str:
    """A copy-pasteable command line for logs and plans, secrets redacted (harness.redact)."""
    pre = " ".join(f"{k}={shlex.quote(v)}" for k, v in redact_env(env).items())
    return (pre + " " if pre else "") + shlex.join(redact_argv(argv))
