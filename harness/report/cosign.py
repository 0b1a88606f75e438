"""Co-signed bundles: ``kvgate cosign`` adds a signature; ``verify_signers`` says who signed, in which role,
when, and whether each signature stands.

Adding a signature changes only ``attestation.dsse.json`` (one more ``signatures[]`` entry over the same
payload) and adds the signer's signing record ``signatures/<hex>.dsse.json`` (harness.report.dsse: the
signed signing time). The statement, hence the report ID and every subject, stays byte-identical, so earlier
signatures stay valid.

The ``.tar.gz`` twin: a bundle directory ``D/KVG-…/`` and its archive ``D/KVG-….tar.gz`` are one record.
Cosigning either one updates both: the directory is signed in place (the record is renamed in first, then
the new envelope over the old one, each written beside the bundle under a hidden name), then the archive
is rebuilt from the directory under a hidden name and renamed over the old one. An archive without its
directory is extracted beside itself, signed, re-packed and renamed over. A signer whose signature is
already there gets "already signed", and a stale twin (an interrupted cosign) is rebuilt; an archive that
holds signatures its directory lacks is refused rather than overwritten.

Every envelope is read with the hardened reader (harness.report.bundle.read_envelope; an archive's envelope
is size-checked before it is read out of the archive). A bundle that does not verify is not cosigned: that
is a :class:`harness.errors.VerificationError` (exit 1), any other refusal a BundleError (exit 2).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import tarfile
import tempfile
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ..errors import BundleError, VerificationError
from ..safeio import MAX_JSON_BYTES, InputFileError
from .bundle import ENVELOPE, extract_archive, open_bundle, read_envelope, tar_bundle, verify_bundle, verify_content
from .dsse import (SIGNATURES_DIR, SigningRecord, check_signing_records, decode_signatures, key_fingerprint,
                   make_signing_record, pae, parse_envelope, record_files, record_name, signature_valid)
from .keyring import KeyEntry, fmt_utc, parse_utc

TAR_SUFFIX = ".tar.gz"


@dataclass(frozen=True)
class Envelope:
    """A bundle's envelope as read: payloadType, payload, the signature entries as written and decoded."""

    payload_type: str
    payload: bytes
    entries: list[dict[str, str]]
    signatures: list[tuple[str, bytes]]

    def with_signature(self, keyid: str, sig: bytes) -> bytes:
        """The envelope's JSON text with one more signature entry (the payload unchanged)."""
        env = {"payloadType": self.payload_type, "payload": base64.b64encode(self.payload).decode(),
               "signatures": [dict(e) for e in self.entries] + [{"keyid": keyid,
                                                                  "sig": base64.b64encode(sig).decode()}]}
        return (json.dumps(env, indent=1) + "\n").encode()


def _envelope(ptype: str, payload: bytes, entries: list[dict[str, str]], where: str) -> Envelope:
    try:
        return Envelope(ptype, payload, entries, decode_signatures(entries))
    except ValueError as exc:
        raise BundleError(f"{where}: malformed {ENVELOPE}: {exc}") from None


def _read_envelope(d: Path) -> Envelope:
    """The envelope of the bundle directory ``d`` (hardened reader); BundleError naming it otherwise."""
    try:
        return _envelope(*read_envelope(d / ENVELOPE), where=d.name)
    except InputFileError as exc:
        raise BundleError(f"{d.name}: {exc}") from None


def _envelope_to_sign(d: Path) -> Envelope:
    """The envelope of a bundle about to be cosigned: one that cannot be read does not verify, so the
    bundle is not cosigned (VerificationError)."""
    try:
        return _read_envelope(d)
    except BundleError as exc:
        raise VerificationError(f"{d.name}: not cosigned: {str(exc).removeprefix(d.name + ': ')}") from None


# --------------------------------------------------------------------------- checking signatures


@dataclass(frozen=True)
class SignatureCheck:
    """One entry of the envelope's ``signatures[]``, judged.

    status: ``accepted`` (valid, by a key you trust, within its validity), ``refused`` (valid, by a key you
    trust, but signed after its revocation or outside its validity), ``untrusted`` (valid, by a key you did
    not name: its signing record carries the public key), ``unchecked`` (key unknown, nothing to check it
    with), ``invalid`` (does not verify with the key its keyid or record names).
    """

    keyid: str
    status: str
    name: str | None = None
    role: str | None = None
    signed_utc: str | None = None
    time_source: str | None = None     # "signing record", the only source of a signing time
    reason: str = ""

    @property
    def who(self) -> str:
        if self.name:
            return f"{self.name} ({self.role})" if self.role else self.name
        return "unknown signer"

    def line(self) -> str:
        when = f"signed {self.signed_utc} ({self.time_source})" if self.signed_utc else "signing time not recorded"
        text = f"{self.who} {self.keyid}: {self.status.upper()}, {when}"
        return text + (f": {self.reason}" if self.reason else "")

    def as_dict(self) -> dict:
        return {"keyid": self.keyid, "status": self.status, "name": self.name, "role": self.role,
                "signed_utc": self.signed_utc, "time_source": self.time_source, "reason": self.reason}


@dataclass(frozen=True)
class SignersResult:
    ok: bool
    report_id: str | None
    statement: dict | None
    error: str | None
    signatures: list[SignatureCheck] = field(default_factory=list)

    @property
    def accepted(self) -> list[SignatureCheck]:
        return [s for s in self.signatures if s.status == "accepted"]


def verify_signers(path: str | Path, trusted: list[KeyEntry] = (), require_keys: list[KeyEntry] = (),
                   require_roles: list[str] = ()) -> SignersResult:
    """Verify a bundle and judge every signature in its envelope.

    ``trusted``: the keys you trust (a keyring's entries and ``--pubkey`` files). OK when every file matches
    the statement, no signature is invalid or refused, every key in ``require_keys`` has an accepted
    signature, some accepted signature has each role in ``require_roles``, and at least one signature is
    accepted.
    """
    try:
        with open_bundle(path) as d:
            content = verify_content(d)
            if not content.ok:
                return SignersResult(False, content.report_id, content.statement, content.error)
            env = _read_envelope(d)
            pred = content.statement["predicate"]
            records, _ = check_signing_records(d, env.payload_type, env.payload, env.signatures, content.report_id,
                                               pred.get("created_utc"))
    except BundleError as exc:  # e.g. an archive that cannot be read: a failed verification, said in one line
        return SignersResult(False, None, None, str(exc))
    checks = judge_signatures(env.payload_type, env.payload, env.signatures, pred, records, trusted)
    error = None
    bad = [c for c in checks if c.status in ("invalid", "refused")]
    accepted = {c.keyid for c in checks if c.status == "accepted"}
    roles = {c.role for c in checks if c.status == "accepted"}
    if bad:
        error = f"signature by {bad[0].who} {bad[0].keyid} {bad[0].status}: {bad[0].reason}"
    elif missing := [k for k in require_keys if k.fingerprint not in accepted]:
        error = f"no accepted signature by {missing[0].name} ({missing[0].fingerprint})"
    elif missing_roles := [r for r in require_roles if r not in roles]:
        error = f"no accepted signature by a key in role {missing_roles[0]}"
    elif not accepted:
        error = "no signature by a key you trust" + ("" if trusted else " (give --pubkey or --keyring)")
    return SignersResult(error is None, content.report_id, content.statement, error, checks)


def judge_signatures(payload_type: str, payload: bytes, sigs: list[tuple[str, bytes]], predicate: dict,
                     records: dict[str, SigningRecord], trusted: list[KeyEntry]) -> list[SignatureCheck]:
    """Pure: each signature -> SignatureCheck (see its status values)."""
    by_fp = {e.fingerprint: e for e in trusted}
    out: list[SignatureCheck] = []
    seen: set[str] = set()
    for hint, sig in sigs:
        # The keyid is only a hint: try the key it names, then every other key we know.
        candidates: list[Ed25519PublicKey] = []
        if hint in by_fp:
            candidates.append(by_fp[hint].key)
        if hint in records:
            candidates.append(records[hint].public_key)
        candidates += [e.key for e in trusted] + [r.public_key for r in records.values()]
        key = next((k for k in candidates if signature_valid(k, sig, payload_type, payload)), None)
        if key is None:
            if hint in by_fp or hint in records:
                e = by_fp.get(hint)
                out.append(SignatureCheck(hint, "invalid", e.name if e else None, e.role if e else None,
                                          reason="the signature does not verify with the key its keyid names"))
            else:
                out.append(SignatureCheck(hint, "unchecked", reason="key not in your keyring and no signing record"))
            continue
        fp = key_fingerprint(key)
        entry = by_fp.get(fp)
        name, role = (entry.name, entry.role) if entry else (None, None)
        if fp in seen:
            out.append(SignatureCheck(fp, "invalid", name, role, reason="a second signature by the same key"))
            continue
        seen.add(fp)
        # Only the signature's own signed record dates it: the statement's created_utc is whatever its author
        # wrote, so it dates no signature, not even one by the key the predicate names as signing_key.
        if fp in records:
            when, source = records[fp].signed_utc, "signing record"
        else:
            when, source = None, None
        if entry is None:
            out.append(SignatureCheck(fp, "untrusted", None, None, when, source,
                                      "valid signature by a key you did not name"))
            continue
        refusal = entry.refusal(parse_utc(when) if when else None)
        out.append(SignatureCheck(fp, "refused" if refusal else "accepted", name, role, when, source, refusal or ""))
    return out


# --------------------------------------------------------------------------- adding a signature


@dataclass(frozen=True)
class CosignResult:
    report_id: str
    keyid: str
    signed_utc: str | None      # None when the key had already signed
    directory: Path | None      # the bundle directory updated (None when only the archive exists)
    archive: Path | None        # the archive updated
    action: str                 # "signed" | "already signed"
    archive_refreshed: bool = False


def twins(path: str | Path) -> tuple[Path | None, Path | None]:
    """(bundle directory, archive) of a bundle given as either; each None when absent."""
    path = Path(path)
    if path.is_dir():
        tar = path.parent / (path.name + TAR_SUFFIX)
        return path, tar if tar.is_file() else None
    if path.is_file() and path.name.endswith(TAR_SUFFIX):
        d = path.parent / path.name[: -len(TAR_SUFFIX)]
        return (d if d.is_dir() else None), path
    raise BundleError(f"{path}: no such bundle (expected a bundle directory or its .tar.gz)")


def _archive_envelope(tar: Path) -> tuple[bytes, set[str]]:
    """(envelope bytes, record names) inside an archive, without extracting it; the envelope must be a
    regular member of at most MAX_JSON_BYTES (the hardened reader's limit for bundle JSON)."""
    try:
        with tarfile.open(tar, "r:gz") as tf:
            env, recs = None, set()
            for m in tf.getmembers():
                parts = m.name.split("/", 1)
                if len(parts) == 2 and parts[1] == ENVELOPE and m.isfile():
                    if m.size > MAX_JSON_BYTES:
                        raise BundleError(f"{tar}: {ENVELOPE} in the archive is larger than the "
                                          f"{MAX_JSON_BYTES >> 20} MiB limit for an envelope")
                    env = tf.extractfile(m).read()
                elif len(parts) == 2 and parts[1].startswith(SIGNATURES_DIR + "/") and m.isfile():
                    recs.add(parts[1])
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise BundleError(f"{tar}: not a readable bundle archive: {exc}") from None
    if env is None:
        raise BundleError(f"{tar}: no {ENVELOPE} in the archive")
    return env, recs


def _parse_archive_envelope(tar: Path, data: bytes) -> Envelope:
    """The envelope read out of an archive (strict parse); one that cannot be used does not verify."""
    try:
        return _envelope(*parse_envelope(data.decode("utf-8"), f"{tar}: {ENVELOPE}"), where=str(tar))
    except UnicodeDecodeError:
        raise VerificationError(f"{tar}: not cosigned: {ENVELOPE} is not UTF-8 text") from None
    except (InputFileError, BundleError) as exc:
        raise VerificationError(f"not cosigned: {exc}") from None


def _dir_records(d: Path) -> set[str]:
    return set(record_files(d)[0])


def _replace(target: Path, data: bytes) -> None:
    """Write ``data`` beside the bundle under a hidden name, then rename it over ``target``."""
    bundle = target.parent if target.parent.name != SIGNATURES_DIR else target.parent.parent
    fd, tmp = tempfile.mkstemp(prefix=".cosign-", dir=bundle.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.rename(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _sign_dir(d: Path, key: Ed25519PrivateKey, now: datetime, trusted: list[KeyEntry]) -> tuple[str, str | None]:
    """Sign the bundle directory ``d`` in place; (report ID, signed_utc or None when already signed)."""
    pub = key.public_key()
    fp = key_fingerprint(pub)
    rec_path = d / record_name(pub)
    env = _envelope_to_sign(d)
    already = any(signature_valid(pub, s, env.payload_type, env.payload) for _, s in env.signatures)
    if rec_path.is_file() and not already:
        rec_path.unlink()  # this key's record from an interrupted cosign: it is written again below
    for t in trusted:
        res = verify_bundle(d, public_key=t.key)
        if not res.ok:
            raise VerificationError(f"{d.name}: not cosigned: {res.error} (--pubkey {t.name})")
    res = verify_content(d)
    if not res.ok:
        raise VerificationError(f"{d.name}: not cosigned: the bundle does not verify: {res.error}")
    rid, pred = res.report_id, res.statement["predicate"]
    if already and rec_path.is_file():
        return rid, None  # a signature without its record (an older bundle, another DSSE tool) gets one below
    signed = fmt_utc(now)
    created = pred.get("created_utc")
    if created and signed < created:
        raise BundleError(f"this machine's clock ({signed}) is before the report's creation ({created}); "
                          "a signing time must not predate what it signs")
    record = make_signing_record(key, env.payload, rid, signed)
    old_env = (d / ENVELOPE).read_bytes()  # verified above: a regular file within the envelope limit
    new_env = old_env if already else env.with_signature(fp, key.sign(pae(env.payload_type, env.payload)))
    old_rec = rec_path.read_bytes() if rec_path.is_file() else None  # checked by verify_content above
    rec_path.parent.mkdir(exist_ok=True)
    try:
        # The record first: an interruption before the envelope leaves a record whose key has no signature,
        # which verify names ("run kvgate cosign again") and the next cosign replaces.
        _replace(rec_path, record)
        _replace(d / ENVELOPE, new_env)
        check = verify_bundle(d, public_key=pub)
        if not check.ok:
            raise BundleError(f"{d.name}: the cosigned bundle does not verify: {check.error}")
    except BaseException:
        _replace(d / ENVELOPE, old_env)
        if old_rec is None:
            rec_path.unlink(missing_ok=True)
        else:
            _replace(rec_path, old_rec)
        raise
    return rid, signed


def cosign_bundle(path: str | Path, key: Ed25519PrivateKey, trusted: list[KeyEntry] = (),
                  now: datetime | None = None) -> CosignResult:
    """Add ``key``'s signature (and its signing record) to a bundle and its twin; see the module docstring.

    ``trusted``: keys whose existing signatures must verify before this key signs (the cosigner checks what
    they sign). ``now``: the signing time (a seam for tests; default the clock, UTC, whole seconds).
    """
    now = (now or datetime.now(timezone.utc)).replace(microsecond=0)
    fp = key_fingerprint(key.public_key())
    d, tar = twins(path)
    if d is not None:
        if tar is not None:
            tar_env, _ = _archive_envelope(tar)
            t, mine = _parse_archive_envelope(tar, tar_env), _envelope_to_sign(d)
            if t.payload != mine.payload:
                raise BundleError(f"{tar} and {d} hold different statements; cosign each separately")
            extra = {s for _, s in t.signatures} - {s for _, s in mine.signatures}
            # the archive may already hold this very signature (Ed25519 signatures are deterministic)
            if any(not signature_valid(key.public_key(), s, t.payload_type, t.payload) for s in extra):
                raise BundleError(f"{tar} holds signatures that {d} lacks; remove the directory and cosign the "
                                  "archive (it is extracted beside itself)")
        rid, signed = _sign_dir(d, key, now, list(trusted))
        refreshed = False
        if tar is not None:
            tar_env, tar_recs = _archive_envelope(tar)
            if signed is not None or tar_env != (d / ENVELOPE).read_bytes() or tar_recs != _dir_records(d):
                tar_bundle(d, tar)
                refreshed = signed is None
        return CosignResult(rid, fp, signed, d, tar, "signed" if signed else "already signed", refreshed)
    work = Path(tempfile.mkdtemp(prefix=".cosign-", dir=tar.parent))
    try:
        inner = extract_archive(tar, work)
        rid, signed = _sign_dir(inner, key, now, list(trusted))
        if signed is not None:
            tar_bundle(inner, tar)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return CosignResult(rid, fp, signed, None, tar, "signed" if signed else "already signed")


def signer_view(checks: list[SignatureCheck]) -> list[dict]:
    """Signature checks as the report templates show them."""
    return [c.as_dict() | {"who": c.who} for c in checks]
