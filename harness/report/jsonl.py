"""Per-request records a gate keeps as JSON Lines (``requests-*.jsonl``), read from a bundle for its report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..safeio import MAX_JSON_BYTES, InputFileError, decode_utf8, parse_json, read_bytes


def jsonl_objects(path: Path, rel: str) -> list[dict[str, Any]] | None:
    """The JSON objects of a ``.jsonl`` file, one per non-empty line; None when the file is absent, not a regular
    file, or past the JSON size cap (it draws nothing: it does not hang the report). Every line is parsed
    strictly (harness.safeio: nesting limit, no duplicate keys); a line that is not a JSON object is an
    InputFileError naming ``rel`` and the line (exit 2), not a table built from part of the data."""
    if not path.is_file():
        return None
    try:
        data = read_bytes(path, max_bytes=MAX_JSON_BYTES, what="request log", follow_symlinks=False,
                          display_name=rel)
    except InputFileError:
        return None
    out = []
    for n, line in enumerate(decode_utf8(data, rel).splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = parse_json(line, rel)
        except InputFileError as exc:
            raise InputFileError(rel, n, exc.message) from None
        if not isinstance(rec, dict):
            raise InputFileError(rel, n, f"expected a JSON object per line, got {type(rec).__name__}")
        out.append(rec)
    return out
