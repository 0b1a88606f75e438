"""Secrets kept out of everything kvgate writes: step records, logs, evidence, plans, reports, bundles.

What is a secret:

- the value of an environment variable whose name contains ``TOKEN``, ``KEY``, ``PASSWORD``, ``PASSWD``,
  ``SECRET``, ``CREDENTIAL`` or ``AUTH`` (any case: ``HF_TOKEN``, ``OPENAI_API_KEY``, ``PGPASSWORD``), or that
  an engine profile or the inventory lists under ``secret_env``;
- the userinfo of a URL (``http://user:pass@host``: the whole ``user:pass``);
- the value of an ``Authorization``-like header (``Authorization``, ``Proxy-Authorization``, ``X-Api-Key``,
  ``Api-Key``, ``Cookie``), and of a command-line option named like a secret (``--api-key X``, ``--token=X``,
  ``--password X``, ``--dhchap-secret X``).

How it stays out: the values are registered here (:data:`SECRETS`) where kvgate first sees them (a profile,
the inventory, an attach URL, the environment of any command a transport starts), and the writers redact:
:func:`redact_env` and :func:`redact_argv` for what a command was run with, :func:`redact_text` /
:func:`redact_bytes` for output (every registered value, in its raw, JSON-escaped and percent-encoded forms,
is replaced by :data:`MARK`, as is URL userinfo), and :func:`scrub_tree` over a whole run directory before it
becomes a bundle, as the last line of defence. A value shorter than :data:`MIN_SCRUB_CHARS`, or one of digits
only, is redacted where its name says it is secret (environment, options) but not searched for in output:
replacing every ``abc`` or ``12345678`` in every file would destroy the evidence.
"""

from __future__ import annotations

import json
import os
import re
import stat
import threading
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence
from urllib.parse import quote, unquote, urlsplit, urlunsplit

# What a secret becomes: plain letters, so a redacted URL still parses (``http://REDACTED@host``: a bundle's
# config is validated again when it is re-evaluated) and Markdown and HTML show it as it is.
MARK = "REDACTED"
MIN_SCRUB_CHARS = 8

# Environment variable names: the patterns anywhere in the name (PGPASSWORD, HF_TOKEN, AWS_SECRET_ACCESS_KEY).
SECRET_NAME_RE = re.compile(r"TOKEN|KEY|PASSWORD|PASSWD|SECRET|CREDENTIAL|AUTH", re.IGNORECASE)
# Command-line options: the last word of the option names the secret itself (--api-key, --hf-token,
# --dhchap-secret), so --max-tokens, --chunk-tokens or --key-size are left alone.
SECRET_OPTION_RE = re.compile(
    r"^--?(?:[a-z0-9]+[-_])*(?:token|key|apikey|password|passwd|secret|credentials?|auth)$", re.IGNORECASE)
# Options named like a secret whose value is a file name, not the secret
_PATH_OPTIONS = re.compile(r"^--?(?:key|pubkey|private[-_]key|ssh[-_]key|identity|key[-_]?file)$", re.IGNORECASE)
SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "x-api-key", "api-key", "cookie",
                            "x-auth-token"})

_USERINFO_RE = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/\s@?#'\"<>\[\]]+)@")
_USERINFO_RE_B = re.compile(_USERINFO_RE.pattern.encode())
_HEADER_RE = re.compile(r"(?P<name>\b(?:Proxy-)?Authorization|\bX-Api-Key|\bApi-Key|\bX-Auth-Token|\bCookie)"
                        r"(?P<sep>\s*:\s*)(?P<value>[^\r\n'\"]+)", re.IGNORECASE)
# NAME=VALUE in a command or script: environment-style (upper-case) names only, so Python's ``key=len`` or
# an option's ``--chunk-tokens=256`` stay as they are
_ASSIGN_RE = re.compile(r"(?<![\w.$-])(?P<name>[A-Z_][A-Z0-9_]*)=(?P<value>'[^']*'|\"[^\"]*\"|[^\s'\";|&]+)")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NUMBER_RE = re.compile(r"[0-9.,:+-]+")


class SecretRegistry:
    """The secret names and values of this process (thread-safe); what every writer redacts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._names: set[str] = set()
        self._values: set[str] = set()
        self._forms: tuple[bytes, ...] = ()

    def add_names(self, names: Iterable[str]) -> None:
        """Mark environment variable names as secret, on top of the default patterns."""
        with self._lock:
            self._names.update(str(n) for n in names)

    def add_value(self, value: str | None) -> None:
        """A secret value: every writer replaces it (and its encoded forms) with :data:`MARK`."""
        if not value or len(value) < MIN_SCRUB_CHARS or MARK in value or _NUMBER_RE.fullmatch(value):
            return  # short values and numbers would match measurements; a redacted text is not a secret
        with self._lock:
            if value in self._values:
                return
            self._values.add(value)
            forms = {f.encode() for v in self._values for f in _forms(v)}
            # longest first, so a value that contains another is replaced whole
            self._forms = tuple(sorted(forms, key=lambda b: (-len(b), b)))

    def is_secret_name(self, name: str) -> bool:
        return bool(SECRET_NAME_RE.search(name)) or name in self._names

    @property
    def forms(self) -> tuple[bytes, ...]:
        return self._forms

    def known(self, value: str) -> bool:
        return value in self._values


def _forms(value: str) -> set[str]:
    """A value as it appears in what kvgate writes: raw, JSON-escaped (both ASCII modes), percent-encoded."""
    return {value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1], quote(value, safe="")}


SECRETS = SecretRegistry()


def is_secret_name(name: str) -> bool:
    """Whether an environment variable of this name holds a secret (default patterns or ``secret_env``)."""
    return SECRETS.is_secret_name(name)


def add_secret_names(names: Iterable[str]) -> None:
    """Mark environment variable names as secret for this process (a profile's or inventory's ``secret_env``)."""
    SECRETS.add_names(names)


def add_secret_value(value: str | None) -> None:
    """Register a secret value, to be redacted wherever it would be written."""
    SECRETS.add_value(value)


def register_env(env: Mapping[str, str] | None) -> None:
    """Register the values of the secret variables of an environment, and any URL userinfo in the others."""
    for k, v in (env or {}).items():
        if is_secret_name(k):
            add_secret_value(str(v))
        else:
            register_url(str(v))


def register_url(text: str | None) -> None:
    """Register the userinfo (and its password) of every URL in ``text``."""
    for m in _USERINFO_RE.finditer(text or ""):
        info = m.group("userinfo")
        add_secret_value(info)
        add_secret_value(unquote(info))
        user, sep, password = info.partition(":")
        if sep:
            add_secret_value(password)
            add_secret_value(unquote(password))


def redact_url(url: str) -> str:
    """The URL with its userinfo replaced by :data:`MARK` (``http://REDACTED@host:8000``)."""
    try:
        u = urlsplit(url)
    except ValueError:
        return redact_text(url)
    if "@" not in u.netloc:
        return url
    return urlunsplit((u.scheme, f"{MARK}@{u.netloc.rpartition('@')[2]}", u.path, u.query, u.fragment))


def redact_text(text: str) -> str:
    """``text`` with every registered secret value and every URL's userinfo replaced by :data:`MARK`."""
    if not text:
        return text
    # userinfo first, whole: a password replaced on its own would leave user:REDACTED@, needlessly
    text = _USERINFO_RE.sub(lambda m: m.group("scheme") + MARK + "@", text)
    for form in SECRETS.forms:
        s = form.decode()
        if s in text:
            text = text.replace(s, MARK)
    return text


def redact_bytes(data: bytes) -> bytes:
    """:func:`redact_text` for bytes (logs, raw output): registered values and URL userinfo."""
    if not data:
        return data
    data = _USERINFO_RE_B.sub(lambda m: m.group("scheme") + MARK.encode() + b"@", data)
    for form in SECRETS.forms:
        if form in data:
            data = data.replace(form, MARK.encode())
    return data


def redact_env(env: Mapping[str, Any] | None) -> dict[str, str]:
    """An environment as it may be written: secret variables' values replaced by :data:`MARK` (and
    registered), the others with registered values and URL userinfo redacted."""
    register_env({k: str(v) for k, v in (env or {}).items()})
    return {k: (MARK if is_secret_name(k) else redact_text(str(v))) for k, v in (env or {}).items()}


def _redact_inline(s: str) -> str:
    """Secrets inside one argv element or shell line: NAME=VALUE with a secret NAME, auth headers, URL
    userinfo, ``--api-key=VALUE``. The values found are registered, so output that echoes them is redacted too."""
    def assign(m: re.Match) -> str:
        if not is_secret_name(m.group("name")):
            return m.group(0)
        value = m.group("value")
        add_secret_value(value.strip("'\""))
        return f"{m.group('name')}={MARK}"

    def header(m: re.Match) -> str:
        value = m.group("value").strip()
        add_secret_value(value)
        scheme, _, cred = value.partition(" ")
        if cred:  # Bearer xyz: the credential alone is the secret too
            add_secret_value(cred.strip())
        return f"{m.group('name')}{m.group('sep')}{MARK}"

    register_url(s)
    s = _HEADER_RE.sub(header, s)
    s = _ASSIGN_RE.sub(assign, s)
    opt, eq, value = s.partition("=")
    if eq and SECRET_OPTION_RE.match(opt) and not _PATH_OPTIONS.match(opt) and value != MARK:
        add_secret_value(value)
        s = f"{opt}={MARK}"
    return redact_text(s)


def redact_argv(argv: Sequence[Any]) -> list[str]:
    """A command as it may be written (step records, plans, error messages): secret option values
    (``--api-key X``), NAME=VALUE assignments of secret names, auth headers, URL userinfo and registered
    values replaced by :data:`MARK`. Values found this way are registered for the other writers."""
    out: list[str] = []
    hide_next = False
    for a in (str(x) for x in argv):
        if hide_next:
            add_secret_value(a)
            out.append(MARK)
            hide_next = False
            continue
        if SECRET_OPTION_RE.match(a) and not _PATH_OPTIONS.match(a):
            hide_next = True
            out.append(a)
            continue
        out.append(_redact_inline(a))
    return out


def redact_line(line: str) -> str:
    """A free-form command line (a plan's ``NAME=VALUE ... argv`` or an operator's shell command)."""
    return _redact_inline(line)


def redact_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """HTTP headers as they may be written: auth headers' values replaced by :data:`MARK` (and registered)."""
    out = {}
    for k, v in (headers or {}).items():
        if k.lower() in SECRET_HEADERS:
            add_secret_value(v)
            out[k] = MARK
        else:
            out[k] = redact_text(v)
    return out


def redact_obj(obj: Any) -> Any:
    """A JSON-shaped value with every string (and key) redacted by :func:`redact_text`."""
    if isinstance(obj, str):
        return redact_text(obj)
    if isinstance(obj, dict):
        return {redact_text(k) if isinstance(k, str) else k: redact_obj(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact_obj(v) for v in obj]
    return obj


def scrub_file(path: str | Path) -> bool:
    """Redact a file kvgate wrote (or fetched) in place; True when it held a secret. Not a regular file
    (a symlink, a FIFO): left alone."""
    p = Path(path)
    try:
        st = os.lstat(p)
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode):
        return False
    return _scrubbed(p, p.read_bytes(), st.st_mode)[1]


def scrub_read(path: str | Path) -> bytes:
    """A regular file's bytes as :func:`scrub_file` leaves it: read once, redacted, written back only when it
    held a secret. For a reader that needs the clean bytes anyway (the bundle writer hashes them), so the file
    is not read twice. A symbolic link is refused (OSError), not followed."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        data = f.read()
        mode = os.fstat(fd).st_mode
    return _scrubbed(path, data, mode)[0]


def _scrubbed(path: str | Path, data: bytes, mode: int) -> tuple[bytes, bool]:
    clean = redact_bytes(data)
    if clean == data:
        return data, False
    p = Path(path)
    tmp = p.with_name(p.name + ".kvgate-redact")
    tmp.write_bytes(clean)
    os.chmod(tmp, stat.S_IMODE(mode))
    os.replace(tmp, p)
    return clean, True


def scrub_tree(root: str | Path) -> list[str]:
    """Redact every regular file under ``root`` in place (symlinks are not followed); the files changed,
    relative to ``root``. The run directory goes through this before it becomes a bundle."""
    root = Path(root)
    changed = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for fn in sorted(filenames):
            p = Path(dirpath) / fn
            if scrub_file(p):
                changed.append(p.relative_to(root).as_posix())
    return changed


def env_name_ok(name: str) -> bool:
    """Whether ``name`` can be an environment variable name (letters, digits, _; not starting with a digit)."""
    return bool(_ENV_NAME_RE.match(name))
