"""Corrupt a stored KV file on purpose: flip bits of one byte inside a tensor's data of safetensors files in a
pool, so g2-answer can show that a corrupted tier never passes its answer check.

Runs on the engine's node (Python standard library only): ``python3 kv_flip.py POOL_DIR [--pattern GLOB]
[--files N] [--offset middle|BYTES] [--xor MASK]``. It takes the ``N`` files under ``POOL_DIR`` matching ``GLOB``
written last (newest modification time first, then path): the pool also holds a warm-up prompt's KV, stored first and
never read back, and a flip there would prove nothing. In each it takes the first tensor of the safetensors header
(by data offset). ``--offset middle``: the high byte of the tensor's middle element (for a 2-byte little-endian
float, bf16 or fp16, the byte with its sign and top exponent bits); a number: that byte of the tensor's data.
The byte is XORed with ``MASK`` (default 0x40: bf16's top exponent bit, which turns a KV value below 2 in
magnitude into one of about 2**128 times it: a flip the model's output cannot hide; a low mantissa bit may
change nothing a test can see). The header itself is never touched. ``--format raw`` (a connector whose chunk files
are a tensor's bytes, e.g. LMCache's ``naive`` serde, after a small metadata header): the data runs to the file's
end, of ``--item-bytes`` elements; ``middle`` is the high byte of the element in its middle, counted from the end.
The file is written in place, fsynced and its pages dropped (the read-back must read the flipped byte from the
device).

One JSON line per file on standard output: ``{"file", "tensor", "dtype", "shape", "data_start", "data_bytes",
"offset_in_data", "offset_in_file", "before", "after"}``; a file it could not flip: ``{"file", "error"}``; exit 1
when no file was flipped. harness/workloads/g2_answer.py parses it (``parse_flip_output``).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import struct
import sys

ITEM_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I8": 1, "U8": 1, "I16": 2, "I32": 4, "I64": 8, "BOOL": 1}


def flip_target(header: dict, header_len: int, offset: str) -> dict:
    """Pure: where to flip in a safetensors file with this JSON ``header`` (its length ``header_len``): the first
    tensor by data offset, the byte ``offset`` names ("middle" or a number) within its data. ValueError when the
    file has no tensor with data, or the offset is outside it."""
    tensors = sorted(((k, v) for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)),
                     key=lambda kv: kv[1]["data_offsets"][0])
    tensors = [(k, v) for k, v in tensors if v["data_offsets"][1] > v["data_offsets"][0]]
    if not tensors:
        raise ValueError("no tensor with data in the header")
    name, t = tensors[0]
    begin, end = t["data_offsets"]
    size = end - begin
    item = ITEM_BYTES.get(t.get("dtype", ""), 1)
    if offset == "middle":
        elements = size // item
        at = (elements // 2) * item + item - 1  # little-endian: the element's last byte holds sign and exponent
    else:
        at = int(offset)
    if not 0 <= at < size:
        raise ValueError(f"offset {at} outside tensor {name}'s {size} data bytes")
    data_start = 8 + header_len
    return {"tensor": name, "dtype": t.get("dtype"), "shape": t.get("shape"), "data_start": data_start,
            "data_bytes": size, "offset_in_data": at, "offset_in_file": data_start + begin + at}


def newest_first(paths: list[str]) -> list[str]:
    """The files written last first (modification time in ns, then path for equal times)."""
    return sorted(paths, key=lambda p: (-os.stat(p).st_mtime_ns, p))


def raw_target(size: int, offset: str, item_bytes: int) -> dict:
    """Pure: where to flip in a file whose tensor data of ``item_bytes`` elements runs to its end (a connector may put
    a small header before it: "middle" counts elements from the end, so it lands on an element's high byte
    whatever the header's length). "middle" is the first element of the data's second half: for a [K, V] chunk
    layout (LMCache's [2, layers, tokens, hidden]) the V of the chunk's first token in the first layer, which a
    read-back always loads; the element just before it (the last K of the chunk's last token) may belong to the
    prompt's last token, which an engine re-computes rather than loads: a flip there is invisible by construction
    (seen once: INVALID "corruption not detectable")."""
    at = size - (size // item_bytes // 2) * item_bytes + item_bytes - 1 if offset == "middle" else int(offset)
    if not 0 <= at < size:
        raise ValueError(f"offset {at} outside the file's {size} bytes")
    return {"tensor": None, "dtype": f"{item_bytes}-byte elements (raw)", "shape": None, "data_start": 0,
            "data_bytes": size, "offset_in_data": at, "offset_in_file": at}


def flip_file(path: str, offset: str, mask: int, fmt: str = "safetensors", item_bytes: int = 2) -> dict:
    with open(path, "r+b") as f:
        if fmt == "raw":
            where = raw_target(os.fstat(f.fileno()).st_size, offset, item_bytes)
        else:
            (n,) = struct.unpack("<Q", f.read(8))
            where = flip_target(json.loads(f.read(n)), n, offset)
        f.seek(where["offset_in_file"])
        before = f.read(1)[0]
        f.seek(where["offset_in_file"])
        f.write(bytes([before ^ mask]))
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    return {"file": path, **where, "before": before, "after": before ^ mask}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pool")
    ap.add_argument("--pattern", default="*.safetensors")
    ap.add_argument("--files", type=int, default=1)
    ap.add_argument("--offset", default="middle")
    ap.add_argument("--xor", type=lambda s: int(s, 0), default=0x40)
    ap.add_argument("--format", choices=("safetensors", "raw"), default="safetensors")
    ap.add_argument("--item-bytes", type=int, default=2)
    a = ap.parse_args(argv)
    found = newest_first([os.path.join(d, f) for d, _, fs in os.walk(a.pool) for f in fs
                          if fnmatch.fnmatch(f, a.pattern)])
    flipped = 0
    for path in found[:a.files]:
        try:
            rec = flip_file(path, a.offset, a.xor, a.format, a.item_bytes)
            flipped += 1
        except (OSError, ValueError, KeyError, struct.error) as exc:
            rec = {"file": path, "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(rec), flush=True)
    if not found:
        print(json.dumps({"file": None, "error": f"no file matching {a.pattern} under {a.pool}"}), flush=True)
    return 0 if flipped else 1


if __name__ == "__main__":
    sys.exit(main())
