"""The KV connector reader's output (harness/node/kv_reader.py, ``kvgate-kv-read/1``) and the pool's device, parsed
(pure).

The reader prints one JSON document per phase on stdout (LMCache logs to stderr); ``layout`` describes the chunk
files LMCache wrote, ``drop-caches`` (``layout-read`` only) whether its interpreter dropped the page cache,
``read`` every reader process's retrieves and the device's ``/sys/dev/block/MAJ:MIN/stat``
line before the common start and after the last read. Bandwidth is decimal: GB/s = 1e9 bytes per second.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..errors import WorkloadError
from .blockdev import BlockStat, parse_block_stat

SCHEMA = "kvgate-kv-read/1"


def _line_document(line: str) -> dict[str, Any] | None:
    """One stdout line as a ``kvgate-kv-read/1`` document with a type, or None."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        doc = json.loads(line)
    except (ValueError, RecursionError):
        return None
    ok = isinstance(doc, dict) and doc.get("schema") == SCHEMA and isinstance(doc.get("type"), str)
    return doc if ok else None


def _document(text: str, kind: str) -> dict[str, Any]:
    """The reader's JSON document: the last stdout line that is a ``kvgate-kv-read/1`` object of ``kind``."""
    for line in reversed(text.splitlines()):
        doc = _line_document(line)
        if doc is not None and doc["type"] == kind:
            return doc
    raise WorkloadError(f"the KV reader printed no {kind} document (see its stderr)")


def split_documents(text: str) -> dict[str, str]:
    """``kv_reader.py layout-read``'s stdout split by document type (layout, drop-caches, read): each type's
    lines, the document and any line before it since the previous document, so each phase's raw file reads as
    that phase's own output would."""
    out: dict[str, str] = {}
    pending: list[str] = []
    for line in text.splitlines(keepends=True):
        pending.append(line)
        doc = _line_document(line)
        if doc is not None:
            out[doc["type"]] = out.get(doc["type"], "") + "".join(pending)
            pending = []
    if pending and out:
        last = list(out)[-1]
        out[last] += "".join(pending)
    return out


@dataclass(frozen=True)
class DropCaches:
    """Whether the reader's interpreter dropped the page cache, and why not."""

    dropped: bool
    error: str | None = None


def parse_drop_caches(text: str) -> DropCaches:
    """The page-cache drop ``kv_reader.py layout-read --drop-caches`` did between the layout and the read; no
    document is a drop that did not happen (recorded, not raised)."""
    try:
        d = _document(text, "drop-caches")
    except WorkloadError as exc:
        return DropCaches(dropped=False, error=str(exc))
    dropped = d.get("dropped") is True
    return DropCaches(dropped=dropped, error=None if dropped else str(d.get("error") or "not dropped"))


def _num(d: dict[str, Any], key: str, default: float | None = None) -> float | None:
    v = d.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise WorkloadError(f"KV reader output: {key} is not a number ({v!r})")
    return float(v)


def _int(d: dict[str, Any], key: str, default: int = 0) -> int:
    v = _num(d, key, default)
    return int(v) if v is not None else default


@dataclass(frozen=True)
class ChunkFile:
    """One chunk LMCache stored: the prompt and chunk index it belongs to, its key and its file in the pool."""

    prompt: int
    index: int
    key: str
    file: str
    file_bytes: int


@dataclass(frozen=True)
class Layout:
    """What ``kv_reader.py layout`` did: the chunk files in the pool, and whether an earlier layout was reused."""

    reused: bool
    chunks: int
    kv_bytes: int
    file_bytes: int
    elapsed_s: float
    files: tuple[ChunkFile, ...]
    engine_init_s: float | None = None
    versions: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    vllm_imported: bool | None = None  # whether the layout's interpreter had vLLM (LMCache's NONE_HASH from it)
    none_hash: int | None = None  # the seed of LMCache's chunk-hash chain: vLLM's, else 0
    # each module the spec deferred (defer_imports): "deferred", "imported" or "absent" in the layout's process
    deferred_imports: dict[str, str] = field(default_factory=dict)


DEFERRED_STATES = ("deferred", "imported", "absent")


def parse_deferred(v: Any) -> dict[str, str]:
    """A document's ``deferred_imports`` (module name -> deferred / imported / absent); {} when absent (an older
    reader, nothing deferred); WorkloadError when it is there but malformed."""
    if v is None:
        return {}
    if not isinstance(v, dict) or not all(isinstance(k, str) and s in DEFERRED_STATES for k, s in v.items()):
        raise WorkloadError(f"KV reader: deferred_imports is malformed ({str(v)[:200]!r})")
    return dict(v)


def parse_layout(text: str) -> Layout:
    """Parse ``kv_reader.py layout`` stdout; a document carrying ``error`` parses (the caller reports it)."""
    d = _document(text, "layout")
    if d.get("error"):
        return Layout(False, 0, 0, 0, 0.0, (), error=str(d["error"]))
    try:
        files = tuple(ChunkFile(int(c["prompt"]), int(c["index"]), str(c["key"]), str(c["file"]), int(c["file_bytes"]))
                      for c in d.get("files") or [])
    except (KeyError, TypeError, ValueError) as exc:
        raise WorkloadError(f"KV reader layout: a chunk record is malformed ({type(exc).__name__}: {exc})") from None
    return Layout(reused=bool(d.get("reused")), chunks=_int(d, "chunks"), kv_bytes=_int(d, "kv_bytes"),
                  file_bytes=_int(d, "file_bytes"), elapsed_s=_num(d, "elapsed_s", 0.0) or 0.0, files=files,
                  engine_init_s=_num(d, "engine_init_s"), versions=dict(d.get("versions") or {}),
                  vllm_imported=d["vllm_imported"] if isinstance(d.get("vllm_imported"), bool) else None,
                  none_hash=_whole(d.get("none_hash")), deferred_imports=parse_deferred(d.get("deferred_imports")))


def _whole(v: Any) -> int | None:
    """An integer field of the reader's output, or None when absent or not an integer."""
    return v if isinstance(v, int) and not isinstance(v, bool) else None


@dataclass(frozen=True)
class Mismatch:
    """A chunk whose bytes read back differ from what was stored."""

    key: str
    file: str
    expected_sha256: str
    actual_sha256: str


@dataclass(frozen=True)
class ReaderStream:
    """One reader process (a GPU or a read stream): what it retrieved, how long the retrieves took, what differed."""

    label: str
    gpu: int | None
    chunks: int
    chunks_retrieved: int
    kv_bytes: int
    read_s: float | None
    retrieve_s: tuple[float, ...] = ()
    mismatches: tuple[Mismatch, ...] = ()
    missing: tuple[str, ...] = ()
    destination: str | None = None
    cpus: str | None = None
    cpus_used: str | None = None
    prepare_s: float | None = None
    start_unix_s: float | None = None
    end_unix_s: float | None = None
    error: str | None = None
    deferred_imports: dict[str, str] = field(default_factory=dict)  # as Layout's, in the reader's process

    @property
    def read_gb_s(self) -> float | None:
        """KV bytes retrieved over the time from the first retrieve's start to the last one's end."""
        if self.error or not self.read_s or self.read_s <= 0:
            return None
        return self.kv_bytes / self.read_s / 1e9


@dataclass(frozen=True)
class ReadRun:
    """What ``kv_reader.py read`` did: every stream, and the pool device's stat line around the reads."""

    streams: tuple[ReaderStream, ...]
    device_stat_before: BlockStat | None
    device_stat_after: BlockStat | None
    errors: tuple[str, ...] = ()
    versions: dict[str, Any] = field(default_factory=dict)
    go_unix_s: float | None = None
    error: str | None = None
    start_method: str | None = None  # how the reader processes started: spawn (a fresh interpreter) or fork

    @property
    def device_read_bytes(self) -> int | None:
        """Bytes the pool's device read while the readers read (None where the device could not be read)."""
        if self.device_stat_before is None or self.device_stat_after is None:
            return None
        return self.device_stat_after.read_bytes - self.device_stat_before.read_bytes

    @property
    def kv_bytes(self) -> int:
        return sum(s.kv_bytes for s in self.streams)


def _stat(v: Any) -> BlockStat | None:
    if not isinstance(v, str) or not v.strip():
        return None
    try:
        return parse_block_stat(v)
    except ValueError:
        return None


def _stream(s: Any) -> ReaderStream:
    if not isinstance(s, dict) or not isinstance(s.get("label"), str):
        raise WorkloadError(f"KV reader read: a stream record is malformed ({str(s)[:200]!r})")
    gpu = s.get("gpu")
    try:
        mism = tuple(Mismatch(str(m["key"]), str(m.get("file", "")), str(m["expected_sha256"]),
                              str(m["actual_sha256"])) for m in s.get("mismatches") or [])
        calls = tuple(float(x) for x in s.get("retrieve_s") or [])
    except (KeyError, TypeError, ValueError) as exc:
        raise WorkloadError(f"KV reader read: stream {s['label']}: {type(exc).__name__}: {exc}") from None
    return ReaderStream(
        label=s["label"], gpu=gpu if isinstance(gpu, int) and not isinstance(gpu, bool) else None,
        chunks=_int(s, "chunks"), chunks_retrieved=_int(s, "chunks_retrieved"), kv_bytes=_int(s, "kv_bytes"),
        read_s=_num(s, "read_s"), retrieve_s=calls, mismatches=mism,
        missing=tuple(str(k) for k in s.get("missing") or []), destination=s.get("destination"),
        cpus=s.get("cpus"), cpus_used=s.get("cpus_used"), prepare_s=_num(s, "prepare_s"),
        start_unix_s=_num(s, "start_unix_s"), end_unix_s=_num(s, "end_unix_s"),
        error=str(s["error"]) if s.get("error") else None, deferred_imports=parse_deferred(s.get("deferred_imports")))


def parse_read(text: str) -> ReadRun:
    """Parse ``kv_reader.py read`` stdout; a document carrying ``error`` parses (the caller reports it)."""
    d = _document(text, "read")
    if d.get("error"):
        return ReadRun((), None, None, error=str(d["error"]))
    streams = d.get("streams")
    if not isinstance(streams, list):
        raise WorkloadError("KV reader read: no streams")
    return ReadRun(streams=tuple(_stream(s) for s in streams), device_stat_before=_stat(d.get("device_stat_before")),
                   device_stat_after=_stat(d.get("device_stat_after")),
                   errors=tuple(str(e) for e in d.get("errors") or []), versions=dict(d.get("versions") or {}),
                   go_unix_s=_num(d, "go_unix_s"),
                   start_method=str(d["start_method"]) if d.get("start_method") in ("spawn", "fork") else None)
