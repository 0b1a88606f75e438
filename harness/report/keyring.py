"""A keyring: who holds which signing key, in which role, valid when, revoked when.

    keys:
      - name: Acme Storage QA           # shown as the signer
        role: vendor                    # vendor | customer | lab
        public_key_file: acme.pub       # relative to this file; or public_key: | <PEM text>
        valid_from: 2026-01-01          # optional; a date means 00:00 UTC of that day
        valid_until: 2027-12-31         # optional; a date means up to the end of that day (UTC)
      - name: Example Bank infra
        role: customer
        public_key: |
          -----BEGIN PUBLIC KEY-----
          MCowBQYDK2VwAyEA...
          -----END PUBLIC KEY-----
        revoked: 2026-06-01T12:00:00Z   # optional; signatures made at or after this instant are refused
        revocation_reason: laptop lost  # optional, shown with the refusal

Times without a zone are UTC. A signature's time is the time in its own signing record (see
harness.report.dsse; never the statement's created_utc, which the statement's author writes); a signature
with no record is refused for a key that is revoked or has validity dates.
The keyring is read with the hardened YAML loader (harness.config.yamlload) and every key file with the
hardened reader (harness.safeio: a regular file, at most 64 KiB). Every error is reported as
FILE:LINE: path: message, all at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, ValidationInfo, field_validator, model_validator

from ..config.yamlload import load_yaml, validate
from ..errors import BundleError, ConfigError
from ..safeio import MAX_KEY_BYTES, InputFileError, read_bytes
from .dsse import UTC_FORMAT, key_fingerprint, public_pem

ROLES = ("vendor", "customer", "lab")


def _utc(v: Any, end_of_day: bool = False) -> datetime | None:
    """A YAML date / datetime / ISO string as an aware UTC datetime (a bare date: start, or end, of the day)."""
    if v is None:
        return None
    if isinstance(v, str):
        try:
            v = datetime.fromisoformat(v.replace("Z", "+00:00")) if "T" in v or " " in v else date.fromisoformat(v)
        except ValueError:
            raise ValueError(f"invalid time {v!r} (expected YYYY-MM-DD or YYYY-MM-DDTHH:MM:SSZ)") from None
    if isinstance(v, datetime):
        return v.replace(tzinfo=timezone.utc) if v.tzinfo is None else v.astimezone(timezone.utc)
    if isinstance(v, date):
        start = datetime(v.year, v.month, v.day, tzinfo=timezone.utc)
        return start + timedelta(days=1) if end_of_day else start
    raise ValueError(f"invalid time {v!r} (expected YYYY-MM-DD or YYYY-MM-DDTHH:MM:SSZ)")


def parse_utc(text: str) -> datetime:
    """A kvgate UTC timestamp (``2026-11-30T10:00:00Z``) as an aware datetime."""
    return datetime.strptime(text, UTC_FORMAT).replace(tzinfo=timezone.utc)


def fmt_utc(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime(UTC_FORMAT)


def read_key_file(path: str | Path) -> bytes:
    """A public key file's bytes through the hardened reader; ValueError with the reason otherwise."""
    try:
        return read_bytes(path, max_bytes=MAX_KEY_BYTES, what="key file")
    except InputFileError as exc:
        raise ValueError(f"cannot use {path}: {exc.message}") from None


def load_pem_ed25519(pem: str | bytes) -> Ed25519PublicKey:
    """An Ed25519 public key from PEM text; ValueError with a reason otherwise."""
    data = pem.encode() if isinstance(pem, str) else pem
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError):
        if b"PRIVATE KEY" in data:
            raise ValueError("this is a private key; give the public key (the .pub from kvgate keygen)") from None
        if b"-----BEGIN PUBLIC KEY-----" not in data:
            raise ValueError("not a PEM public key (expected a -----BEGIN PUBLIC KEY----- block)") from None
        raise ValueError("not a PEM public key (the data between BEGIN and END does not decode to a key)") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"not an Ed25519 public key ({type(key).__name__.lstrip('_')}); kvgate signs with Ed25519")
    return key


class KeyEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=120)
    role: str | None = None
    public_key: str | None = None
    public_key_file: str | None = None
    valid_from: datetime | None = None
    valid_until: datetime | None = None
    revoked: datetime | None = None
    revocation_reason: str | None = None
    _key: Ed25519PublicKey = PrivateAttr()

    @field_validator("role", mode="before")
    @classmethod
    def _role(cls, v: Any) -> Any:
        if v is not None and v not in ROLES:
            raise ValueError(f"unknown role {v!r} (expected one of: {', '.join(ROLES)})")
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if any(c in v for c in "\n\r\t|"):
            raise ValueError("name must be one line without tabs or '|'")
        return v

    @field_validator("valid_from", "revoked", mode="before")
    @classmethod
    def _start(cls, v: Any) -> Any:
        return _utc(v)

    @field_validator("valid_until", mode="before")
    @classmethod
    def _end(cls, v: Any) -> Any:
        return _utc(v, end_of_day=True)

    @field_validator("public_key")
    @classmethod
    def _pem(cls, v: str | None) -> str | None:
        if v is not None:
            load_pem_ed25519(v)
        return v

    @field_validator("public_key_file")
    @classmethod
    def _pem_file(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None:
            return v
        path = Path(v).expanduser()
        if not path.is_absolute():
            path = Path((info.context or {}).get("base", ".")) / path
        key = load_pem_ed25519(read_key_file(path))
        if info.context is not None:  # the key as read here, so the file is read once
            info.context.setdefault("_keys", {})[str(path)] = key
        return str(path)

    @model_validator(mode="after")
    def _one_key(self, info: ValidationInfo) -> "KeyEntry":
        if (self.public_key is None) == (self.public_key_file is None):
            raise ValueError("give exactly one of public_key (PEM text) and public_key_file")
        if self.valid_from and self.valid_until and self.valid_until <= self.valid_from:
            raise ValueError("valid_until must be after valid_from")
        if self.revocation_reason is not None and self.revoked is None:
            raise ValueError("revocation_reason without revoked (the revocation time)")
        if self.public_key is not None:
            self._key = load_pem_ed25519(self.public_key)
        else:
            read = (info.context or {}).get("_keys", {}).get(self.public_key_file)
            self._key = read if read is not None else load_pem_ed25519(read_key_file(self.public_key_file))
        return self

    @property
    def key(self) -> Ed25519PublicKey:
        return self._key

    @property
    def fingerprint(self) -> str:
        return key_fingerprint(self.key)

    @property
    def label(self) -> str:
        return f"{self.name} ({self.role})" if self.role else self.name

    def refusal(self, signed_at: datetime | None) -> str | None:
        """Why a signature made with this key at ``signed_at`` is refused; None when it stands."""
        if self.revoked is not None:
            why = f" ({self.revocation_reason})" if self.revocation_reason else ""
            if signed_at is None:
                return f"no signed signing time, and the key is revoked since {fmt_utc(self.revoked)}{why}"
            if signed_at >= self.revoked:
                return f"signed {fmt_utc(signed_at)}, after the key's revocation at {fmt_utc(self.revoked)}{why}"
        if self.valid_from is not None:
            if signed_at is None:
                return f"no signed signing time, and the key is valid only from {fmt_utc(self.valid_from)}"
            if signed_at < self.valid_from:
                return f"signed {fmt_utc(signed_at)}, before the key's validity ({fmt_utc(self.valid_from)})"
        if self.valid_until is not None:
            if signed_at is None:
                return f"no signed signing time, and the key is valid only until {fmt_utc(self.valid_until)}"
            if signed_at >= self.valid_until:
                return f"signed {fmt_utc(signed_at)}, after the key expired ({fmt_utc(self.valid_until)})"
        return None

    def as_yaml_entry(self) -> dict[str, Any]:
        """This entry with the key inline (PEM), for a keyring that travels alone (a published library)."""
        out: dict[str, Any] = {"name": self.name}
        if self.role:
            out["role"] = self.role
        out["public_key"] = public_pem(self.key)
        for f in ("valid_from", "valid_until", "revoked"):
            t = getattr(self, f)
            if t is not None:
                out[f] = fmt_utc(t)
        if self.revocation_reason:
            out["revocation_reason"] = self.revocation_reason
        return out


class KeyringFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    keys: list[KeyEntry] = Field(min_length=1)


@dataclass(frozen=True)
class Keyring:
    """The validated keys of a keyring file, by fingerprint."""

    path: str
    entries: tuple[KeyEntry, ...]

    def by_fingerprint(self) -> dict[str, KeyEntry]:
        return {e.fingerprint: e for e in self.entries}

    def to_yaml(self) -> str:
        import yaml

        class _Dumper(yaml.SafeDumper):
            pass

        def _str(dumper, v: str):  # PEM blocks as literal blocks, readable and diffable
            return dumper.represent_scalar("tag:yaml.org,2002:str", v, style="|" if "\n" in v else None)

        _Dumper.add_representer(str, _str)
        return yaml.dump({"keys": [e.as_yaml_entry() for e in self.entries]}, Dumper=_Dumper, sort_keys=False,
                         allow_unicode=True)


def load_keyring(path: str | Path) -> Keyring:
    """Read and validate a keyring; ConfigError with every issue (FILE:LINE: path: message)."""
    path = Path(path)
    data, index = load_yaml(path)
    kr = validate(KeyringFile, data, index, context={"base": str(path.parent), "_keys": {}})
    issues = []
    seen_fp: dict[str, int] = {}
    seen_name: dict[str, int] = {}
    for i, e in enumerate(kr.keys):
        field = "public_key" if e.public_key is not None else "public_key_file"
        if e.fingerprint in seen_fp:
            j = seen_fp[e.fingerprint]
            issues.append(index.issue(("keys", i, field), f"the same key as keys[{j}] ({kr.keys[j].name}); "
                                                         "list each key once"))
        if e.name in seen_name:
            issues.append(index.issue(("keys", i, "name"), f"duplicate name (also keys[{seen_name[e.name]}]); "
                                                           "names identify signers"))
        seen_fp.setdefault(e.fingerprint, i)
        seen_name.setdefault(e.name, i)
    if issues:
        raise ConfigError(issues)
    return Keyring(str(path), tuple(kr.keys))


def keyring_from_pubkeys(paths: list[str | Path]) -> list[KeyEntry]:
    """Keyring entries for bare ``--pubkey`` files: named after the file, no role, no dates. Each file is
    read with the hardened reader; a file that is not an Ed25519 public key is a BundleError (one line)."""
    out = []
    for p in paths:
        p = Path(p)
        try:
            data = read_bytes(p, max_bytes=MAX_KEY_BYTES, what="key file")
        except InputFileError as exc:
            raise BundleError(str(exc)) from None
        try:
            out.append(KeyEntry(name=p.name, public_key=data.decode("utf-8")))
        except UnicodeDecodeError:
            raise BundleError(f"{p}: not a PEM public key (not text)") from None
        except ValidationError as exc:
            msg = exc.errors(include_url=False)[0]["msg"].removeprefix("Value error, ")
            raise BundleError(f"{p}: {msg}") from None
    return out
