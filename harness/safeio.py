"""Hardened reading of the files kvgate is given: configuration YAML, bundle JSON, keys.

Every input file goes through :func:`read_bytes` / :func:`read_text`: only a regular file is read (a
directory, FIFO, socket or device is refused by name; the open is non-blocking, so a FIFO with no writer
cannot hang), its size is capped before anything is read, and text must be UTF-8 (the error names the line
and column of the first bad byte). :func:`parse_json` adds a nesting limit and refuses duplicate keys
(naming their line), because two readers of a signed file must not see two different values.

Every problem is an :class:`InputFileError` naming the file (and the line where there is one); callers turn
it into their own error (``ConfigError`` for configuration, ``BundleError`` or a failed verification for a
bundle). The limits are module constants so a test or a benchmark can name them.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any

from .errors import HarnessError

# YAML configuration: kvgate's own files are under 6 KiB. PyYAML's pure-Python composer (needed for the
# depth and alias limits) takes about 4 s per MiB on a busy 2-core machine, so the cap keeps the slowest
# legal file near a second (benchmarks/bad_inputs_bench.py).
MAX_CONFIG_BYTES = 256 << 10
MAX_JSON_BYTES = 32 << 20    # bundle JSON (envelope, verdicts.json, result.json, fio.json)
MAX_KEY_BYTES = 64 << 10     # PEM keys are under 1 KiB
MAX_DEPTH = 64               # nesting levels of a YAML or JSON document; kvgate's own files use under 10


class InputFileError(HarnessError):
    """One input file could not be used: ``FILE[:LINE]: message`` on one line."""

    def __init__(self, file: str, line: int | None, message: str):
        self.file, self.line, self.message = file, line, " ".join(message.split())
        super().__init__(f"{file}:{line}: {self.message}" if line else f"{file}: {self.message}")


def _human(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} bytes"


def _file_kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    return "not a regular file"


def _os_reason(exc: OSError, path: str | Path, follow_symlinks: bool) -> str:
    if exc.errno == errno.ELOOP:
        if not follow_symlinks and os.path.islink(path):
            return "is a symbolic link (not followed here)"
        return "too many levels of symbolic links (a symlink loop?)"
    if exc.errno == errno.ENOENT:
        return "no such file"
    if exc.errno == errno.EACCES:
        return "permission denied (cannot read the file)"
    return f"cannot read: {exc.strerror or exc}"


def read_bytes(path: str | Path, *, max_bytes: int, what: str = "file", follow_symlinks: bool = True,
               display_name: str | None = None) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``; anything else is an InputFileError."""
    name = display_name or str(path)
    try:
        # stat first: a device or FIFO is refused without being opened at all
        st = os.stat(path, follow_symlinks=follow_symlinks)
        if stat.S_ISLNK(st.st_mode):
            raise InputFileError(name, None, "is a symbolic link (not followed here)")
        if not stat.S_ISREG(st.st_mode):
            raise InputFileError(name, None, f"is {_file_kind(st.st_mode)}, not a regular {what}")
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
        fd = os.open(path, flags)
    except OSError as exc:
        raise InputFileError(name, None, _os_reason(exc, path, follow_symlinks)) from None
    try:
        st = os.fstat(fd)  # the file opened, not the one stat saw: it may have been swapped in between
        if not stat.S_ISREG(st.st_mode):
            raise InputFileError(name, None, f"is {_file_kind(st.st_mode)}, not a regular {what}")
        too_big = f"is larger than the {_human(max_bytes)} limit for a {what}"
        if st.st_size > max_bytes:
            raise InputFileError(name, None, f"{too_big} ({st.st_size} bytes)")
        chunks, total = [], 0
        while total <= max_bytes:  # the size may grow while reading, or be 0 (/proc): read at most max + 1
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > max_bytes:
            raise InputFileError(name, None, too_big)
        return b"".join(chunks)
    except OSError as exc:
        raise InputFileError(name, None, _os_reason(exc, path, follow_symlinks)) from None
    finally:
        os.close(fd)


def decode_utf8(data: bytes, name: str) -> str:
    """UTF-8 text; a bad byte is reported with its line and column (1-based)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise InputFileError(name, line, f"not UTF-8 text: byte 0x{data[exc.start]:02x} at column {col} "
                                         "(expected a UTF-8 text file)") from None


def read_text(path: str | Path, *, max_bytes: int, what: str = "file", follow_symlinks: bool = True,
              display_name: str | None = None) -> str:
    """:func:`read_bytes` decoded as UTF-8."""
    name = display_name or str(path)
    data = read_bytes(path, max_bytes=max_bytes, what=what, follow_symlinks=follow_symlinks, display_name=name)
    return decode_utf8(data, name)


# ------------------------------------------------------------------------------------------------ JSON


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


_TOKEN = re.compile(r'[\s]*(?:(["{}\[\],:])|[^\s"{}\[\],:]+)')


def _locate(text: str, max_depth: int) -> tuple[int | None, str] | None:
    """Walk valid-enough JSON token by token for the first duplicate key or level past ``max_depth``.

    Slow (pure Python) and used only once a fast parse has failed, to name the line."""
    stack: list[set[str] | None] = []
    expect_key, pos = False, 0
    while True:
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            return None
        tok, pos = m.group(1), m.end()
        if tok == '"':
            try:
                s, pos = json.decoder.scanstring(text, pos)
            except ValueError:
                return None
            if expect_key and stack and stack[-1] is not None:
                if s in stack[-1]:
                    return text.count("\n", 0, m.start(1)) + 1, f"duplicate key {s!r} (each key may appear once)"
                stack[-1].add(s)
                expect_key = False
        elif tok in ("{", "["):
            stack.append(set() if tok == "{" else None)
            if len(stack) > max_depth:
                return text.count("\n", 0, m.start(1)) + 1, f"nested deeper than {max_depth} levels"
            expect_key = tok == "{"
        elif tok in ("}", "]"):
            if stack:
                stack.pop()
            expect_key = False
        elif tok == ",":
            expect_key = bool(stack) and stack[-1] is not None
        elif tok == ":":
            expect_key = False


def _too_deep(obj: Any, max_depth: int) -> bool:
    todo = [(obj, 1)]
    while todo:
        o, d = todo.pop()
        if d > max_depth:
            return True
        children = o.values() if isinstance(o, dict) else o
        todo.extend((c, d + 1) for c in children if isinstance(c, (dict, list)))
    return False


def parse_json(text: str, name: str, max_depth: int = MAX_DEPTH) -> Any:
    """Strict JSON: syntax errors, duplicate keys and nesting past ``max_depth`` are InputFileErrors
    naming the line."""
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise InputFileError(name, exc.lineno, f"invalid JSON: {exc.msg} (column {exc.colno})") from None
    except (_DuplicateKey, RecursionError):
        where = _locate(text, max_depth)
        if where is None:  # cannot happen for text json accepted up to the hook; keep a line-less message
            raise InputFileError(name, None, f"nested deeper than {max_depth} levels or has a duplicate key") from None
        raise InputFileError(name, *where) from None
    except ValueError as exc:  # an integer past Python's digit limit (sys.get_int_max_str_digits)
        m = re.search(r"\d{%d,}" % (sys.get_int_max_str_digits() + 1), text)
        line = text.count("\n", 0, m.start()) + 1 if m else None
        raise InputFileError(name, line, f"invalid JSON: {exc}") from None
    if isinstance(obj, (dict, list)) and _too_deep(obj, max_depth):
        where = _locate(text, max_depth)
        raise InputFileError(name, *(where or (None, f"nested deeper than {max_depth} levels"))) from None
    return obj


def load_json(path: str | Path, *, max_bytes: int = MAX_JSON_BYTES, what: str = "JSON file",
              follow_symlinks: bool = False, display_name: str | None = None) -> Any:
    """Read and parse a JSON file with every limit of this module. Bundle files are not followed through
    symbolic links by default (a bundle holds none)."""
    name = display_name or str(path)
    return parse_json(read_text(path, max_bytes=max_bytes, what=what, follow_symlinks=follow_symlinks,
                                display_name=name), name)


def key_line(text: str | None, key: str) -> int | None:
    """Line of the first ``"key":`` in JSON text (exact for a key written once, as an unknown key is)."""
    if not text:
        return None
    m = re.search(re.escape(json.dumps(key)) + r"\s*:", text)
    return text.count("\n", 0, m.start()) + 1 if m else None


def check_keys(obj: Any, allowed: set[str] | frozenset[str], name: str, where: str, text: str | None = None,
               root: bool = False) -> None:
    """Refuse anything but a mapping with keys from ``allowed`` (an unknown key is a typo, or content
    nobody checks); ``text`` (the file's JSON) lets the message name the key's line, and ``root`` says
    ``obj`` is the whole document (so a wrong type is at the line where the document starts)."""
    if not isinstance(obj, dict):
        line = text.count("\n", 0, len(text) - len(text.lstrip())) + 1 if root and text else None
        raise InputFileError(name, line, f"{where}: expected a JSON object, got {json_type(obj)}")
    unknown = sorted(map(str, set(obj) - set(allowed)))
    if unknown:
        raise InputFileError(name, key_line(text, unknown[0]), f"{where}: unknown key {unknown[0]!r} "
                                                              f"(expected only {', '.join(sorted(allowed))})")


def json_type(obj: Any) -> str:
    """A JSON value's type in JSON's words, for messages."""
    if obj is None:
        return "null"
    if isinstance(obj, bool):
        return "a boolean"
    if isinstance(obj, (int, float)):
        return "a number"
    if isinstance(obj, str):
        return "a string"
    return "an array" if isinstance(obj, list) else "an object"


_SCALAR = (str, int, float, type(None))  # bool is an int
_JSON_ENCODERS: dict[tuple[int, int, bool, Any], json.JSONEncoder] = {}


def _leaf_encoder(indent: int, level: int, sort_keys: bool, default: Any) -> json.JSONEncoder:
    key = (indent, level, sort_keys, default)
    enc = _JSON_ENCODERS.get(key)
    if enc is None:
        enc = _JSON_ENCODERS[key] = json.JSONEncoder(
            separators=(",\n" + " " * (indent * (level + 1)), ": "), sort_keys=sort_keys, default=default)
    return enc


def _json_key(k: Any) -> str:
    if isinstance(k, str):
        return k
    if isinstance(k, float):
        return json.dumps(k)
    if k is True or k is False or k is None:
        return {True: "true", False: "false", None: "null"}[k]
    if isinstance(k, int):
        return int.__repr__(k)
    raise TypeError(f"keys must be str, int, float, bool or None, not {k.__class__.__name__}")


def dumps_indented(obj: Any, *, indent: int = 1, sort_keys: bool = False, default: Any = None) -> str:
    """``json.dumps(obj, indent=indent, sort_keys=sort_keys, default=default)``, the same text to the byte, in
    a fraction of its time on large data: with ``indent`` the standard library uses its pure-Python encoder for
    every value, here each list or dict whose items are all scalars (a series' sample, a row of numbers) is one
    call of the C encoder with the indented separators. Report IDs hash these files' bytes, so the text must not
    change (tests/unit/test_safeio_json.py holds it against ``json.dumps``)."""
    out: list[str] = []
    put = out.append
    fallback = json.JSONEncoder(default=default).default  # raises the standard TypeError when default is None

    def walk(o: Any, level: int) -> None:
        if isinstance(o, _SCALAR):
            put(json.dumps(o))
            return
        pad_in, pad_out = "\n" + " " * (indent * (level + 1)), "\n" + " " * (indent * level)
        if isinstance(o, (list, tuple)):
            if not o:
                put("[]")
                return
            if all(isinstance(x, _SCALAR) for x in o):
                put("[" + pad_in + _leaf_encoder(indent, level, sort_keys, default).encode(o)[1:-1] + pad_out + "]")
                return
            put("[")
            for i, x in enumerate(o):
                put(pad_in if i == 0 else "," + pad_in)
                walk(x, level + 1)
            put(pad_out + "]")
            return
        if isinstance(o, dict):
            if not o:
                put("{}")
                return
            if all(isinstance(v, _SCALAR) for v in o.values()):
                put("{" + pad_in + _leaf_encoder(indent, level, sort_keys, default).encode(o)[1:-1] + pad_out + "}")
                return
            items = sorted(o.items()) if sort_keys else o.items()
            put("{")
            for i, (k, v) in enumerate(items):
                put((pad_in if i == 0 else "," + pad_in) + json.encoder.encode_basestring_ascii(_json_key(k)) + ": ")
                walk(v, level + 1)
            put(pad_out + "}")
            return
        walk(fallback(o), level)

    walk(obj, 0)
    return "".join(out)
