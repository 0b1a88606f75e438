"""DSSE primitives of a bundle's envelope, and the signing record that gives each co-signature a signed time.

A DSSE envelope is ``{payloadType, payload, signatures: [{keyid, sig}]}``; a signature covers only the
pre-authentication encoding of the payload (:func:`pae`), and its ``keyid`` is an unauthenticated hint.
DSSE has no place for a signing time, and adding fields to ``signatures[]`` would break other DSSE
implementations. So every signature added by ``kvgate cosign`` comes with a **signing record**: a second,
ordinary DSSE envelope in the bundle at ``signatures/<sha256 of the raw public key>.dsse.json`` whose
payload is an in-toto Statement v1

    subject:       [{name: <report ID>, digest: {sha256: <sha256 of the bundle's statement payload>}}]
    predicateType: https://kvgate.dev/signing-record/v1
    predicate:     {report_id, signed_utc, keyid, public_key (PEM)}

signed by the same key. The time is therefore signed by the key it dates, and bound to exactly one
statement. The bundle's original signature has one too (:func:`write_signing_record`, called by
``write_bundle``; its time is the statement's ``created_utc``). A signature is dated only by its own record,
never by the statement's ``created_utc``: that field is chosen by whoever wrote the statement, and naming a
key as ``signing_key`` proves nothing about when that key signed.

What a signed time does not prove: that the key holder's clock was right. A holder of a stolen key can
write any time, including one before the revocation; only a third party's timestamp (RFC 3161, a
transparency log) would bound that, and kvgate works offline. Records are outside the statement's
subjects (they are made after it), so adding one never changes the report ID or any subject.

Envelopes and records are parsed strictly (harness.safeio: no duplicate keys, a nesting limit, no unknown
keys) and read with the hardened reader (a regular file, no symlink, a size cap): :func:`parse_envelope`,
:func:`read_envelope_file`, :func:`check_signing_records`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ..safeio import InputFileError, check_keys, decode_utf8, json_type, key_line, parse_json, read_text

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
RECORD_PREDICATE_TYPE = "https://kvgate.dev/signing-record/v1"
SIGNATURES_DIR = "signatures"
_RECORD_RE = re.compile(r"^signatures/([0-9a-f]{64})\.dsse\.json$")
UTC_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
MAX_RECORD_BYTES = 64 << 10  # a signing record is about 1.2 KiB

ENVELOPE_KEYS = frozenset({"payloadType", "payload", "signatures"})
SIGNATURE_KEYS = frozenset({"keyid", "sig"})
STATEMENT_KEYS = frozenset({"_type", "subject", "predicateType", "predicate"})
RECORD_PREDICATE_KEYS = frozenset({"report_id", "signed_utc", "keyid", "public_key"})


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE pre-authentication encoding."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def canonical(obj: Any) -> bytes:
    """The JSON bytes kvgate signs: sorted keys, no whitespace."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def raw_public(pub: Ed25519PublicKey) -> bytes:
    return pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_fingerprint(pub: Ed25519PublicKey) -> str:
    """``SHA256:<unpadded base64 of sha256(raw key)>``, the keyid kvgate writes (as OpenSSH prints keys)."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(raw_public(pub)).digest()).decode().rstrip("=")


def public_pem(pub: Ed25519PublicKey) -> str:
    return pub.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def record_name(pub: Ed25519PublicKey) -> str:
    """Where a key's signing record lives in a bundle (hex, so it is a safe file name)."""
    return f"{SIGNATURES_DIR}/{hashlib.sha256(raw_public(pub)).hexdigest()}.dsse.json"


def is_record_path(rel: str) -> bool:
    """Whether a bundle-relative path is in the signing-record area (never a subject)."""
    return rel == SIGNATURES_DIR or rel.startswith(SIGNATURES_DIR + "/")


def parse_envelope(text: str, name: str) -> tuple[str, bytes, list[dict[str, str]]]:
    """(payloadType, payload bytes, signatures) of a DSSE envelope's JSON text, parsed strictly
    (harness.safeio: no duplicate keys, a nesting limit) and checked key by key; InputFileError naming
    ``name`` (and the line, where there is one) otherwise."""
    env = parse_json(text, name)
    check_keys(env, ENVELOPE_KEYS, name, "envelope", text, root=True)
    missing = sorted(ENVELOPE_KEYS - set(env))
    if missing:
        raise InputFileError(name, None, f"envelope: required key {missing[0]!r} is missing")
    for key, want in (("payloadType", str), ("payload", str), ("signatures", list)):
        if not isinstance(env[key], want):
            raise InputFileError(name, key_line(text, key), f"envelope: {key} must be a JSON "
                                                f"{'string' if want is str else 'array'}, got {json_type(env[key])}")
    for i, sig in enumerate(env["signatures"]):
        check_keys(sig, SIGNATURE_KEYS, name, f"signatures[{i}]", text)
        if not isinstance(sig.get("sig"), str) or not isinstance(sig.get("keyid", ""), str):
            raise InputFileError(name, None, f"signatures[{i}]: sig and keyid must be strings")
    try:
        payload = base64.b64decode(env["payload"], validate=True)
    except ValueError as exc:
        raise InputFileError(name, None, f"envelope: payload is not base64: {exc}") from None
    return env["payloadType"], payload, env["signatures"]


def read_envelope_file(path: str | Path, name: str, max_bytes: int,
                       what: str = "envelope") -> tuple[str, bytes, list[dict[str, str]]]:
    """:func:`parse_envelope` of a file read with the hardened reader (regular file, no symlink, size cap,
    UTF-8)."""
    text = read_text(path, max_bytes=max_bytes, what=what, follow_symlinks=False, display_name=name)
    return parse_envelope(text, name)


def decode_signatures(sigs: list[dict[str, str]]) -> list[tuple[str, bytes]]:
    """(keyid hint, signature bytes) of every entry of a parsed envelope; ValueError on none or bad base64."""
    if not sigs:
        raise ValueError("no signatures")
    out = []
    for i, s in enumerate(sigs):
        try:
            out.append((str(s.get("keyid", "")), base64.b64decode(s["sig"], validate=True)))
        except ValueError:
            raise ValueError(f"signatures[{i}].sig is not base64") from None
    return out


def signature_valid(pub: Ed25519PublicKey, sig: bytes, payload_type: str, payload: bytes) -> bool:
    try:
        pub.verify(sig, pae(payload_type, payload))
        return True
    except InvalidSignature:
        return False


@dataclass(frozen=True)
class SigningRecord:
    """A verified signing record: this key signed this statement at ``signed_utc`` (its own claim)."""

    name: str                    # bundle-relative path
    keyid: str                   # fingerprint of public_key
    public_key: Ed25519PublicKey
    signed_utc: str
    report_id: str


def make_signing_record(private_key: Ed25519PrivateKey, payload: bytes, report_id: str, signed_utc: str) -> bytes:
    """The signing record (a DSSE envelope, JSON text) of ``private_key``'s signature on ``payload``."""
    pub = private_key.public_key()
    statement = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": report_id, "digest": {"sha256": hashlib.sha256(payload).hexdigest()}}],
        "predicateType": RECORD_PREDICATE_TYPE,
        "predicate": {"report_id": report_id, "signed_utc": signed_utc, "keyid": key_fingerprint(pub),
                      "public_key": public_pem(pub)},
    }
    body = canonical(statement)
    envelope = {"payloadType": PAYLOAD_TYPE, "payload": base64.b64encode(body).decode(),
                "signatures": [{"keyid": key_fingerprint(pub),
                                "sig": base64.b64encode(private_key.sign(pae(PAYLOAD_TYPE, body))).decode()}]}
    return (json.dumps(envelope, indent=1) + "\n").encode()


def write_signing_record(bundle_dir: str | Path, private_key: Ed25519PrivateKey, payload: bytes, report_id: str,
                         signed_utc: str) -> str:
    """Write ``private_key``'s signing record of ``payload`` into ``bundle_dir`` (``signatures/<hex>.dsse.json``,
    replacing one there); return its bundle-relative path. ``write_bundle`` calls this for the original
    signature, so every signature kvgate makes is dated by its own signed record."""
    rel = record_name(private_key.public_key())
    path = Path(bundle_dir) / rel
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(make_signing_record(private_key, payload, report_id, signed_utc))
    return rel


def read_signing_record(rel: str, text: str, payload: bytes, report_id: str) -> SigningRecord:
    """Parse and check one record (its JSON text) against the bundle's statement payload; InputFileError
    naming ``rel`` says what is wrong."""
    def bad(msg: str) -> InputFileError:
        return InputFileError(rel, None, msg)

    m = _RECORD_RE.match(rel)
    if not m:
        raise bad("not a signing record name (expected signatures/<64 hex>.dsse.json)")
    ptype, body, sigs = parse_envelope(text, rel)
    name = f"{rel} payload"
    st = parse_json(decode_utf8(body, name), name)
    check_keys(st, STATEMENT_KEYS, name, "statement", root=True)
    if ptype != PAYLOAD_TYPE or st.get("_type") != STATEMENT_TYPE or st.get("predicateType") != RECORD_PREDICATE_TYPE:
        raise bad("not a kvgate signing record (payloadType, _type or predicateType)")
    pred = st.get("predicate")
    check_keys(pred, RECORD_PREDICATE_KEYS, name, "predicate")
    if not isinstance(pred.get("public_key"), str):
        raise bad("malformed signing record: predicate.public_key must be a PEM string")
    try:
        pub = serialization.load_pem_public_key(pred["public_key"].encode())
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise bad(f"malformed signing record: the public key does not load: {exc}") from None
    if not isinstance(pub, Ed25519PublicKey):
        raise bad("the record's public key is not Ed25519")
    if hashlib.sha256(raw_public(pub)).hexdigest() != m.group(1):
        raise bad("file name does not match the record's public key")
    try:
        raw_sigs = decode_signatures(sigs)
    except ValueError as exc:
        raise bad(f"malformed signing record: {exc}") from None
    if not any(signature_valid(pub, sig, PAYLOAD_TYPE, body) for _, sig in raw_sigs):
        raise bad("the record is not signed by its own key")
    want = [{"name": report_id, "digest": {"sha256": hashlib.sha256(payload).hexdigest()}}]
    if st.get("subject") != want or pred.get("report_id") != report_id:
        raise bad("the record is for another statement")
    signed = pred.get("signed_utc")
    if not isinstance(signed, str) or not re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", signed):
        raise bad(f"signed_utc {signed!r} is not YYYY-MM-DDTHH:MM:SSZ")
    return SigningRecord(rel, key_fingerprint(pub), pub, signed, report_id)


def record_files(bundle_dir: Path) -> tuple[list[str], str | None]:
    """The bundle-relative paths under ``signatures/`` (not following links), and the first entry that cannot
    be a signing record (a link, a subdirectory, a FIFO...), or None."""
    root = Path(bundle_dir) / SIGNATURES_DIR
    try:
        mode = root.lstat().st_mode
    except FileNotFoundError:
        return [], None
    if not stat.S_ISDIR(mode):
        return [], f"{SIGNATURES_DIR}: not a directory"
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        for dn in sorted(dirnames):
            return out, f"{Path(dirpath, dn).relative_to(bundle_dir).as_posix()}: a directory inside {SIGNATURES_DIR}/"
        for fn in sorted(filenames):
            out.append(Path(dirpath, fn).relative_to(bundle_dir).as_posix())
    return sorted(out), None


def check_signing_records(bundle_dir: Path, payload_type: str, payload: bytes, signatures: list[tuple[str, bytes]],
                          report_id: str, created_utc: str | None) -> tuple[dict[str, SigningRecord], str | None]:
    """Every file under ``signatures/``: a valid record of a key that has a valid signature in the envelope,
    dated no earlier than the statement. Returns (keyid -> record, first error or None). Each record is
    read with the hardened reader (a regular file, no symlink, at most MAX_RECORD_BYTES)."""
    records: dict[str, SigningRecord] = {}
    rels, problem = record_files(bundle_dir)
    if problem:
        return records, problem
    for rel in rels:
        try:
            if not _RECORD_RE.match(rel):
                raise InputFileError(rel, None, "not a signing record name (expected signatures/<64 hex>.dsse.json)")
            text = read_text(Path(bundle_dir) / rel, max_bytes=MAX_RECORD_BYTES, what="signing record",
                             follow_symlinks=False, display_name=rel)
            rec = read_signing_record(rel, text, payload, report_id)
        except InputFileError as exc:
            return records, str(exc)
        if not any(signature_valid(rec.public_key, sig, payload_type, payload) for _, sig in signatures):
            return records, (f"{rel}: signing record of key {rec.keyid}, which has no signature in the envelope "
                             "(an interrupted kvgate cosign? run it again)")
        if created_utc and rec.signed_utc < created_utc:
            return records, f"{rel}: signed_utc {rec.signed_utc} is before the report was created ({created_utc})"
        records[rec.keyid] = rec
    return records, None
