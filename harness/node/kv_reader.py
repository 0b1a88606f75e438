"""kvgate's KV connector reader for G1 (`kv-read`): put on a node and run there by its engine interpreter.

The interpreter needs torch and LMCache (the pinned 0.5.6), not kvgate; this file imports only the standard
library at its top. Two subcommands, each reading the same spec (a JSON file kvgate writes) and printing one
JSON document on stdout (schema ``kvgate-kv-read/1``):

``layout --spec SPEC``
    Lays the KV out in the pool through LMCache's own storage backend: an LMCache engine built from the
    LMCache YAML kvgate wrote (the fs:// pool, or local_disk), one ``store`` per prompt of
    ``chunks_per_retrieve`` chunks of seeded random KV bytes, until the backend holds every chunk
    (``contains``). Writes ``kvgate-kv-manifest.json`` into the pool (every chunk's key, file, size and
    SHA-256 of the bytes stored) and prints ``{"type": "layout", ...}``. A pool whose complete manifest has
    the spec's ``layout_id`` and whose files are all there is reused as it is.

``read --spec SPEC``
    Starts one fresh reader process per stream (``multiprocessing`` spawn: a new interpreter each), pinned to
    the stream's CPUs when given. Each builds its own LMCache engine on the same pool, reads nothing before
    the common start, then retrieves every chunk of its prompts through ``LMCacheEngine.retrieve`` (LMCache's
    batched get: the fs connector's concurrent gets, or local_disk's ``disk_io_threads`` read pool) into
    destination memory: the stream's GPU, or CPU memory (pinned when CUDA is there). After the timed phase
    each retrieved chunk's bytes are hashed and compared with the manifest. The device's
    ``/sys/dev/block/MAJ:MIN/stat`` line is read just before the common start and after every stream has
    finished reading. Prints ``{"type": "read", "streams": [...], ...}``.

``layout-read --spec SPEC [--drop-caches]``
    Both in one interpreter, for stacks whose imports are the slow part (minutes under qemu TCG): torch and
    LMCache's modules are imported once, with no engine built and the pool untouched; the layout runs in a
    process forked from that interpreter and exits (its engine and buffers go with it); with ``--drop-caches``
    the interpreter then syncs and drops the page cache itself, as the ``drop the page cache`` step does;
    the readers are forked from it too (each builds its own engine: nothing of the layout's is shared).
    Prints the layout document, with ``--drop-caches`` a ``{"type": "drop-caches", "dropped": ..., "error":
    ...}`` document, and the read document, one per line, in that order.

With the spec's ``import_vllm: false`` vLLM is made unimportable in every interpreter of the reader (``block_vllm``):
LMCache then seeds its chunk hashes with ``NONE_HASH = 0`` instead of vLLM's (the same builtin hash otherwise), and
the documents say which (``vllm_imported``, ``none_hash``).

With the spec's ``defer_imports`` (top-level module names, e.g. ``[transformers]``) each named module is replaced,
before LMCache is imported, by a stand-in (``DeferredModule``) that imports the real module at its first use:
LMCache 0.5.6's token database does ``from transformers import AutoTokenizer`` at its top and uses it only for a
segmenting token database the reader never builds, and that import pulls in torch.distributed, torch._dynamo and
sympy (more than half of the reader's import: minutes under qemu TCG). What LMCache runs is unchanged; every
document says, per deferred module, whether it stayed deferred or was imported (``deferred_imports``).

LMCache 0.5.6's local_disk keeps its index in memory only, so a fresh reader re-registers the chunk files the
layout made (key, size, shape, dtype, format from the manifest) with ``LocalDiskBackend.insert_key`` before
the start; its reads are then LMCache's own. Exit status: 0 when the document was printed (failures of a
stream are in it), 2 for a bad spec, 3 when nothing could be done.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import json
import os
import sys
import time
import traceback
import types

SCHEMA = "kvgate-kv-read/1"
SPEC_SCHEMA = "kvgate-kv-read-spec/1"
MANIFEST = "kvgate-kv-manifest.json"
BARRIER_TIMEOUT_S = 600.0  # the readers' start-up bound when the spec names no read_timeout_s


def barrier_timeout_s(spec: dict) -> float:
    """How long the readers may take to start (each spawned reader imports torch and LMCache and builds its
    engine before the barrier): the gate's ``read_timeout_s``, so a start-up the gate allows (minutes under qemu
    TCG on a loaded host) is not cut short by a bound of the reader's own."""
    return float(spec.get("read_timeout_s") or BARRIER_TIMEOUT_S)


class SpecError(ValueError):
    """The spec kvgate wrote is not usable."""


# ------------------------------------------------------------------------------------------------ helpers


def load_spec(path: str) -> dict:
    with open(path, encoding="utf-8") as fh:
        spec = json.load(fh)
    if not isinstance(spec, dict) or spec.get("schema") != SPEC_SCHEMA:
        raise SpecError(f"{path}: not a {SPEC_SCHEMA} spec")
    for key in ("lmcache_config", "backend", "pool_dir", "model_name", "kv_shape", "kv_dtype", "chunk_tokens",
                "chunks_per_retrieve", "prompts", "seed", "vocab", "streams", "layout_id", "chunk_bytes"):
        if key not in spec:
            raise SpecError(f"{path}: no {key!r}")
    if spec["backend"] not in ("fs", "local_disk"):
        raise SpecError(f"{path}: backend {spec['backend']!r} (expected fs or local_disk)")
    if not isinstance(spec.get("import_vllm", True), bool):
        raise SpecError(f"{path}: import_vllm {spec['import_vllm']!r} (expected true or false)")
    deferred = spec.get("defer_imports", [])
    if not isinstance(deferred, list) or not all(isinstance(n, str) and n.isidentifier() for n in deferred):
        raise SpecError(f"{path}: defer_imports {deferred!r} (expected a list of top-level module names)")
    return spec


def prompt_tokens(spec: dict, prompt: int):
    """The token ids of one prompt: seeded, so the layout and every reader derive the same chunk keys."""
    import torch
    g = torch.Generator().manual_seed(int(spec["seed"]) * 1_000_003 + prompt)
    n = int(spec["chunks_per_retrieve"]) * int(spec["chunk_tokens"])
    return torch.randint(0, int(spec["vocab"]), (n,), generator=g, dtype=torch.long)


def prompt_kv(spec: dict, prompt: int):
    """A prompt's KV as bytes, one row per chunk: seeded random 64-bit words (neither compressible nor
    deduplicable by the array under test)."""
    import torch
    g = torch.Generator().manual_seed(int(spec["seed"]) * 1_000_003 + prompt + 0x5EED)
    rows, width = int(spec["chunks_per_retrieve"]), int(spec["chunk_bytes"])
    if width % 8:
        raise SpecError(f"chunk_bytes {width} is not a multiple of 8")
    return torch.empty(rows * width // 8, dtype=torch.int64).random_(generator=g).view(torch.uint8).view(rows, width)


def sha256_row(row) -> str:
    return hashlib.sha256(row.contiguous().cpu().numpy().tobytes()).hexdigest()


def _flat_bytes(tensor):
    if not tensor.is_contiguous():
        raise RuntimeError(f"LMCache memory object is not contiguous (shape {tuple(tensor.shape)})")
    import torch
    return tensor.reshape(-1).view(torch.uint8)


def make_connector(spec: dict, sync=None):
    """An LMCache GPU connector between LMCache's memory objects and rows of a byte buffer (``kvcaches``: one
    row per chunk of the prompt, on the reader's GPU or in CPU memory). Copies are synchronous, so a memory
    object is never released while a copy from it is in flight."""
    import torch
    from lmcache.v1.gpu_connector.gpu_connectors import GPUConnectorInterface

    chunk = int(spec["chunk_tokens"])
    layers, kv, _, heads, dim = (int(x) for x in spec["kv_shape"])

    class KVBufferConnector(GPUConnectorInterface):
        def from_gpu(self, memory_obj, start, end, **kwargs):
            _flat_bytes(memory_obj.tensor).copy_(kwargs["kvcaches"][start // chunk])

        def to_gpu(self, memory_obj, start, end, **kwargs):
            kwargs["kvcaches"][start // chunk].copy_(_flat_bytes(memory_obj.tensor))

        def batched_from_gpu(self, memory_objs, starts, ends, **kwargs):
            for m, s, e in zip(memory_objs, starts, ends):
                self.from_gpu(m, s, e, **kwargs)

        def batched_to_gpu(self, memory_objs, starts, ends, **kwargs):
            for m, s, e in zip(memory_objs, starts, ends):
                self.to_gpu(m, s, e, **kwargs)
            if sync is not None:
                sync()

        def get_shape(self, num_tokens):
            return torch.Size([layers, kv, num_tokens, heads, dim])

        def initialize_kvcaches_ptr(self, **kwargs):
            pass

    return KVBufferConnector()


def build_engine(spec: dict, instance_id: str, connector):
    """An LMCache engine from the spec's LMCache YAML and KV shape (its storage manager exists after post_init)."""
    import torch
    from lmcache.v1.cache_engine import LMCacheEngineBuilder
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.metadata import LMCacheMetadata

    cfg = LMCacheEngineConfig.from_file(spec["lmcache_config"])
    if int(cfg.chunk_size) != int(spec["chunk_tokens"]):
        raise SpecError(f"LMCache chunk_size {cfg.chunk_size} differs from the spec's {spec['chunk_tokens']}")
    meta = LMCacheMetadata(model_name=spec["model_name"], world_size=1, local_world_size=1, worker_id=0,
                           local_worker_id=0, kv_dtype=getattr(torch, spec["kv_dtype"]),
                           kv_shape=tuple(int(x) for x in spec["kv_shape"]), use_mla=bool(spec.get("use_mla")),
                           chunk_size=int(spec["chunk_tokens"]))
    engine = LMCacheEngineBuilder.get_or_create(instance_id, cfg, meta, connector, lambda t, r: None,
                                                lambda o, r: o)
    engine.post_init()
    return engine


def pool_backend(engine, backend: str):
    """The storage backend the pool lives in (LMCache's names: RemoteBackend for fs://, LocalDiskBackend)."""
    name = {"fs": "RemoteBackend", "local_disk": "LocalDiskBackend"}[backend]
    backends = engine.storage_manager.storage_backends
    if name not in backends:
        raise RuntimeError(f"LMCache built no {name} (backends: {', '.join(backends)}); check the LMCache YAML")
    return backends[name]


def chunk_keys(engine, tokens) -> list:
    return [key for _, _, key in engine.token_database.process_tokens(tokens=tokens)]


def hash_field(name: str) -> str:
    """The chunk-hash field of an LMCache key string or of a chunk file named after one
    (``model@world@worker@HASH@dtype``, in either backend's file naming)."""
    parts = name.split("@")
    return parts[-2] if len(parts) >= 3 else ""


def versions() -> dict:
    out = {"python": sys.version.split()[0]}
    try:
        import importlib.metadata as md
        for dist in ("torch", "lmcache"):
            try:
                out[dist] = md.version(dist)
            except md.PackageNotFoundError:
                out[dist] = None
    except ImportError:
        pass
    return out


def emit(doc: dict) -> None:
    sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def read_text(path: str | None) -> str | None:
    if not path:
        return None
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


def imports_vllm(spec: dict) -> bool:
    """Whether the spec lets the reader import vLLM (``import_vllm``, default true; load_spec checked its type)."""
    return spec.get("import_vllm", True) is not False


def block_vllm(spec: dict) -> bool:
    """With the spec's ``import_vllm`` false, make vLLM unimportable in this interpreter (``sys.modules["vllm"] =
    None``: Python's own way to block an import; ``import vllm`` then raises ImportError). Call it before anything
    imports LMCache. Returns whether vLLM is blocked.

    Why: LMCache 0.5.6's token database imports vLLM (~2,000 modules, a third of the reader's import) only for
    ``NONE_HASH``, the seed of its chunk-hash chain. With the default ``pre_caching_hash_algorithm: builtin`` vLLM
    has no such function and LMCache hashes with Python's builtin ``hash`` either way; without vLLM it seeds the
    chain with ``NONE_HASH = 0``. The chunk keys differ, the read path (files, O_DIRECT, the device's bytes) does
    not. Blocking (not merely skipping the preload) matters: an importable vLLM would be imported by every reader."""
    if imports_vllm(spec):
        return False
    if sys.modules.get("vllm") is not None:
        raise SpecError("import_vllm is false, but vllm is imported already")
    sys.modules["vllm"] = None
    return True


class DeferredModule(types.ModuleType):
    """A stand-in in ``sys.modules`` for a module named by the spec's ``defer_imports``: ``from NAME import X`` binds
    X to a ``DeferredName``, and the real module is imported (``materialise``) at the first use of such a name (an
    attribute, a call, a subclass) or the first dunder asked of the stand-in (``__version__``, ``__all__``, ...);
    from then on every use is the real module's. The stand-in has no ``__path__`` (the import system asks a package
    for it before binding the names of a ``from`` import, so having one would import it there): ``import NAME.sub``
    fails with ImportError ("'NAME' is not a package"), so a path that needs more of the module fails loudly."""

    def __init__(self, name: str, spec) -> None:
        super().__init__(name)
        self.__spec__ = spec  # the real one (found, not run): importlib.util.find_spec(NAME) keeps answering
        if spec.has_location:  # inspect.getmodule asks every module in sys.modules for its __file__
            self.__file__ = spec.origin
        self.__dict__["_kvgate_real"] = None

    def materialise(self) -> types.ModuleType:
        real = self.__dict__["_kvgate_real"]
        if real is None:
            if sys.modules.get(self.__name__) is self:
                del sys.modules[self.__name__]
            real = importlib.import_module(self.__name__)
            self.__dict__["_kvgate_real"] = real
        return real

    @property
    def imported(self) -> bool:
        return self.__dict__["_kvgate_real"] is not None

    def __getattr__(self, attr: str):  # only for what the stand-in itself lacks
        if attr == "__path__":
            raise AttributeError(attr)
        if attr.startswith("__") and attr.endswith("__"):
            return getattr(self.materialise(), attr)
        return DeferredName(self, attr)


class DeferredName:
    """A name bound from a deferred module (``from NAME import X``): its first use imports the real module and is
    then the real ``X``'s (attributes, calls, a subclass statement's base)."""

    def __init__(self, module: DeferredModule, attr: str) -> None:
        self._kvgate_module, self._kvgate_attr = module, attr

    def resolve(self):
        return getattr(self._kvgate_module.materialise(), self._kvgate_attr)

    def __getattr__(self, attr: str):
        if attr.startswith("_kvgate_"):
            raise AttributeError(attr)
        return getattr(self.resolve(), attr)

    def __call__(self, *args, **kwargs):
        return self.resolve()(*args, **kwargs)

    def __mro_entries__(self, bases):
        return (self.resolve(),)

    def __repr__(self) -> str:
        return f"<deferred {self._kvgate_module.__name__}.{self._kvgate_attr}>"


def defer_imports(spec: dict) -> dict[str, str]:
    """Put a ``DeferredModule`` in ``sys.modules`` for each module the spec's ``defer_imports`` names (call it before
    anything imports LMCache). A module imported already, or not installed, is left as it is. Returns each name's
    state (``deferred_record``)."""
    for name in spec.get("defer_imports") or ():
        if name in sys.modules:
            continue
        found = importlib.util.find_spec(name)
        if found is not None:
            sys.modules[name] = DeferredModule(name, found)
    return deferred_record(spec)


def deferred_record(spec: dict) -> dict[str, str]:
    """Each module the spec defers: ``deferred`` (its stand-in still stands: never used in this process),
    ``imported`` (the real module is in this process: a use of the stand-in imported it, or it was imported before
    the stand-in could be put), or ``absent`` (not installed)."""
    out = {}
    for name in spec.get("defer_imports") or ():
        mod = sys.modules.get(name)
        if isinstance(mod, DeferredModule):
            out[name] = "imported" if mod.imported else "deferred"
        else:
            out[name] = "absent" if mod is None else "imported"
    return out


def hash_seed_record() -> dict:
    """Whether vLLM is imported in this interpreter and the ``NONE_HASH`` LMCache's token database seeds its chunk
    hashes with (from vLLM, else 0), for the documents: call it after an engine was built."""
    out: dict = {"vllm_imported": sys.modules.get("vllm") is not None}
    td = sys.modules.get("lmcache.v1.token_database")
    if td is not None and isinstance(getattr(td, "NONE_HASH", None), int):
        out["none_hash"] = int(td.NONE_HASH)
    return out


def destroy(instance_id: str) -> None:
    try:
        from lmcache.v1.cache_engine import LMCacheEngineBuilder
        LMCacheEngineBuilder.destroy(instance_id)
    except Exception:  # noqa: BLE001 - closing LMCache is best effort; the process exits next
        pass


# ------------------------------------------------------------------------------------------------- layout


def load_manifest(pool_dir: str) -> dict | None:
    try:
        with open(os.path.join(pool_dir, MANIFEST), encoding="utf-8") as fh:
            m = json.load(fh)
        return m if isinstance(m, dict) else None
    except (OSError, ValueError):
        return None


def manifest_intact(m: dict | None, spec: dict) -> bool:
    """A complete manifest for this layout whose every chunk file is there with its recorded size."""
    if not m or not m.get("complete") or m.get("layout_id") != spec["layout_id"]:
        return False
    for c in m.get("chunks", []):
        try:
            if os.path.getsize(os.path.join(spec["pool_dir"], c["file"])) != c["file_bytes"]:
                return False
        except (OSError, KeyError, TypeError):
            return False
    return len(m.get("chunks", [])) == int(spec["prompts"]) * int(spec["chunks_per_retrieve"])


def remove_listed(pool_dir: str, m: dict | None) -> int:
    """Remove the chunk files an earlier kvgate manifest lists (only those) and the manifest itself."""
    n = 0
    for c in (m or {}).get("chunks", []):
        name = c.get("file") if isinstance(c, dict) else None
        if not name or "/" in name or name.startswith("."):
            continue
        for path in (os.path.join(pool_dir, name), os.path.join(pool_dir, os.path.splitext(name)[0] + ".tmp")):
            try:
                os.remove(path)
                n += 1
            except OSError:
                pass
    try:
        os.remove(os.path.join(pool_dir, MANIFEST))
    except OSError:
        pass
    return n


def write_manifest(pool_dir: str, m: dict) -> None:
    tmp = os.path.join(pool_dir, MANIFEST + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(m, fh, separators=(",", ":"))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, os.path.join(pool_dir, MANIFEST))


def _store_prompt(spec: dict, engine, backend, p: int, timeout_s: float) -> list:
    """Store one prompt's KV through LMCache, wait until the backend holds it, return its chunks' manifest entries."""
    pool = spec["pool_dir"]
    tokens = prompt_tokens(spec, p)
    keys = chunk_keys(engine, tokens)
    kv = prompt_kv(spec, p)
    if len(keys) != kv.shape[0]:
        raise RuntimeError(f"prompt {p}: LMCache made {len(keys)} chunks, expected {kv.shape[0]}")
    before = set(os.listdir(pool))
    engine.store(tokens, kvcaches=kv)
    deadline = time.monotonic() + timeout_s
    while not all(backend.contains(k) for k in keys):
        if time.monotonic() > deadline:
            missing = [k.to_string() for k in keys if not backend.contains(k)]
            raise RuntimeError(f"prompt {p}: LMCache did not store {len(missing)} chunk(s) within "
                               f"{timeout_s:g} s, first {missing[0]}")
        time.sleep(0.01)
    new = {hash_field(n): n for n in set(os.listdir(pool)) - before
           if n.endswith((".data", ".pt"))}
    entries = []
    for i, (key, row) in enumerate(zip(keys, kv)):
        ks = key.to_string()
        name = new.get(hash_field(ks))
        if name is None:
            raise RuntimeError(f"prompt {p}: no chunk file for key {ks} appeared in {pool}")
        entry = {"prompt": p, "index": i, "key": ks, "file": name,
                 "file_bytes": os.path.getsize(os.path.join(pool, name)), "sha256": sha256_row(row)}
        meta = getattr(backend, "dict", {}).get(key) if spec["backend"] == "local_disk" else None
        if meta is not None:  # what a fresh reader re-registers with LocalDiskBackend.insert_key
            entry["disk"] = {"size": int(meta.size), "shape": [int(x) for x in meta.shape],
                             "dtype": str(meta.dtype).replace("torch.", ""),
                             "fmt": getattr(meta.fmt, "name", None)}
        entries.append(entry)
    return entries


def layout(spec: dict) -> dict:
    pool = spec["pool_dir"]
    os.makedirs(pool, exist_ok=True)
    t0 = time.perf_counter()
    old = load_manifest(pool)
    chunks_total = int(spec["prompts"]) * int(spec["chunks_per_retrieve"])
    if manifest_intact(old, spec):
        return {"schema": SCHEMA, "type": "layout", "reused": True, "pool_dir": pool, "layout_id": spec["layout_id"],
                "chunks": len(old["chunks"]), "kv_bytes": chunks_total * int(spec["chunk_bytes"]),
                "file_bytes": sum(c["file_bytes"] for c in old["chunks"]), "elapsed_s": time.perf_counter() - t0,
                "files": old["chunks"], "versions": versions(), "deferred_imports": deferred_record(spec),
                **{k: old[k] for k in ("vllm_imported", "none_hash") if k in old}}
    removed = remove_listed(pool, old)
    need = chunks_total * (int(spec["chunk_bytes"]) + 4096)
    free = os.statvfs(pool).f_bavail * os.statvfs(pool).f_frsize
    if free < need:
        raise RuntimeError(f"{pool} has {free} bytes free, the layout needs {need}")
    manifest = {"schema": SCHEMA, "layout_id": spec["layout_id"], "complete": False, "backend": spec["backend"],
                "model_name": spec["model_name"], "chunk_bytes": int(spec["chunk_bytes"]), "chunks": []}
    write_manifest(pool, manifest)
    instance = f"kvgate-kv-layout-{os.getpid()}"
    t_init = time.perf_counter()
    engine = build_engine(spec, instance, make_connector(spec))
    init_s = time.perf_counter() - t_init
    manifest.update(hash_seed_record())  # the keys depend on it: a reader must derive them with the same seed
    try:
        backend = pool_backend(engine, spec["backend"])
        timeout_s = float(spec.get("store_timeout_s", 600))
        for p in range(int(spec["prompts"])):
            manifest["chunks"].extend(_store_prompt(spec, engine, backend, p, timeout_s))
        store_s = time.perf_counter() - t_init - init_s
        os.sync()  # the chunk files are clean in the page cache, so dropping it (or fadvise) evicts them
        manifest["complete"] = True
        write_manifest(pool, manifest)
    finally:
        destroy(instance)
    return {"schema": SCHEMA, "type": "layout", "reused": False, "pool_dir": pool, "layout_id": spec["layout_id"],
            "chunks": len(manifest["chunks"]), "kv_bytes": chunks_total * int(spec["chunk_bytes"]),
            "file_bytes": sum(c["file_bytes"] for c in manifest["chunks"]), "removed_stale_files": removed,
            "elapsed_s": time.perf_counter() - t0, "engine_init_s": init_s, "store_s": store_s,
            "files": manifest["chunks"], "versions": versions(), "deferred_imports": deferred_record(spec),
            **{k: manifest[k] for k in ("vllm_imported", "none_hash") if k in manifest}}


# --------------------------------------------------------------------------------------------------- read


def _reader_device(spec: dict, stream: dict):
    """The reader's destination device and the sync after each retrieve (a CUDA sync on a GPU, none on CPU)."""
    import torch
    device, sync = torch.device("cpu"), None
    if spec.get("destination") == "gpu":
        if not torch.cuda.is_available():
            raise RuntimeError(f"destination gpu, but torch {torch.__version__} sees no CUDA device")
        device = torch.device("cuda", int(stream["gpu"]))
        torch.cuda.set_device(device)
        sync = lambda: torch.cuda.synchronize(device)  # noqa: E731
    return device, sync


def _keyed_chunks(engine, prompts: list, tokens: dict, by_key: dict) -> list:
    """(key, manifest entry) pairs for the reader's prompts, checking this reader derives the layout's keys."""
    keyed = []
    for p in prompts:
        for j, key in enumerate(chunk_keys(engine, tokens[p])):
            c = by_key.get((p, j))
            if c is None or key.to_string() != c["key"]:
                raise RuntimeError(f"prompt {p} chunk {j}: this reader derives key {key.to_string()}, the "
                                   f"layout stored {c and c['key']} (are PYTHONHASHSEED and import_vllm the same?)")
            keyed.append((key, c))
    return keyed


def _destination(spec: dict, device, rows: int):
    """The destination rows, zeroed so every page is faulted in before the clock, and whether they are pinned."""
    import torch
    pinned = device.type == "cpu" and torch.cuda.is_available()
    dst = torch.empty((rows, int(spec["chunk_bytes"])), dtype=torch.uint8, device=device, pin_memory=pinned)
    dst.zero_()  # fault every page in before the clock starts
    return dst, pinned


def _verify_reads(spec: dict, prompts: list, masks: dict, dst, by_key: dict) -> dict:
    """The stream's verification fields: chunks retrieved, their bytes, hash mismatches and missing keys."""
    per, chunk = int(spec["chunks_per_retrieve"]), int(spec["chunk_tokens"])
    retrieved, mismatches, missing = 0, [], []
    for i, p in enumerate(prompts):
        for j in range(per):
            c = by_key.get((p, j))
            if c is None:
                continue
            if not bool(masks[p][j * chunk:(j + 1) * chunk].all()):
                missing.append(c["key"])
                continue
            retrieved += 1
            got = sha256_row(dst[i * per + j])
            if got != c["sha256"]:
                mismatches.append({"key": c["key"], "file": c["file"], "expected_sha256": c["sha256"],
                                   "actual_sha256": got})
    return {"chunks_retrieved": retrieved, "kv_bytes": retrieved * int(spec["chunk_bytes"]),
            "mismatches": mismatches, "missing": missing}


def _abort_barriers(*barriers) -> None:
    """Break the barriers so the parent and the other readers stop waiting for a reader that failed."""
    for b in barriers:
        try:
            b.abort()
        except Exception:  # noqa: BLE001
            pass


def _child(spec: dict, stream: dict, chunks: list, ready, go, results) -> None:
    """One reader process: everything before the common start is preparation; the timed phase is the
    retrieves; verification follows it."""
    t_begin = time.perf_counter()
    label = stream["label"]
    out = {"label": label, "gpu": stream.get("gpu"), "cpus": stream.get("cpus"), "pid": os.getpid(),
           "chunks": len(chunks), "error": None}
    instance = f"kvgate-kv-read-{label}-{os.getpid()}"
    built = False
    try:
        block_vllm(spec)  # a spawned reader is a fresh interpreter; a forked one has it blocked already
        defer_imports(spec)  # likewise
        if stream.get("cpus"):
            os.sched_setaffinity(0, parse_cpulist(stream["cpus"]))
        out["cpus_used"] = format_cpulist(sorted(os.sched_getaffinity(0)))
        device, sync = _reader_device(spec, stream)
        built = True
        engine = build_engine(spec, instance, make_connector(spec, sync))
        prompts = sorted({c["prompt"] for c in chunks})
        per = int(spec["chunks_per_retrieve"])
        tokens = {p: prompt_tokens(spec, p) for p in prompts}
        by_key = {(c["prompt"], c["index"]): c for c in chunks}
        keyed = _keyed_chunks(engine, prompts, tokens, by_key)
        out.update(hash_seed_record())
        if spec["backend"] == "local_disk":
            register_local_disk(engine, keyed)
        dst, pinned = _destination(spec, device, len(prompts) * per)
        out["destination"] = f"{device}" + (" (pinned)" if pinned else "")
        if spec.get("fadvise_dontneed", True):
            out["fadvise_dontneed"] = evict_files(spec["pool_dir"], chunks)
        out["prepare_s"] = time.perf_counter() - t_begin
        ready.wait(BARRIER_TIMEOUT_S)
        go.wait(BARRIER_TIMEOUT_S)
        out["start_unix_s"] = time.time()
        calls = []
        masks = {}
        t_first = time.perf_counter()
        for i, p in enumerate(prompts):
            t0 = time.perf_counter()
            mask = engine.retrieve(tokens[p], kvcaches=dst[i * per:(i + 1) * per], req_id=f"{label}-{p}")
            if sync is not None:
                sync()
            t1 = time.perf_counter()
            masks[p] = mask
            calls.append(t1 - t0)
        t_last = time.perf_counter()
        out["end_unix_s"] = time.time()
        out["read_s"] = t_last - t_first
        out["retrieve_s"] = calls
        out.update(_verify_reads(spec, prompts, masks, dst, by_key))
    except Exception as exc:  # noqa: BLE001 - a stream's failure is data in the document
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()[-4000:]
        _abort_barriers(ready, go)
    finally:
        out["deferred_imports"] = deferred_record(spec)  # after the reads: whether anything of them used one
        results.put(out)
        results.close()
        results.join_thread()  # the record is in the pipe before the process ends
        if built:
            destroy(instance)
    os._exit(0)  # LMCache leaves non-daemon threads behind


def register_local_disk(engine, keyed: list) -> None:
    """LMCache 0.5.6's local_disk index lives in memory: tell a fresh engine which chunk files the layout made
    (``keyed``: (key, manifest entry) pairs)."""
    import torch
    from lmcache.v1.memory_management import MemoryFormat
    backend = pool_backend(engine, "local_disk")
    for key, c in keyed:
        d = c.get("disk")
        if not d:
            raise SpecError(f"manifest has no local_disk record for {c['key']}")
        fmt = MemoryFormat[d["fmt"]] if d.get("fmt") else None
        backend.insert_key(key, int(d["size"]), torch.Size(d["shape"]), getattr(torch, d["dtype"]), fmt)


def evict_files(pool_dir: str, chunks: list) -> bool:
    """Ask the kernel to drop the chunk files' cached pages (clean pages go; no privilege needed)."""
    ok = True
    for c in chunks:
        try:
            fd = os.open(os.path.join(pool_dir, c["file"]), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        except OSError:
            ok = False
    return ok


def parse_cpulist(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        a, _, b = part.partition("-")
        cpus.update(range(int(a), int(b or a) + 1))
    return cpus


def format_cpulist(cpus: list[int]) -> str:
    out, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)


def read(spec: dict, start_method: str = "spawn") -> dict:
    import multiprocessing as mp
    import queue as queue_mod

    pool = spec["pool_dir"]
    m = load_manifest(pool)
    if not manifest_intact(m, spec):
        raise RuntimeError(f"{pool}: no complete layout {spec['layout_id']} (run layout first)")
    by_prompt: dict[int, list] = {}
    for c in m["chunks"]:
        by_prompt.setdefault(int(c["prompt"]), []).append(c)
    ctx = mp.get_context(start_method)
    n = len(spec["streams"])
    ready, go = ctx.Barrier(n + 1), ctx.Barrier(n + 1)
    results = ctx.Queue()
    procs = []
    for s in spec["streams"]:
        chunks = [c for p in s["prompts"] for c in sorted(by_prompt.get(int(p), []), key=lambda c: c["index"])]
        proc = ctx.Process(target=_child, args=(spec, s, chunks, ready, go, results), name=f"kv-read-{s['label']}")
        proc.start()
        procs.append(proc)
    doc = {"schema": SCHEMA, "type": "read", "pool_dir": pool, "layout_id": spec["layout_id"],
           "backend": spec["backend"], "device_stat_path": spec.get("device_stat"), "errors": [],
           "versions": versions(), "start_method": start_method,
           "import_vllm": imports_vllm(spec)}
    started = False
    try:
        ready.wait(barrier_timeout_s(spec))
        doc["device_stat_before"] = read_text(spec.get("device_stat"))
        doc["go_unix_s"] = time.time()
        go.wait(BARRIER_TIMEOUT_S)
        started = True
    except Exception as exc:  # noqa: BLE001 - a reader that failed to prepare breaks the barrier
        doc["errors"].append(f"readers did not all start: {type(exc).__name__}")
    streams, deadline = [], time.monotonic() + float(spec.get("read_timeout_s", 3600))
    while len(streams) < n and time.monotonic() < deadline:
        try:
            streams.append(results.get(timeout=1.0))
        except queue_mod.Empty:
            if not any(p.is_alive() for p in procs) and results.empty():
                break
    doc["device_stat_after"] = read_text(spec.get("device_stat")) if started else None
    for p in procs:
        p.join(60)
        if p.is_alive():
            p.kill()
            doc["errors"].append(f"{p.name} did not exit; killed")
    got = {s["label"] for s in streams}
    for s in spec["streams"]:
        if s["label"] not in got:
            streams.append({"label": s["label"], "gpu": s.get("gpu"), "error": "reader reported nothing"})
    order = [s["label"] for s in spec["streams"]]
    doc["streams"] = sorted(streams, key=lambda s: order.index(s["label"]))
    return doc


# ---------------------------------------------------------------------------------------------- layout-read

PRELOAD = ("torch", "lmcache.v1.cache_engine", "lmcache.v1.config", "lmcache.v1.metadata",
           "lmcache.v1.memory_management", "lmcache.v1.gpu_connector.gpu_connectors", "lmcache.v1.token_database",
           "lmcache.v1.storage_backend")
# imported by LMCache 0.5.6 while it builds an engine (the token database's hash function and NONE_HASH, from vLLM
# where vLLM is installed: ~2,000 modules, most of an engine's build time), where they are there, unless the spec
# blocks vLLM (import_vllm: false)
PRELOAD_IF_PRESENT = ("vllm.v1.core.kv_cache_utils", "vllm.utils.hashing")


def preload(import_vllm: bool = True) -> float:
    """Import what the layout and the readers use, and nothing else (no engine, no CUDA, no pool access), so
    processes forked from here start with it imported. Returns the seconds it took.

    The cyclic garbage collector is off while the ~5,000 modules import (each full collection walks the whole
    heap they build up, again and again: on the host it is a sixth of the import, under qemu TCG more), then one
    collection, and what is left is frozen (``gc.freeze``): never walked again, and the forked layout and readers
    do not touch, so do not copy, its pages. Without ``import_vllm`` (vLLM blocked: ``block_vllm``) PRELOAD_IF_PRESENT
    is skipped."""
    import gc
    import importlib
    t0 = time.perf_counter()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for name in PRELOAD:
            importlib.import_module(name)
        for name in PRELOAD_IF_PRESENT if import_vllm else ():
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - LMCache falls back to its own hash without it, and so do we
                pass
    finally:
        gc.collect()
        gc.freeze()
        if was_enabled:
            gc.enable()
    return time.perf_counter() - t0


def in_forked_child(fn, *args) -> dict:
    """``fn(*args)``'s document, computed in a process forked from this one (which exits when it is done, taking
    whatever ``fn`` built with it); an exception or a child that died is an ``error`` document."""
    rfd, wfd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: one JSON document into the pipe, then out without running the parent's cleanup
        os.close(rfd)
        try:
            doc = fn(*args)
        except Exception as exc:  # noqa: BLE001 - the parent reports it
            traceback.print_exc()
            doc = {"error": f"{type(exc).__name__}: {exc}"}
        with os.fdopen(wfd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, separators=(",", ":"))
        sys.stderr.flush()
        os._exit(0)
    os.close(wfd)
    with os.fdopen(rfd, encoding="utf-8") as fh:
        text = fh.read()
    _, status = os.waitpid(pid, 0)
    try:
        doc = json.loads(text)
    except ValueError:
        code = os.waitstatus_to_exitcode(status)
        doc = {"error": f"the forked process printed no document (exit status {code})"}
    return doc if isinstance(doc, dict) else {"error": "the forked process printed no object"}


def drop_page_cache() -> dict:
    """``sync``, then drop the page cache (what the controller's ``sync && echo 3 > /proc/sys/vm/drop_caches``
    step does); a refusal (not root, a read-only /proc) is recorded, not raised."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w", encoding="ascii") as fh:
            fh.write("3\n")
        return {"dropped": True, "error": None}
    except OSError as exc:
        return {"dropped": False, "error": f"{type(exc).__name__}: {exc}"}


def layout_read(spec: dict, drop_caches: bool) -> dict:
    """``layout-read``: prints the layout and drop-caches documents as they are known, returns the read's."""
    try:
        import_s = preload(imports_vllm(spec))
    except Exception as exc:  # noqa: BLE001 - both documents say why
        traceback.print_exc()
        err = f"{type(exc).__name__}: {exc}"
        emit({"schema": SCHEMA, "type": "layout", "error": f"import: {err}"})
        return {"schema": SCHEMA, "type": "read", "error": f"not read: the import failed ({err})"}
    lay = in_forked_child(layout, spec)
    lay = {**lay, "schema": SCHEMA, "type": "layout", "import_s": import_s}
    emit(lay)
    if lay.get("error"):
        return {"schema": SCHEMA, "type": "read", "error": f"not read: the layout failed ({lay['error']})"}
    if drop_caches:
        emit({"schema": SCHEMA, "type": "drop-caches", **drop_page_cache()})
    return read(spec, start_method="fork")


# --------------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kv_reader.py", description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=("layout", "read", "layout-read"))
    ap.add_argument("--spec", required=True)
    ap.add_argument("--drop-caches", action="store_true", help="layout-read: drop the page cache between them")
    args = ap.parse_args(argv)
    try:
        spec = load_spec(args.spec)
    except (OSError, ValueError) as exc:
        print(f"kv_reader: {exc}", file=sys.stderr)
        return 2
    os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")
    try:
        block_vllm(spec)  # before anything imports LMCache
        defer_imports(spec)
        if args.command == "layout-read":
            doc = layout_read(spec, args.drop_caches)
        else:
            doc = layout(spec) if args.command == "layout" else read(spec)
    except Exception as exc:  # noqa: BLE001 - the orchestrator reads the one line and the traceback
        traceback.print_exc()
        kind = "read" if args.command == "layout-read" else args.command
        emit({"schema": SCHEMA, "type": kind, "error": f"{type(exc).__name__}: {exc}"})
        return 3
    emit(doc)
    return 0


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)  # LMCache leaves non-daemon threads behind
