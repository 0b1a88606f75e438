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
statement. The signing time of the bundle's original signature is the statement's own ``created_utc``
(the original signer is the predicate's ``signing_key.fingerprint``), which that signature covers.

What a signed time does not prove: that the key holder's clock was right. A holder of a stolen key can
write any time, including one before the revocation; only a third party's timestamp (RFC 3161, a
transparency log) would bound that, and kvgate works offline. Records are outside the statement's
subjects (they are made after it), so adding one never changes the report ID or any subject.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
RECORD_PREDICATE_TYPE = "https://kvgate.dev/signing-record/v1"
SIGNATURES_DIR = "signatures"
_RECORD_RE = re.compile(r"^signatures/([0-9a-f]{64})\.dsse\.json$")
UTC_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


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


def envelope_signatures(envelope: dict) -> list[tuple[str, bytes]]:
    """(keyid hint, signature bytes) of every entry; ValueError on a malformed one."""
    sigs = envelope.get("signatures")
    if not isinstance(sigs, list) or not sigs:
        raise ValueError("no signatures")
    out = []
    for i, s in enumerate(sigs):
        if not isinstance(s, dict) or not isinstance(s.get("sig"), str):
            raise ValueError(f"signatures[{i}] is not {{keyid, sig}}")
        out.append((str(s.get("keyid", "")), base64.b64decode(s["sig"], validate=True)))
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


def read_signing_record(rel: str, data: bytes, payload: bytes, report_id: str) -> SigningRecord:
    """Parse and check one record against the bundle's statement payload; ValueError says what is wrong."""
    m = _RECORD_RE.match(rel)
    if not m:
        raise ValueError("not a signing record name (expected signatures/<64 hex>.dsse.json)")
    try:
        env = json.loads(data)
        body = base64.b64decode(env["payload"], validate=True)
        st = json.loads(body)
        pred = st["predicate"]
        pub = serialization.load_pem_public_key(pred["public_key"].encode())
        sigs = envelope_signatures(env)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed signing record: {exc}") from None
    if env.get("payloadType") != PAYLOAD_TYPE or st.get("_type") != STATEMENT_TYPE \
            or st.get("predicateType") != RECORD_PREDICATE_TYPE:
        raise ValueError("not a kvgate signing record (payloadType, _type or predicateType)")
    if not isinstance(pub, Ed25519PublicKey):
        raise ValueError("the record's public key is not Ed25519")
    if hashlib.sha256(raw_public(pub)).hexdigest() != m.group(1):
        raise ValueError("file name does not match the record's public key")
    if not any(signature_valid(pub, sig, PAYLOAD_TYPE, body) for _, sig in sigs):
        raise ValueError("the record is not signed by its own key")
    want = [{"name": report_id, "digest": {"sha256": hashlib.sha256(payload).hexdigest()}}]
    if st.get("subject") != want or pred.get("report_id") != report_id:
        raise ValueError("the record is for another statement")
    signed = pred.get("signed_utc")
    if not isinstance(signed, str) or not re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", signed):
        raise ValueError(f"signed_utc {signed!r} is not YYYY-MM-DDTHH:MM:SSZ")
    return SigningRecord(rel, key_fingerprint(pub), pub, signed, report_id)


def check_signing_records(bundle_dir: Path, payload_type: str, payload: bytes, signatures: list[tuple[str, bytes]],
                          report_id: str, created_utc: str | None) -> tuple[dict[str, SigningRecord], str | None]:
    """Every file under ``signatures/``: a valid record of a key that has a valid signature in the envelope,
    dated no earlier than the statement. Returns (keyid -> record, first error or None)."""
    records: dict[str, SigningRecord] = {}
    root = Path(bundle_dir) / SIGNATURES_DIR
    if not root.exists():
        return records, None
    if not root.is_dir():
        return records, f"{SIGNATURES_DIR}: not a directory"
    for p in sorted(root.rglob("*")):
        if p.is_dir():
            continue
        rel = p.relative_to(bundle_dir).as_posix()
        try:
            rec = read_signing_record(rel, p.read_bytes(), payload, report_id)
        except (OSError, ValueError) as exc:
            return records, f"{rel}: {exc}"
        if not any(signature_valid(rec.public_key, sig, payload_type, payload) for _, sig in signatures):
            return records, (f"{rel}: signing record of key {rec.keyid}, which has no signature in the envelope "
                             "(an interrupted kvgate cosign? run it again)")
        if created_utc and rec.signed_utc < created_utc:
            return records, f"{rel}: signed_utc {rec.signed_utc} is before the report was created ({created_utc})"
        records[rec.keyid] = rec
    return records, None
