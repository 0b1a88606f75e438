"""G1 as the reference measured it: per-GPU cold read through the KV connector (LMCache), next to fio.

On every node of the gate, on the gate's target (a directory holds the pool; a file target's pool sits beside
the file, on the same filesystem):

1. Layout: the node's engine interpreter runs kvgate's reader (harness/node/kv_reader.py), which stores
   seeded random KV through LMCache's own storage backend (the fs:// pool, or local_disk), with the chunk size
   and serde of the gate's engine profile, sized from the model's KV bytes per token
   (``harness.engines.kv``). An intact earlier layout with the same identity is reused.
2. Cold: ``sync`` and drop the page cache (recorded whether permitted).
3. Read: fresh reader processes, one per GPU (pinned to its NUMA node's CPUs) or per declared read stream,
   released together, retrieve every chunk of their prompts through ``LMCacheEngine.retrieve`` with the
   parallel-read settings of LMCache 0.5.6 (below) into GPU memory, or CPU memory without GPUs. Every chunk
   read back is hashed and compared with what was stored. The pool device's ``/sys/dev/block/MAJ:MIN/stat``
   is read just before the common start and after the last read.
4. fio: fio reads the same chunk files, each stream its own, once, with O_DIRECT, pinned like the readers: the
   device's figure for the same bytes. The page cache is not dropped again first: O_DIRECT reads never come from
   it, and the pool device's read counters around fio prove every byte came from the device. (Dropping it there
   cost the measurement: on the qemu loopback it dropped the ~1 GB the engine interpreter's imports had cached over
   virtio-9p, and the guest's kernel then spent over 10 s of a vCPU on it while fio read: 2.29-6.66x the
   connector's time per byte against 0.75 over 12 rounds without it; docs/kv-read.md.)

Metrics: ``connector_read_gb_s`` (min over GPUs / streams, the gate metric; mean and each stream in the
evidence), ``fio_read_gb_s`` (same streams, min) and ``connector_efficiency`` = connector ÷ fio (both min).
A chunk read back different from what was stored, or not retrieved at all, is FAIL naming its key; a node
whose pool device read fewer bytes than the KV retrieved is INVALID (the KV came from a cache).

LMCache 0.5.6's parallel reads (lmcache/v1/storage_backend): the fs:// pool goes through
``RemoteBackend.batched_get_blocking``, which puts every chunk get of one retrieve in flight at once on
LMCache's event loop (each file read in the loop's thread pool; O_DIRECT only with
``fs_connector_use_odirect`` *and* ``save_chunk_meta: false``, as the 28-byte chunk header is unaligned);
local_disk goes through ``LocalDiskBackend.batched_get_blocking``, a read thread pool of ``disk_io_threads``
(default 4; ``use_odirect`` for aligned chunks). So a retrieve of ``chunks_per_retrieve`` chunks is the
connector's queue depth, and the LMCache YAML (the profile's, with the gate's ``lmcache:`` overrides) holds
the rest.
"""

from __future__ import annotations

import hashlib
import json
import math
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..errors import HarnessError
from ..engines import ArchError, ModelArch, arch_from_config, check_lmcache_config, lmcache_config, load_profile
from ..engines.profiles import EngineProfile
from ..endurance import DriveRating, combined, endurance
from ..errors import ConfigError, WorkloadError
from ..execute.fanout import fan_out
from ..node import program_path
from ..parsers.fio import FioRun, parse_fio_json
from ..parsers.kvread import ChunkFile, Layout, ReadRun, parse_drop_caches, parse_layout, parse_read, split_documents
from ..parsers.pooldev import parse_pool_blockstat, pool_blockstat_argv, read_bytes_between, write_bytes_between
from ..parsers.smart import SmartLog, parse_smart_log, smart_device, smart_log_argv, smart_writes
from ..paths import data_path
from ..safeio import MAX_CONFIG_BYTES, MAX_JSON_BYTES, InputFileError, load_json, read_text as read_file
from ..units import format_quantity, parse_size_bytes
from .kit.base import (DROP_CACHES_ARGV, Evidence, GateContext, PlannedStep, StreamRow, StreamsEvidence, StrictModel,
                   ValidityCheck, Workload, WorkloadResult, drive_rating, drop_caches, pool_drive_of, register_workload,
                   target_path, write_summary, write_gate_file)
from .kit.engine import node_engine_python
from .kit.probes import check_fio_groups, fio_json, fio_stream_rows, numa_cpulists, numa_step, pins_numa

# The reader's environment: one hash seed for every process (LMCache's builtin chunk hash), no telemetry.
READER_ENV = {"PYTHONHASHSEED": "0", "LMCACHE_TRACK_USAGE": "false", "LMCACHE_LOG_LEVEL": "WARNING"}
GIB = 1 << 30
MAX_LISTED = 50  # mismatching / missing chunks kept in the evidence per node (all are counted)


class FioSettings(StrictModel):
    """The fio pass over the chunk files (one job per stream, each file once)."""

    ioengine: Literal["io_uring", "libaio", "psync"] = "io_uring"
    bs_bytes: int = Field(default=1 << 20, alias="bs")
    iodepth: int = Field(default=32, ge=1, le=4096)

    @field_validator("bs_bytes", mode="before")
    @classmethod
    def _bs(cls, v: Any) -> int:
        return parse_size_bytes(v, multiple_of=4096, what="block size")


class KvReadParams(StrictModel):
    target: str
    engine: str = "vllm-lmcache"  # the profile whose LMCache YAML (chunk size, serde, version) is used
    backend: Literal["fs", "local_disk"] = "fs"
    model: str = "llama-3-8b"  # workloads/models/<name>.json, or a path to a config.json
    model_config_inline: dict[str, Any] | None = None
    kv_dtype: str | None = None  # the KV cache dtype when it differs from the model's (e.g. fp8)
    kv_size_bytes: int = Field(default=1 << 30, alias="kv_size")  # per node, split over its streams
    chunks_per_retrieve: int = Field(default=8, ge=1, le=4096)
    lmcache: dict[str, Any] = Field(default_factory=dict)  # merged over the profile's LMCache config
    pool_subdir: str = "kvgate-kv-read"
    seed: int = Field(default=0, ge=0, le=2**31)
    drop_caches: bool = True
    fadvise_dontneed: bool = True
    pin_numa: bool = True
    destination: Literal["auto", "gpu", "cpu"] = "auto"
    fio: FioSettings = Field(default_factory=FioSettings)
    python: str | None = None  # the engine's interpreter; default: the node's engine_python, else kvgate's
    layout_timeout_s: float = Field(default=3600.0, gt=0)
    read_timeout_s: float = Field(default=3600.0, gt=0)
    # one engine interpreter for the layout, the page-cache drop and the readers (forked from it), for stacks
    # whose imports are the slow part (minutes under qemu TCG); default: a fresh interpreter per phase
    import_once: bool = False
    # false: vLLM is made unimportable in the reader (LMCache imports ~2,000 of vLLM's modules only for NONE_HASH, the
    # seed of its chunk-hash chain; without vLLM it seeds with 0 and hashes with the same builtin hash): the chunk keys
    # differ, the read path does not. For stacks whose imports are the slow part (qemu TCG)
    import_vllm: bool = True
    # top-level modules the reader replaces, before LMCache is imported, by a stand-in that imports the real one at
    # its first use (kv_reader.py's DeferredModule): LMCache 0.5.6 imports transformers at its top (with it
    # torch.distributed, torch._dynamo, sympy: over half of the reader's import) for a token database the reader
    # never builds. What LMCache runs is unchanged; the evidence says whether each stayed unused
    defer_imports: list[str] = []

    @field_validator("defer_imports")
    @classmethod
    def _deferred(cls, v: list[str]) -> list[str]:
        bad = [n for n in v if not n.isidentifier()]
        if bad:
            raise ValueError(f"expected top-level module names, got {bad[0]!r}")
        return v

    @field_validator("kv_size_bytes", mode="before")
    @classmethod
    def _size(cls, v: Any) -> int:
        return parse_size_bytes(v, what="kv_size")

    @field_validator("pool_subdir")
    @classmethod
    def _subdir(cls, v: str) -> str:
        if not v or v.startswith(("/", ".")) or any(c in v for c in "/:;\n\x00"):
            raise ValueError(f"expected one directory name (letters, digits, - _), got {v!r}")
        return v


# ------------------------------------------------------------------------------------------ pure parts


def model_config(p: KvReadParams) -> tuple[str, dict[str, Any]]:
    """(name, config.json mapping) of the gate's model; InputFileError when the file cannot be read."""
    if p.model_config_inline is not None:
        return p.model, dict(p.model_config_inline)
    path = Path(p.model) if ("/" in p.model or p.model.endswith(".json")) else data_path("workloads", "models",
                                                                                      f"{p.model}.json")
    data = load_json(path, max_bytes=MAX_CONFIG_BYTES, what="model config", follow_symlinks=True)
    if not isinstance(data, dict):
        raise InputFileError(str(path), 1, "expected a JSON object (a HF config.json)")
    return Path(p.model).stem if "/" in p.model else p.model, data


def kv_shape(arch: ModelArch, chunk_tokens: int) -> tuple[tuple[int, int, int, int, int], bool]:
    """LMCache's KV shape (layers, K/V, chunk, heads, head dim) for the model, and whether it is MLA."""
    if arch.attention == "mla":
        assert arch.kv_lora_rank is not None and arch.qk_rope_head_dim is not None
        return (arch.num_layers, 1, chunk_tokens, 1, arch.kv_lora_rank + arch.qk_rope_head_dim), True
    assert arch.num_kv_heads is not None and arch.head_dim is not None
    return (arch.num_layers, 2, chunk_tokens, arch.num_kv_heads, arch.head_dim), False


def merge_lmcache(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The profile's LMCache mapping with the gate's overrides (``extra_config`` merged key by key)."""
    out = dict(base)
    for k, v in overrides.items():
        if k == "extra_config" and isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = {**out[k], **v}
        else:
            out[k] = v
    return out


def reader_lmcache_config(profile: EngineProfile, overrides: dict[str, Any], backend: str, pool_dir: str,
                          kv_bytes: int) -> dict[str, Any]:
    """The LMCache YAML the reader runs with: the profile's (placeholders filled), the gate's overrides, and
    the pool on the target: ``remote_url: fs://localhost:0<pool>`` or ``local_disk: <pool>`` sized to hold it."""
    assert profile.lmcache is not None
    values = {"pool_dir": pool_dir, "run_dir": posixpath.dirname(pool_dir)}
    cfg = merge_lmcache(lmcache_config(profile.lmcache, _Values(values)), overrides)
    for key in ("remote_url", "local_disk", "max_local_disk_size"):
        cfg.pop(key, None)
    if backend == "fs":
        cfg["remote_url"] = f"fs://localhost:0{pool_dir}"
        cfg.setdefault("remote_serde", "naive")
    else:
        cfg["local_disk"] = pool_dir
        # local_disk evicts (deletes chunk files) past its size: hold the whole layout, with a GiB to spare
        cfg["max_local_disk_size"] = float(math.ceil(kv_bytes / GIB) + 1)
    return cfg


class _Values(dict):
    """Template values: the pool's and run directory's paths; any other placeholder gets an inert sample."""

    def __contains__(self, key):
        return True

    def __missing__(self, key):
        return "/kvgate-unset"


def parallel_read_settings(cfg: dict[str, Any], backend: str, chunks_per_retrieve: int) -> dict[str, Any]:
    """Pure: the LMCache 0.5.6 settings that decide how many chunk reads are in flight and how they are done."""
    extra = cfg.get("extra_config") or {}
    out: dict[str, Any] = {"chunks_per_retrieve": chunks_per_retrieve,
                           "blocking_timeout_secs": cfg.get("blocking_timeout_secs", 10)}
    if backend == "fs":
        header = extra.get("save_chunk_meta", True)
        want = bool(extra.get("fs_connector_use_odirect", False))
        out.update(in_flight_chunk_reads=chunks_per_retrieve, fs_connector_use_odirect=want,
                   odirect_effective=want and not header, save_chunk_meta=bool(header),
                   fs_connector_read_ahead_size=extra.get("fs_connector_read_ahead_size"))
        if want and header:
            out["note"] = ("LMCache 0.5.6 turns fs_connector_use_odirect off while save_chunk_meta is on "
                           "(its 28-byte chunk header is not block-aligned): reads are buffered")
    else:
        threads = int(extra.get("disk_io_threads", 4))
        out.update(disk_io_threads=threads, in_flight_chunk_reads=min(threads, chunks_per_retrieve),
                   use_odirect=bool(extra.get("use_odirect", False)))
    return out


def stream_labels(node) -> list[tuple[str, int | None, int | None]]:
    """(label, GPU index, NUMA node) of every stream of a node: one per GPU, else ``read_streams`` (the same
    labels as fio-read's)."""
    if node.gpus:
        return [(f"gpu{g.index}", g.index, g.numa_node) for g in sorted(node.gpus, key=lambda g: g.index)]
    return [(f"stream{i}", None, None) for i in range(node.stream_count)]


class Sizing(BaseModel):
    """How the KV is laid out on a node: chunk bytes from the model, whole retrieves per stream."""

    model_config = ConfigDict(frozen=True)

    kv_bytes_per_token: int
    chunk_tokens: int
    chunk_bytes: int
    chunks_per_retrieve: int
    streams: int
    prompts_per_stream: int

    @property
    def prompts(self) -> int:
        return self.streams * self.prompts_per_stream

    @property
    def kv_bytes(self) -> int:
        return self.prompts * self.chunks_per_retrieve * self.chunk_bytes

    @property
    def kv_bytes_per_stream(self) -> int:
        return self.prompts_per_stream * self.chunks_per_retrieve * self.chunk_bytes


def sizing(kv_bytes_per_token: int, chunk_tokens: int, chunks_per_retrieve: int, streams: int,
           kv_size_bytes: int) -> Sizing:
    """Pure: the largest layout of whole retrieves that fits ``kv_size_bytes`` with every stream reading the
    same amount; ValueError when not even one retrieve per stream fits."""
    chunk_bytes = chunk_tokens * kv_bytes_per_token
    per_retrieve = chunks_per_retrieve * chunk_bytes
    prompts_per_stream = kv_size_bytes // (streams * per_retrieve)
    if prompts_per_stream < 1:
        raise ValueError(f"kv_size {kv_size_bytes} bytes holds no whole retrieve per stream: {streams} stream(s) x "
                         f"{chunks_per_retrieve} chunks x {chunk_bytes} bytes ({chunk_tokens} tokens x "
                         f"{kv_bytes_per_token} B) = {streams * per_retrieve} bytes at least")
    return Sizing(kv_bytes_per_token=kv_bytes_per_token, chunk_tokens=chunk_tokens, chunk_bytes=chunk_bytes,
                  chunks_per_retrieve=chunks_per_retrieve, streams=streams, prompts_per_stream=prompts_per_stream)


def layout_id(identity: dict[str, Any]) -> str:
    """The identity of a layout (what decides the bytes and names of its chunk files), as a short digest."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def fio_job(streams: list[tuple[str, list[str], str | None]], fio: FioSettings) -> str:
    """Pure: an fio job reading each stream's chunk files once with O_DIRECT, file after file, one reporting
    group per stream (``streams``: label, absolute file paths, CPU list or None)."""
    lines = ["; generated by kvgate: the chunk files the KV connector read, each stream its own, once",
             "[global]", "rw=read", f"bs={fio.bs_bytes}", f"ioengine={fio.ioengine}", f"iodepth={fio.iodepth}",
             "direct=1", "group_reporting=1", "file_service_type=sequential", ""]
    for i, (label, files, cpus) in enumerate(streams):
        bad = [f for f in files if any(c in f for c in ":;\n")]
        if bad:
            raise WorkloadError(f"fio cannot take a file name containing ':', ';' or a newline: {bad[0]!r}")
        lines.append(f"[{label}]")
        if i:
            lines.append("new_group")
        lines.append("filename=" + ":".join(files))
        if cpus:
            lines += [f"cpus_allowed={cpus}", "cpus_allowed_policy=shared"]
        lines.append("")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------- evidence


class KvLayoutRecord(BaseModel):
    """A node's KV layout as the reader reported it: reused or laid out now, chunk count, KV and file bytes,
    how long it took, and the layout's identity."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reused: bool
    chunks: int
    kv_bytes: int
    file_bytes: int
    elapsed_s: float | None = None
    engine_init_s: float | None = None
    layout_id: str | None = None


class KvNodeEvidence(Evidence):
    """One node's kv-read: where the pool is, how it was laid out and made cold, what the device read, what
    differed."""

    target: str
    kind: str
    pool_dir: str
    python: str | None = None
    pool_device: str | None = None
    pool_device_maj_min: str | None = None
    numa_cpulists: dict[int, str] | None = None
    layout: KvLayoutRecord | None = None
    versions: dict[str, Any] = {}
    page_cache_dropped: bool | None = None
    drop_caches_error: str | None = None
    reader_start: str | None = None  # spawn: a fresh interpreter per reader; fork: from one (import_once)
    # whether the layout's interpreter had vLLM imported (import_vllm), and the NONE_HASH LMCache seeded its chunk
    # hashes with (vLLM's, else 0): as the layout reported them (a reused layout: as its manifest recorded them)
    vllm_imported: bool | None = None
    none_hash: int | None = None
    # each module the gate deferred (defer_imports): "deferred" (unused by the layout and every reader), "imported"
    # (a use of it imported it in one of them), "absent" (not installed)
    deferred_imports: dict[str, str] | None = None
    kv_bytes_read: int | None = None
    device_read_bytes: int | None = None
    reader_errors: list[str] = []
    stream_errors: dict[str, str] = {}
    mismatch_count: int = 0
    mismatches: list[dict[str, str]] = []
    missing_count: int = 0
    missing: list[dict[str, str]] = []
    # a bundle of an older kvgate, which dropped the page cache again before its O_DIRECT fio; None since
    fio_page_cache_dropped: bool | None = None
    fio_drop_caches_error: str | None = None
    fio_device_read_bytes: int | None = None
    fio_version: str | None = None
    # the layout's writes: the pool device's bytes written from before the layout to after it and the read (synced)
    layout_device_write_bytes: int | None = None
    error: str | None = None


class KvReadEvidence(Evidence, StreamsEvidence):
    """kv-read's evidence: the connector's read of every GPU / stream (``streams``, each with the same stream's
    fio figure), fio's own rows, the LMCache settings and sizing, and each node's record."""

    engine_profile: str
    lmcache_version_pinned: str | None = None
    lmcache_config: dict[str, Any] = {}
    backend: str
    parallel_read: dict[str, Any] = {}
    model: str
    kv_formula: str | None = None
    kv_bytes_per_token: int
    chunk_tokens: int
    chunk_bytes: int
    chunks_per_retrieve: int
    kv_bytes_per_stream: int | None = None
    destination: str
    fio: dict[str, Any] = {}
    nodes: dict[str, KvNodeEvidence] = {}
    node_errors: dict[str, str] = {}
    fio_streams: list[StreamRow] = []
    stream_details: list[dict[str, Any]] = []


def connector_rows(node: str, run: ReadRun, fio: FioRun | None) -> tuple[list[StreamRow], list[dict[str, Any]]]:
    """Pure: one row per reader stream (its connector read rate beside fio's for the same stream) and the
    detail table (retrieves, times, destination, efficiency)."""
    fio_rate = {g.label: g.read_gb_s for g in (fio.groups if fio else [])}
    rows, details = [], []
    for s in run.streams:
        rate = s.read_gb_s
        calls = sorted(s.retrieve_s)
        if rate is not None:
            rows.append(StreamRow(node=node, label=s.label, gpu=s.gpu, read_gb_s=rate, read_bytes=s.kv_bytes,
                                  runtime_ms=int(round((s.read_s or 0) * 1000)), fio_read_gb_s=fio_rate.get(s.label)))
        f = fio_rate.get(s.label)
        details.append({"node": node, "label": s.label, "gpu": s.gpu, "connector_read_gb_s": rate,
                        "fio_read_gb_s": f, "efficiency": rate / f if rate is not None and f else None,
                        "kv_bytes": s.kv_bytes, "chunks": s.chunks, "chunks_retrieved": s.chunks_retrieved,
                        "read_s": s.read_s, "retrieves": len(calls),
                        "retrieve_p50_s": calls[len(calls) // 2] if calls else None,
                        "retrieve_max_s": calls[-1] if calls else None, "prepare_s": s.prepare_s,
                        "destination": s.destination, "cpus": s.cpus_used, "error": s.error})
    return rows, details


def record_checks(rec: KvNodeEvidence, run: ReadRun) -> None:
    """Pure: a node's read-back checks (mismatching and missing chunks, stream errors, device bytes) into its record."""
    mism = [{"stream": s.label, "key": m.key, "file": m.file, "expected_sha256": m.expected_sha256,
             "actual_sha256": m.actual_sha256} for s in run.streams for m in s.mismatches]
    miss = [{"stream": s.label, "key": k} for s in run.streams for k in s.missing]
    rec.mismatch_count, rec.mismatches = len(mism), mism[:MAX_LISTED]
    rec.missing_count, rec.missing = len(miss), miss[:MAX_LISTED]
    rec.stream_errors = {s.label: s.error for s in run.streams if s.error}
    rec.reader_errors = list(run.errors)
    rec.kv_bytes_read = run.kv_bytes
    rec.device_read_bytes = run.device_read_bytes
    rec.deferred_imports = merge_deferred(rec.deferred_imports, *(s.deferred_imports for s in run.streams))


def merge_deferred(*records: dict[str, str] | None) -> dict[str, str] | None:
    """Pure: the deferred modules' states of the layout and the readers as one: a module is "imported" when any
    process imported it, "absent" when every process found it absent, else "deferred"; None when nothing was
    deferred."""
    names = sorted({n for r in records if r for n in r})
    out = {}
    for n in names:
        states = {r[n] for r in records if r and n in r}
        out[n] = "imported" if "imported" in states else "absent" if states == {"absent"} else "deferred"
    return out or None


DEFERRED_SAID = {"deferred": "never used by the layout or a reader",
                 "imported": "imported at its first use by the layout or a reader", "absent": "not installed"}


def deferred_how(ev: "KvReadEvidence") -> str:
    """Pure: the data check's words for the modules deferred on the nodes (defer_imports), "" when none was."""
    parts = [f"{name} on {node}: {DEFERRED_SAID[state]}" for node, r in sorted(ev.nodes.items())
             for name, state in sorted((r.deferred_imports or {}).items())]
    return f"; deferred until first use (defer_imports): {'; '.join(parts)}" if parts else ""


def kv_read_metrics(streams: list[StreamRow], fio: list[StreamRow],
                    nodes: dict[str, KvNodeEvidence]) -> dict[str, float]:
    """Pure: the connector's per-stream figures (min is the gate metric), fio's for the same streams, and
    their ratio (min ÷ min)."""
    m: dict[str, float] = {}
    conn = [s.read_gb_s for s in streams]
    fios = [s.read_gb_s for s in fio]
    if conn:
        m["connector_read_gb_s"] = min(conn)
        m["connector_read_gb_s_mean"] = sum(conn) / len(conn)
    if fios:
        m["fio_read_gb_s"] = min(fios)
        m["fio_read_gb_s_mean"] = sum(fios) / len(fios)
    if conn and fios and min(fios) > 0:
        m["connector_efficiency"] = min(conn) / min(fios)
        m["connector_efficiency_mean"] = (sum(conn) / len(conn)) / (sum(fios) / len(fios))
    m["mismatched_chunks"] = float(sum(r.mismatch_count for r in nodes.values()))
    m["missing_chunks"] = float(sum(r.missing_count for r in nodes.values()))
    kv = [r.kv_bytes_read for r in nodes.values() if r.kv_bytes_read is not None]
    if kv:
        m["kv_bytes_read"] = float(sum(kv))
    dev = [r.device_read_bytes for r in nodes.values() if r.device_read_bytes is not None]
    if dev and len(dev) == len(nodes):
        m["device_read_bytes"] = float(sum(dev))
    return m


def evaluate_kv_read(ev: KvReadEvidence) -> WorkloadResult:
    """Pure: kv-read's metrics and outcome from its evidence. A node or stream that failed is an error; a chunk
    read back wrong or not at all is a failed check naming the key; a pool device that read fewer bytes than the
    KV retrieved makes the result invalid."""
    metrics = kv_read_metrics(ev.streams, ev.fio_streams, ev.nodes)
    errors = [f"node {n}: {e}" for n, e in sorted(ev.node_errors.items())]
    for n, r in sorted(ev.nodes.items()):
        errors += [f"node {n} stream {label}: {e}" for label, e in sorted(r.stream_errors.items())]
        errors += [f"node {n}: {e}" for e in r.reader_errors]
    failed = None
    for n, r in sorted(ev.nodes.items()):
        if r.mismatches:
            m = r.mismatches[0]
            failed = (f"chunk {m['key']} read back by {n}/{m['stream']} differs from what was stored "
                      f"(sha256 {m['actual_sha256'][:16]}… != {m['expected_sha256'][:16]}…; file {m['file']}); "
                      f"{int(metrics['mismatched_chunks'])} chunk(s) differ")
            break
    if failed is None:
        for n, r in sorted(ev.nodes.items()):
            if r.missing:
                m = r.missing[0]
                failed = (f"chunk {m['key']} was stored but LMCache did not retrieve it for {n}/{m['stream']}; "
                          f"{int(metrics['missing_chunks'])} chunk(s) missing")
                break
    invalid = None
    for n, r in sorted(ev.nodes.items()):
        if r.kv_bytes_read is None:
            continue
        if r.device_read_bytes is None:
            invalid = (f"the read bytes of the pool's device on {n} ({r.pool_device or 'not a block device'}) could "
                       "not be measured: the read is not proven to come from the device")
        elif r.device_read_bytes < r.kv_bytes_read:
            invalid = (f"served from a cache: the pool's device on {n} ({r.pool_device}) read {r.device_read_bytes} "
                       f"bytes while the readers retrieved {r.kv_bytes_read} bytes of KV")
        if invalid:
            break
    ev = ev.model_copy(update={"validity": validity_items(ev, metrics, invalid, failed)})
    if errors:
        return WorkloadResult(metrics, ev, error="; ".join(errors), failed_check=failed)
    if "fio_read_gb_s" not in metrics and "connector_read_gb_s" in metrics:
        return WorkloadResult(metrics, ev, error="no fio figure for the same chunk files", failed_check=failed)
    return WorkloadResult(metrics, ev, invalid_reason=invalid, failed_check=failed)


def reevaluate_kv_read(evidence: dict[str, Any], raw: dict[str, tuple[str, str]]) -> WorkloadResult:
    """Pure: kv-read again from a bundle's recorded evidence and every node's raw outputs (node -> (the readers'
    stdout, fio's JSON)): the stream rows, the read-back checks and the device bytes are re-derived from the raw
    files with the functions the run used; the recorded evidence supplies the rest."""
    # validity is the evaluator's to say again (and an older kvgate recorded it in another shape)
    ev = KvReadEvidence.model_validate({k: v for k, v in evidence.items() if k != "validity"})
    streams, fios, details = [], [], []
    nodes = dict(ev.nodes)
    for name, (read_text, fio_text) in sorted(raw.items()):
        run = parse_read(read_text)
        fio = parse_fio_json(fio_text)
        rec = nodes[name].model_copy(deep=True)
        record_checks(rec, run)
        nodes[name] = rec
        rows, det = connector_rows(name, run, fio)
        gpu_of = {r.label: r.gpu for r in ev.streams + ev.fio_streams if r.node == name and r.gpu is not None}
        streams += rows
        fios += fio_stream_rows(name, fio, gpu_of)
        details += det
    ev = ev.model_copy(update={"nodes": nodes, "streams": streams, "fio_streams": fios, "stream_details": details})
    return evaluate_kv_read(ev)


def validity_items(ev: KvReadEvidence, metrics: dict[str, float], invalid: str | None,
                   failed: str | None) -> list[ValidityCheck]:
    """Pure: the proofs the report lists: cold (the pool device read at least the KV bytes retrieved) and data
    (every chunk read back equals what was stored)."""
    kv = int(metrics.get("kv_bytes_read", 0))
    dev = metrics.get("device_read_bytes")
    drops = sorted(n for n, r in ev.nodes.items() if r.page_cache_dropped)
    seen = (f"the pool device read {format_quantity(dev, 'B')} while {format_quantity(kv, 'B')} of KV were "
            "retrieved" if dev is not None else "bytes read by the pool device unknown")
    chunks = sum(r.layout.chunks for r in ev.nodes.values() if r.layout is not None)
    bad = int(metrics.get("mismatched_chunks", 0) + metrics.get("missing_chunks", 0))
    no_vllm = sorted(n for n, r in ev.nodes.items() if r.vllm_imported is False)
    seed = (f"; vLLM not imported on {', '.join(no_vllm)} (import_vllm: false): LMCache seeded the chunk keys with "
            "NONE_HASH 0, the same builtin hash" if no_vllm else "") + deferred_how(ev)
    return [
        ValidityCheck(name="cold", ok=dev is not None and invalid is None and kv > 0,
                      claim="the KV was read from the pool's device, not a cache",
                      how=f"/sys/dev/block/MAJ:MIN/stat of the pool's device before and after the read: {seen}; "
                          f"page cache dropped on {', '.join(drops) or 'no node'}",
                      figure="bytes the pool device read", value=dev, unit="B"),
        ValidityCheck(name="data", ok=failed is None and chunks > 0 and bad == 0,
                      claim="every chunk read back equals what was stored",
                      how=(failed or f"each chunk's sha256 after the read against the one stored: {chunks - bad} of "
                                     f"{chunks} equal") + seed,
                      figure="chunks that differ or were not retrieved", value=float(bad), unit="count")]


# ------------------------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class KvSetup:
    """One node's kv-read as the configuration decides it (nothing run yet): the engine profile and model, the
    target, the pool and run directories, the reader's LMCache config, the sizing and KV shape, the layout's
    identity, where the KV is read into, the interpreter, and the node-side paths of the reader program, its
    spec, LMCache YAML and fio job."""

    profile: EngineProfile
    arch: ModelArch
    model: str
    target: Any
    pool: str
    run_dir: str
    lmcache: dict[str, Any]
    sizing: Sizing
    kv_shape: tuple[int, int, int, int, int]
    mla: bool
    model_name: str
    layout_id: str
    destination: str
    python: str
    program: str
    spec: str
    lmcache_yaml: str
    fio_job: str


def pool_dir(node, target, p: KvReadParams) -> str:
    """The pool on a node: inside a directory target, beside a file target (same filesystem)."""
    path = target_path(node, target)
    base = path if target.kind == "directory" else (posixpath.dirname(path) or "/")
    return posixpath.join(base, p.pool_subdir)


def _reader_step(steps: Any, tr: Any, nd: Path, step: str, argv: list[str], timeout_s: float, name: str,
                 parse: Callable[[str], Any], failed: str) -> Any:
    """Run one kv_reader.py mode as a logged step, keep its stdout and stderr in the node's directory
    (``name``.json / .stderr) and return its parsed output; raise WorkloadError starting with ``failed`` when
    the program failed or printed no result."""
    r = steps.run(tr, step, argv, timeout_s=timeout_s, env=READER_ENV)
    write_gate_file(nd / f"{name}.json", r.stdout)
    write_gate_file(nd / f"{name}.stderr", r.stderr)
    return _checked(r, r.stdout, parse, failed)


def _checked(r: Any, text: str, parse: Callable[[str], Any], failed: str, need_ok: bool = True) -> Any:
    """``parse(text)`` of a reader step's output; WorkloadError starting with ``failed`` when it printed no
    such document, or one carrying an error, or (``need_ok``) the step itself failed."""
    try:
        out = parse(text)
    except WorkloadError as exc:
        raise WorkloadError(f"{failed}: {r.summary()} ({exc})") from None
    if out.error or (need_ok and not r.ok):
        raise WorkloadError(f"{failed}: {out.error or r.summary()}")
    return out


def _run_dir(node, gate_id: str) -> str:
    return posixpath.join(node.work_dir, f"kvgate-kvread-{gate_id}-{node.name}")


def _target_issues(params: KvReadParams, nodes) -> list[tuple[tuple, str]]:
    """Pure: what keeps each node's target (and destination) from holding kv-read's pool, for validate_against."""
    issues: list[tuple[tuple, str]] = []
    for name, node in nodes.items():
        t = node.target(params.target)
        if t is None:
            issues.append((("target",), f"node {name!r} has no target {params.target!r} "
                           f"(expected one of {', '.join(x.name for x in node.targets) or 'none declared'})"))
            continue
        if t.kind not in ("file", "directory"):
            issues.append((("target",), f"target {params.target!r} on node {name!r} is a {t.kind}; kv-read needs "
                           "a filesystem (a directory target, or a file target whose directory holds the pool): "
                           "LMCache's pool is a directory"))
            continue
        if any(c in target_path(node, t) for c in ":;\n"):
            issues.append((("target",), f"target {params.target!r} on node {name!r}: fio cannot take a path "
                           f"containing ':' or ';' ({t.path!r})"))
        if params.destination == "gpu" and not node.gpus:
            issues.append((("destination",), f"destination gpu, but node {name!r} declares no GPUs"))
    return issues


def _sizing_issues(params: KvReadParams, arch: ModelArch, cfg: dict[str, Any], nodes) -> list[tuple[tuple, str]]:
    """Pure: whether the reader's LMCache config (``cfg``) sizes a layout on every node and holds one retrieve in
    its CPU buffer, for validate_against (nothing to say without a positive integer chunk size)."""
    issues: list[tuple[tuple, str]] = []
    chunk = cfg.get("chunk_size", 256)
    if not isinstance(chunk, int) or chunk <= 0:
        return issues
    for name, node in nodes.items():
        try:
            sizing(arch.kv_bytes_per_token, chunk, params.chunks_per_retrieve, node.stream_count,
                   params.kv_size_bytes)
        except ValueError as exc:
            issues.append((("kv_size",), f"node {name!r}: {exc}"))
    cpu_gib = cfg.get("max_local_cpu_size", 5.0)
    need = params.chunks_per_retrieve * chunk * arch.kv_bytes_per_token
    if isinstance(cpu_gib, (int, float)) and need > cpu_gib * GIB:
        where = ("lmcache", "max_local_cpu_size") if "max_local_cpu_size" in params.lmcache else \
            ("chunks_per_retrieve",)
        issues.append((where, f"one retrieve ({params.chunks_per_retrieve} chunks x "
                       f"{chunk * arch.kv_bytes_per_token} bytes) does not fit LMCache's CPU buffer "
                       f"(max_local_cpu_size {cpu_gib:g} GiB)"))
    return issues


def rederive(gate_dir: Path, result: dict[str, Any], params: Any, ctx: dict[str, Any]):
    """kv-read from every node's raw reader output (``read.json``) and fio JSON, through the workload's own pure
    functions (harness.workloads.kv_read.reevaluate_kv_read)."""
    ev = result.get("evidence") or {}
    raw = {}
    for node in sorted(ev.get("nodes") or {}):
        texts = []
        for name, what in (("read.json", "KV reader output"), ("fio.json", "fio output")):
            texts.append(read_file(gate_dir / node / name, max_bytes=MAX_JSON_BYTES, what=what, follow_symlinks=False,
                                   display_name=f"gates/{gate_dir.name}/{node}/{name}"))
        raw[node] = (texts[0], texts[1])
    if not raw:
        raise HarnessError(f"{gate_dir.name}: the evidence names no node")
    again = reevaluate_kv_read(ev, raw)
    return again.metrics, again.invalid_reason, again.failed_check


@register_workload("kv-read")
class KvRead(Workload):
    rederive = staticmethod(rederive)  # the gate re-judged from the bundle's raw files
    # what its endurance prices (docs/endurance.md), for `kvgate plan`
    ENDURANCE = ("the layout: the pool device's bytes written from before it to after the read (synced), per million "
                 "KV tokens, per KV byte stored, over the layout; NVMe SMART data units beside, on an NVMe namespace")
    Params = KvReadParams
    EvidenceModel = KvReadEvidence
    METRICS = {
        "connector_read_gb_s": "GB/s",
        "connector_read_gb_s_mean": "GB/s",
        "fio_read_gb_s": "GB/s",
        "fio_read_gb_s_mean": "GB/s",
        "connector_efficiency": "ratio",
        "connector_efficiency_mean": "ratio",
        "kv_bytes_read": "B",
        "device_read_bytes": "B",
        "mismatched_chunks": "count",
        "missing_chunks": "count",
    }

    # ---- configuration

    def _model(self, p: KvReadParams) -> tuple[str, ModelArch]:
        name, cfg = model_config(p)
        return name, arch_from_config(cfg, name=name, kv_dtype=p.kv_dtype)

    def validate_against(self, params: KvReadParams, nodes):
        issues: list[tuple[tuple, str]] = []
        try:
            prof = load_profile(params.engine)
        except ConfigError as exc:
            prof = None
            issues.append((("engine",), str(exc.issues[0])))
        if prof is not None and prof.lmcache is None:
            issues.append((("engine",), f"profile {prof.name!r} has no LMCache block: kv-read reads through LMCache"))
            prof = None
        arch = None
        try:
            _, arch = self._model(params)
        except InputFileError as exc:
            named = "/" not in params.model and not params.model.endswith(".json")
            known = ", ".join(sorted(x.stem for x in data_path("workloads", "models").glob("*.json")))
            issues.append((("model",), f"no model config {params.model!r} in workloads/models (known: {known})"
                           if named and "no such file" in str(exc) else str(exc)))
        except ArchError as exc:
            where = ("model_config_inline", exc.field) if params.model_config_inline is not None else ("model",)
            issues.append((where, exc.message if params.model_config_inline is not None else
                           f"model config {params.model!r}: {exc}"))
        issues += _target_issues(params, nodes)
        if prof is None or arch is None:
            return issues
        cfg = reader_lmcache_config(prof, params.lmcache, params.backend, "/kvgate-sample/pool", params.kv_size_bytes)
        for path, msg in check_lmcache_config(cfg, prof.lmcache.version):
            key = path[0] if path else None
            if key in params.lmcache:
                issues.append((("lmcache",) + tuple(path), msg))
            else:
                where = ".".join(map(str, path))
                issues.append((("engine",), f"LMCache config of profile {prof.name!r}: {where}: {msg}"))
        return issues + _sizing_issues(params, arch, cfg, nodes)

    # ---- what a node runs (pure)

    def _setup(self, ctx: GateContext, node) -> "KvSetup":
        """Everything about one node's run that follows from the configuration alone."""
        p: KvReadParams = ctx.params
        prof = load_profile(p.engine)
        name, arch = self._model(p)
        t = node.target(p.target)
        pool = pool_dir(node, t, p)
        run_dir = _run_dir(node, ctx.gate.id)
        cfg0 = reader_lmcache_config(prof, p.lmcache, p.backend, pool, p.kv_size_bytes)
        sz = sizing(arch.kv_bytes_per_token, int(cfg0.get("chunk_size", 256)), p.chunks_per_retrieve,
                    node.stream_count, p.kv_size_bytes)
        cfg = reader_lmcache_config(prof, p.lmcache, p.backend, pool, sz.kv_bytes)
        shape, mla = kv_shape(arch, sz.chunk_tokens)
        model_name = "kvgate-kv-read/" + "".join(c if c.isalnum() or c in "._-" else "-" for c in name)
        extra = cfg.get("extra_config") or {}
        identity = {"lmcache": prof.lmcache.version, "backend": p.backend, "model_name": model_name,
                    "kv_shape": shape, "kv_dtype": arch.dtype, "mla": mla, "chunk_bytes": sz.chunk_bytes,
                    "chunks_per_retrieve": sz.chunks_per_retrieve, "prompts": sz.prompts, "seed": p.seed,
                    "serde": cfg.get("remote_serde"), "hash": cfg.get("pre_caching_hash_algorithm", "builtin"),
                    "layerwise": cfg.get("use_layerwise", False), "chunk_meta": extra.get("save_chunk_meta", True)}
        if not p.import_vllm:  # another NONE_HASH, other chunk keys; the default's identity (and pools) unchanged
            identity["vllm"] = False
        destination = "gpu" if p.destination == "gpu" or (p.destination == "auto" and node.gpus) else "cpu"
        return KvSetup(profile=prof, arch=arch, model=name, target=t, pool=pool, run_dir=run_dir, lmcache=cfg,
                       sizing=sz, kv_shape=shape, mla=mla, model_name=model_name, layout_id=layout_id(identity),
                       destination=destination, python=node_engine_python(p.python, node),
                       program=posixpath.join(run_dir, "kv_reader.py"), spec=posixpath.join(run_dir, "spec.json"),
                       lmcache_yaml=posixpath.join(run_dir, "lmcache.yaml"),
                       fio_job=posixpath.join(run_dir, "kv-fio.job"))

    def _spec(self, ctx: GateContext, node, s: "KvSetup", cpulists: dict[int, str] | None,
              device_stat: str | None) -> dict[str, Any]:
        p: KvReadParams = ctx.params
        sz: Sizing = s.sizing
        labels = stream_labels(node)
        streams = []
        for i, (label, gpu, numa) in enumerate(labels):
            cpus = cpulists.get(numa) if (cpulists and p.pin_numa and numa is not None) else None
            streams.append({"label": label, "gpu": gpu, "cpus": cpus,
                            "prompts": list(range(i, sz.prompts, len(labels)))})
        vocab = 32000
        return {"schema": "kvgate-kv-read-spec/1", "lmcache_config": s.lmcache_yaml, "backend": ctx.params.backend,
                "pool_dir": s.pool, "model_name": s.model_name, "kv_shape": list(s.kv_shape),
                "kv_dtype": _torch_dtype(s.arch.dtype), "use_mla": s.mla, "chunk_tokens": sz.chunk_tokens,
                "chunk_bytes": sz.chunk_bytes, "chunks_per_retrieve": sz.chunks_per_retrieve, "prompts": sz.prompts,
                "seed": p.seed, "vocab": vocab, "layout_id": s.layout_id, "streams": streams,
                "destination": s.destination, "device_stat": device_stat, "fadvise_dontneed": p.fadvise_dontneed,
                "store_timeout_s": min(600.0, p.layout_timeout_s), "read_timeout_s": p.read_timeout_s,
                "import_vllm": p.import_vllm, "defer_imports": list(p.defer_imports)}

    def _argv(self, s: "KvSetup", command: str) -> tuple[str, ...]:
        return (s.python, s.program, command, "--spec", s.spec)

    def _layout_read_argv(self, s: "KvSetup", p: KvReadParams) -> tuple[str, ...]:
        return self._argv(s, "layout-read") + (("--drop-caches",) if p.drop_caches else ())

    def plan(self, ctx: GateContext) -> list[PlannedStep]:
        p: KvReadParams = ctx.params
        out = []
        for node in ctx.nodes.values():
            s = self._setup(ctx, node)
            sz: Sizing = s.sizing
            n = node.name
            out.append(PlannedStep(n, f"create {s.run_dir} and the pool {s.pool}",
                                   ("mkdir", "-p", s.run_dir, s.pool)))
            if pins_numa(p.pin_numa, node):
                out.append(numa_step(n, "readers"))
            out.append(PlannedStep(n, "the pool's block device (its /sys/dev/block/MAJ:MIN/stat proves cold reads)",
                                   pool_blockstat_argv(s.pool),
                                   files={s.lmcache_yaml: json.dumps(s.lmcache, indent=1),
                                          s.program: "(harness/node/kv_reader.py)",
                                          s.spec: json.dumps(self._spec(ctx, node, s, None, "<device stat>"),
                                                                indent=1)}))
            out.append(PlannedStep(n, "NVMe SMART data units written before the layout, where the pool's device is "
                                      "an NVMe namespace", smart_log_argv("<the pool's NVMe namespace>"),
                                   optional=True))
            lay = (f"lay out {sz.prompts * sz.chunks_per_retrieve} chunks of {sz.chunk_bytes} bytes "
                   f"({sz.kv_bytes} bytes of {s.model} KV) through LMCache {p.backend} in {s.pool}, unless an intact "
                   f"layout {s.layout_id} is there")
            reads = (f"{node.stream_count} fresh reader process(es) retrieve {sz.kv_bytes_per_stream} bytes each "
                     f"through LMCache into {s.destination} memory; every chunk checked")
            if p.import_once:
                out.append(PlannedStep(n, f"one interpreter imports torch and LMCache once; forked from it: {lay}; "
                                       + ("then it drops the page cache (recorded whether permitted); " if
                                          p.drop_caches else "") + reads, self._layout_read_argv(s, p)))
            else:
                out.append(PlannedStep(n, lay, self._argv(s, "layout")))
                if p.drop_caches:
                    out.append(PlannedStep(n, "drop the page cache (recorded whether permitted)", DROP_CACHES_ARGV))
                out.append(PlannedStep(n, reads, self._argv(s, "read")))
            out += endurance_plan(n, s.pool)
            out.append(PlannedStep(n, "the pool device's read counters before fio", pool_blockstat_argv(s.pool)))
            placeholder = [(label, [f"<{label}'s chunk files from the layout>"], None)
                           for label, _, _ in stream_labels(node)]
            out.append(PlannedStep(n, "fio: each stream's chunk files once, O_DIRECT (the same bytes)",
                                   ("fio", "--output-format=json", s.fio_job),
                                   files={s.fio_job: fio_job(placeholder, p.fio)}))
            out.append(PlannedStep(n, "the pool device's read counters after fio", pool_blockstat_argv(s.pool)))
        return out

    # ---- run

    def run(self, ctx: GateContext) -> WorkloadResult:
        p: KvReadParams = ctx.params
        first = next(iter(ctx.nodes.values()))
        s0 = self._setup(ctx, first)
        sz0: Sizing = s0.sizing
        group = fan_out(ctx.nodes, lambda _name, node: self._run_node(ctx, node))
        nodes = {n: rec for n, (rec, _, _, _) in group.succeeded.items()}
        ev = KvReadEvidence(
            engine_profile=s0.profile.name, lmcache_version_pinned=s0.profile.lmcache.version,
            lmcache_config=s0.lmcache, backend=p.backend,
            parallel_read=parallel_read_settings(s0.lmcache, p.backend, p.chunks_per_retrieve),
            model=s0.model, kv_formula=s0.arch.formula(), kv_bytes_per_token=sz0.kv_bytes_per_token,
            chunk_tokens=sz0.chunk_tokens, chunk_bytes=sz0.chunk_bytes, chunks_per_retrieve=sz0.chunks_per_retrieve,
            kv_bytes_per_stream=sz0.kv_bytes_per_stream, destination=s0.destination,
            fio={"ioengine": p.fio.ioengine, "bs_bytes": p.fio.bs_bytes, "iodepth": p.fio.iodepth, "direct": True},
            nodes=nodes, node_errors=dict(group.failed),
            streams=[r for _, rows, _, _ in group.succeeded.values() for r in rows],
            fio_streams=[r for _, _, rows, _ in group.succeeded.values() for r in rows],
            stream_details=[d for _, _, _, ds in group.succeeded.values() for d in ds])
        for n, rec in nodes.items():
            if rec.error:
                ev.node_errors = {**ev.node_errors, n: rec.error}
        ev.endurance = nodes_endurance(nodes)
        result = evaluate_kv_read(ev)
        write_summary(ctx.gate_dir, "kv-read.json", result)
        return result

    def _run_node(self, ctx: GateContext, node):
        """One node's layout, cold read and fio pass; a failure ends the node's part with its record kept."""
        p: KvReadParams = ctx.params
        s = self._setup(ctx, node)
        rec = KvNodeEvidence(target=p.target, kind=s.target.kind, pool_dir=s.pool, python=s.python,
                             pool_drive=pool_drive_of(ctx, node.name))
        acc: dict[str, list] = {"rows": [], "fio": [], "details": []}
        try:
            self._node_steps(ctx, node, s, rec, acc)
        except WorkloadError as exc:
            rec.error = str(exc)
        return rec, acc["rows"], acc["fio"], acc["details"]

    def _node_steps(self, ctx: GateContext, node, s: "KvSetup", rec: KvNodeEvidence, acc: dict[str, list]):
        """The node's steps in order; what is measured goes into ``rec`` and ``acc`` as soon as it is known."""
        p: KvReadParams = ctx.params
        tr, steps = ctx.transports[node.name], ctx.steps
        nd = ctx.gate_dir / node.name
        nd.mkdir(parents=True, exist_ok=True)
        sz: Sizing = s.sizing
        dev, smart_dev, smart0, spec = self._prepare_node(ctx, node, s, rec, nd)

        ctx.progress(f"{ctx.gate.id} {node.name}: laying out {sz.kv_bytes / 1e9:.3f} GB of KV through LMCache "
                     f"{p.backend} in {s.pool}")
        if p.import_once:
            lay, run = self._layout_read_once(ctx, node, s, rec, nd)
        else:
            lay, run = self._layout_then_read(ctx, node, s, rec, nd)
        record_checks(rec, run)
        rec.reader_start = run.start_method
        # what laying out the KV cost the pool's drive: its writes synced, the block counters and the drive's own
        steps.run(tr, "kv-sync", SYNC_ARGV, timeout_s=300)
        dev1 = _pool_stat(steps.run(tr, "kv-blockstat-after-layout", pool_blockstat_argv(s.pool), timeout_s=30))
        smart1 = _smart(steps, tr, smart_dev, "kv-smart-after")
        rec.layout_device_write_bytes = write_bytes_between(dev, dev1)
        rec.endurance = layout_endurance(rec, sz.kv_bytes_per_token, smart_dev, smart0, smart1,
                                         drive_rating(rec.pool_drive))
        acc["rows"], acc["details"] = connector_rows(node.name, run, None)
        self._fio_pass(ctx, node, s, rec, nd, _fio_job_streams(s.pool, lay.files, spec["streams"]), run, acc)

    def _prepare_node(self, ctx: GateContext, node, s: "KvSetup", rec: KvNodeEvidence, nd: Path):
        """Before the layout: the run directory and pool, the NUMA CPU lists, the pool's device and its SMART log,
        the LMCache config checked, and the reader's program, spec and YAML put on the node. Returns the pool
        device's reading, its NVMe namespace, the SMART log before and the spec."""
        p: KvReadParams = ctx.params
        tr, steps = ctx.transports[node.name], ctx.steps
        r = steps.run(tr, "kv-mkdir", ("mkdir", "-p", s.run_dir, s.pool), timeout_s=60)
        if not r.ok:
            raise WorkloadError(f"cannot create {s.run_dir} / {s.pool}: {r.summary()}")
        cpulists = None
        if pins_numa(p.pin_numa, node):
            rec.numa_cpulists = cpulists = numa_cpulists(ctx, tr)
        r = steps.run(tr, "kv-pool-device", pool_blockstat_argv(s.pool), timeout_s=30)
        dev = _pool_stat(r)
        if dev is not None:
            rec.pool_device, rec.pool_device_maj_min = dev.source, dev.maj_min
        smart_dev = smart_device(rec.pool_device)
        smart0 = _smart(steps, tr, smart_dev, "kv-smart-before")
        issues = check_lmcache_config(s.lmcache, s.profile.lmcache.version)
        if issues:
            raise WorkloadError("LMCache config rejected: "
                                + "; ".join(f"{'.'.join(map(str, k))}: {m}" for k, m in issues))
        spec = self._spec(ctx, node, s, cpulists, f"/sys/dev/block/{dev.maj_min}/stat" if dev else None)
        write_gate_file(nd / "spec.json", json.dumps(spec, indent=1))
        write_gate_file(nd / "lmcache.yaml", f"# written by kvgate for LMCache {s.profile.lmcache.version}\n"
                                         + _yaml(s.lmcache))
        tr.put(program_path("kv_reader.py"), s.program)
        tr.put(nd / "spec.json", s.spec)
        tr.put(nd / "lmcache.yaml", s.lmcache_yaml)
        return dev, smart_dev, smart0, spec

    def _layout_read_once(self, ctx: GateContext, node, s: "KvSetup", rec: KvNodeEvidence, nd: Path):
        """With ``import_once``: one step lays out, drops the page cache and reads (each phase's document on its
        own stdout line); returns the layout and the read as parsed."""
        p: KvReadParams = ctx.params
        r = ctx.steps.run(ctx.transports[node.name], "kv-layout-read", self._layout_read_argv(s, p),
                          timeout_s=p.layout_timeout_s + p.read_timeout_s + 600, env=READER_ENV)
        parts = split_documents(r.stdout)
        for name in ("layout", "drop-caches", "read"):
            write_gate_file(nd / f"{name}.json", parts.get(name, ""))
        write_gate_file(nd / "layout-read.stderr", r.stderr)
        lay = _checked(r, parts.get("layout", ""), parse_layout, "layout failed", need_ok=False)
        _record_layout(rec, s, lay)
        if p.drop_caches:
            drop = parse_drop_caches(parts.get("drop-caches", ""))
            rec.page_cache_dropped, rec.drop_caches_error = drop.dropped, drop.error
        return lay, _checked(r, parts.get("read", ""), parse_read, "readers failed")

    def _layout_then_read(self, ctx: GateContext, node, s: "KvSetup", rec: KvNodeEvidence, nd: Path):
        """A fresh interpreter per phase: the layout step, the page cache dropped, then the readers' step; returns
        the layout and the read as parsed."""
        p: KvReadParams = ctx.params
        tr, steps = ctx.transports[node.name], ctx.steps
        lay = _reader_step(steps, tr, nd, "kv-layout", self._argv(s, "layout"), p.layout_timeout_s, "layout",
                           parse_layout, "layout failed")
        _record_layout(rec, s, lay)
        if p.drop_caches:
            drop = drop_caches(ctx, tr, "kv-drop-caches", timeout_s=300)
            rec.page_cache_dropped, rec.drop_caches_error = drop.dropped, drop.error
        ctx.progress(f"{ctx.gate.id} {node.name}: {node.stream_count} reader(s) retrieving through LMCache")
        run = _reader_step(steps, tr, nd, "kv-read", self._argv(s, "read"), p.read_timeout_s + 600, "read",
                           parse_read, "readers failed")
        return lay, run

    def _fio_pass(self, ctx: GateContext, node, s: "KvSetup", rec: KvNodeEvidence, nd: Path,
                  job_streams: list[tuple[str, list[str], str | None]], run: ReadRun, acc: dict[str, list]):
        """fio over the same chunk files, stream by stream, O_DIRECT (so the page cache is not dropped first: none of
        it serves the reads), the pool device's reads counted around it; its rows (and the connector's beside them)
        into ``acc``."""
        p: KvReadParams = ctx.params
        tr, steps = ctx.transports[node.name], ctx.steps
        job = fio_job(job_streams, p.fio)
        write_gate_file(nd / "kv-fio.job", job)
        tr.put(nd / "kv-fio.job", s.fio_job)
        b0 = steps.run(tr, "fio-blockstat-before", pool_blockstat_argv(s.pool), timeout_s=30)
        ctx.progress(f"{ctx.gate.id} {node.name}: fio over the same chunk files")
        r = steps.run(tr, "fio", ("fio", "--output-format=json", s.fio_job),
                      timeout_s=max(600.0, s.sizing.kv_bytes / 20e6))
        b1 = steps.run(tr, "fio-blockstat-after", pool_blockstat_argv(s.pool), timeout_s=30)
        write_gate_file(nd / "fio.json", r.stdout)
        write_gate_file(nd / "fio.stderr", r.stderr)
        rec.fio_device_read_bytes = read_bytes_between(_pool_stat(b0), _pool_stat(b1))
        fio = fio_json(r)
        rec.fio_version = fio.version
        check_fio_groups(fio)
        gpu_of = {label: gpu for label, gpu, _ in stream_labels(node) if gpu is not None}
        acc["rows"], acc["details"] = connector_rows(node.name, run, fio)
        acc["fio"] = fio_stream_rows(node.name, fio, gpu_of)


def _record_layout(rec: KvNodeEvidence, s: "KvSetup", lay: Layout) -> None:
    """The reader's layout report into the node's record; WorkloadError when it holds another chunk count than
    the sizing's."""
    sz: Sizing = s.sizing
    rec.layout = KvLayoutRecord(reused=lay.reused, chunks=lay.chunks, kv_bytes=lay.kv_bytes,
                                file_bytes=lay.file_bytes, elapsed_s=lay.elapsed_s,
                                engine_init_s=lay.engine_init_s, layout_id=s.layout_id)
    rec.versions = lay.versions
    rec.vllm_imported, rec.none_hash = lay.vllm_imported, lay.none_hash
    rec.deferred_imports = merge_deferred(lay.deferred_imports)
    if lay.chunks != sz.prompts * sz.chunks_per_retrieve:
        raise WorkloadError(f"layout holds {lay.chunks} chunks, expected {sz.prompts * sz.chunks_per_retrieve}")


def _fio_job_streams(pool: str, files: tuple[ChunkFile, ...], streams: list[dict[str, Any]]
                     ) -> list[tuple[str, list[str], str | None]]:
    """Pure: fio's streams (label, absolute chunk files in prompt order, CPU list) from the layout's files and the
    spec's streams, so fio reads each stream's own chunk files."""
    by_prompt: dict[int, list[str]] = {}
    for f in sorted(files, key=lambda f: (f.prompt, f.index)):
        by_prompt.setdefault(f.prompt, []).append(posixpath.join(pool, f.file))
    return [(st["label"], [f for pr in st["prompts"] for f in by_prompt.get(pr, [])], st["cpus"]) for st in streams]


SYNC_ARGV = ("sync",)


def endurance_plan(node: str, pool: str) -> list[PlannedStep]:
    """The steps that price the layout's writes (docs/endurance.md), for ``kvgate plan``."""
    return [PlannedStep(node, "sync: the layout's writes (data, ext4 metadata and journal) reach the device", SYNC_ARGV),
            PlannedStep(node, "the pool device's write counters after the layout (against those before it)",
                        pool_blockstat_argv(pool)),
            PlannedStep(node, "NVMe SMART data units written after the layout, where the pool's device is an NVMe "
                        "namespace (also read before the layout; not exposed otherwise)",
                        smart_log_argv("<the pool's NVMe namespace>"), optional=True)]


def _smart(steps, tr, device: str | None, name: str) -> tuple[SmartLog | None, str | None]:
    """The drive's SMART log now (the probe ``nvme smart-log``), or why not: no NVMe namespace, or nvme-cli's
    failure as it said it."""
    if device is None:
        return None, "the pool's device is no NVMe namespace"
    r = steps.run(tr, name, smart_log_argv(device), timeout_s=60)
    if not r.ok:
        first = next((line for line in (r.stderr or r.stdout or "").splitlines() if line.strip()), "no output")
        return None, f"nvme smart-log {device}: exit {r.rc}: {first.strip()[:200]}"
    try:
        return parse_smart_log(r.stdout), None
    except ValueError as exc:
        return None, str(exc)


def layout_endurance(rec: KvNodeEvidence, kv_bytes_per_token: int, device: str | None,
                     before: tuple[SmartLog | None, str | None], after: tuple[SmartLog | None, str | None],
                     drive: DriveRating | None) -> dict[str, Any] | None:
    """Pure: what the node's layout cost the pool's drive (harness.endurance: its tokens are the KV's, its window the
    layout's), with the drive's own SMART data units written beside the block counters (harness.parsers.smart)."""
    lay = rec.layout
    if lay is None:
        return None
    stored = 0 if lay.reused else lay.kv_bytes
    e = endurance(rec.layout_device_write_bytes, lay.kv_bytes / kv_bytes_per_token if kv_bytes_per_token else None,
                  stored, lay.elapsed_s, drive).to_dict()
    smart = smart_writes(device, before[0], after[0], rec.layout_device_write_bytes, before[1] or after[1])
    return {**e, "smart": smart.to_dict()}


def nodes_endurance(nodes: dict[str, KvNodeEvidence]) -> dict[str, Any] | None:
    """Pure: the gate's endurance: its one node's (SMART included), or the sum over its nodes (harness.endurance
    .combined; each node's SMART stays in its own record)."""
    recs = [r.endurance for r in nodes.values() if r.endurance]
    if len(recs) <= 1:
        return recs[0] if recs else None
    drive = drive_rating(next(iter(nodes.values())).pool_drive)
    return combined([endurance(e["device_write_bytes"], e["served_tokens"], e["stored_kv_bytes"], e["window_s"])
                     for e in recs], drive).to_dict()


def _pool_stat(result):
    """The pool device probe's reading, or None when it named no block device (recorded in its step)."""
    try:
        return parse_pool_blockstat(result.stdout)
    except ValueError:
        return None


def _torch_dtype(dtype: str) -> str:
    """The torch attribute name of a KV dtype name from kv.DTYPE_BYTES (e.g. bf16 -> bfloat16)."""
    return {"float": "float32", "fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16",
            "fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}.get(dtype, dtype)


def _yaml(cfg: dict[str, Any]) -> str:
    import yaml
    return yaml.safe_dump(cfg, sort_keys=True)
