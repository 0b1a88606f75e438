"""A co-signed bundle verified by code this project did not write.

- securesystemslib's DSSE implementation (``securesystemslib.dsse.Envelope.verify``, threshold = every signer)
  verifies the envelope and each signing record;
- ``openssl pkeyutl -verify -rawin`` verifies every signature over the pre-authentication bytes, which come
  from securesystemslib's ``Envelope.pae()`` (not from kvgate's own ``pae``);
- the statement and every signing record parse strictly (unknown fields rejected) into the in-toto
  attestation framework's Statement v1 protobuf (PyPI ``in-toto-attestation``) and pass its ``validate()``.
Each check is shown to fail on a tampered input, so none of them passes by accident.
"""

import base64
import json
import shutil
import subprocess
from datetime import timedelta

import pytest
from google.protobuf import json_format
from in_toto_attestation.v1.statement import Statement
from in_toto_attestation.v1.statement_pb2 import Statement as StatementPb
from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import SSlibKey

from evidence_fixture import acceptance_bundle, created_of
from harness.report.bundle import ENVELOPE, generate_keypair, key_fingerprint, load_private_key, load_public_key
from harness.report.cosign import cosign_bundle
from harness.report.dsse import record_name

pytestmark = pytest.mark.integration

OPENSSL = shutil.which("openssl") or "/usr/bin/openssl"


@pytest.fixture(scope="module")
def cosigned(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("third-party")
    keys = {n: generate_keypair(tmp / "keys" / n) for n in ("vendor", "customer", "lab")}
    info = acceptance_bundle(tmp, tmp / "runs", keys["vendor"][0], "2026-03-01T10:00:00Z")
    cosign_bundle(info.path, load_private_key(keys["customer"][0]), now=created_of(info.path) + timedelta(days=1))
    return tmp, info, keys


def sslib_key(pub_path):
    pub = load_public_key(pub_path)
    return SSlibKey.from_crypto(pub, keyid=key_fingerprint(pub))


def test_securesystemslib_verifies_both_signatures(cosigned):
    _, info, keys = cosigned
    env = Envelope.from_dict(json.loads((info.path / ENVELOPE).read_text()))
    both = [sslib_key(keys["vendor"][1]), sslib_key(keys["customer"][1])]
    accepted = env.verify(both, threshold=2)
    assert set(accepted) == {k.keyid for k in both}
    with pytest.raises(VerificationError):
        env.verify([sslib_key(keys["lab"][1]), both[0]], threshold=2)  # the lab never signed
    tampered = Envelope.from_dict(json.loads((info.path / ENVELOPE).read_text()))
    tampered.payload = tampered.payload.replace(b'"overall":"FAIL"', b'"overall":"PASS"')
    assert tampered.payload != env.payload
    with pytest.raises(VerificationError):
        tampered.verify(both, threshold=1)


def test_securesystemslib_verifies_the_signing_records(cosigned):
    """One record per signature, the original one's included, each signed by its own key only."""
    _, info, keys = cosigned
    assert len(list((info.path / "signatures").iterdir())) == 2
    for who, other in (("vendor", "customer"), ("customer", "vendor")):
        rec = info.path / record_name(load_public_key(keys[who][1]))
        env = Envelope.from_dict(json.loads(rec.read_text()))
        assert list(env.verify([sslib_key(keys[who][1])], threshold=1)) == [
            key_fingerprint(load_public_key(keys[who][1]))]
        with pytest.raises(VerificationError):
            env.verify([sslib_key(keys[other][1])], threshold=1)


def openssl_verify(tmp, pub, message: bytes, sig: bytes) -> subprocess.CompletedProcess:
    (tmp / "msg.bin").write_bytes(message)
    (tmp / "sig.bin").write_bytes(sig)
    return subprocess.run([OPENSSL, "pkeyutl", "-verify", "-pubin", "-inkey", str(pub), "-rawin",
                           "-in", str(tmp / "msg.bin"), "-sigfile", str(tmp / "sig.bin")],
                          capture_output=True, text=True, timeout=60)


def test_openssl_verifies_every_signature_over_the_pae_bytes(cosigned, tmp_path):
    _, info, keys = cosigned
    raw = json.loads((info.path / ENVELOPE).read_text())
    pae_bytes = Envelope.from_dict(json.loads(json.dumps(raw))).pae()  # from_dict consumes its argument
    sigs = {s["keyid"]: base64.b64decode(s["sig"]) for s in raw["signatures"]}
    for who in ("vendor", "customer"):
        pub = keys[who][1]
        sig = sigs[key_fingerprint(load_public_key(pub))]
        r = openssl_verify(tmp_path, pub, pae_bytes, sig)
        assert r.returncode == 0 and "Signature Verified Successfully" in r.stdout, (who, r.stdout, r.stderr)
        bad = bytearray(pae_bytes)
        bad[-2] ^= 1
        r = openssl_verify(tmp_path, pub, bytes(bad), sig)
        assert r.returncode != 0 and "Signature Verification Failure" in r.stdout, (who, r.stdout, r.stderr)
    r = openssl_verify(tmp_path, keys["lab"][1], pae_bytes, sigs[key_fingerprint(load_public_key(keys["vendor"][1]))])
    assert r.returncode != 0


def intoto_validate(payload: bytes) -> Statement:
    pb = json_format.Parse(payload, StatementPb(), ignore_unknown_fields=False)
    st = Statement.copy_from_pb(pb)
    st.validate()
    return st


def test_the_statement_and_records_are_in_toto_statements_v1(cosigned):
    _, info, _ = cosigned
    raw = json.loads((info.path / ENVELOPE).read_text())
    payload = base64.b64decode(raw["payload"])
    st = intoto_validate(payload)
    assert st.pb.predicate_type == "https://kvgate.dev/acceptance-report/v1"
    files = sorted(p.relative_to(info.path).as_posix() for p in info.path.rglob("*")
                   if p.is_file() and p.name != ENVELOPE and not p.relative_to(info.path).as_posix().startswith("signatures/"))
    assert sorted(s.name for s in st.pb.subject) == files
    assert all(set(s.digest) == {"sha256"} and len(s.digest["sha256"]) == 64 for s in st.pb.subject)
    assert st.pb.predicate["report_id"] == info.report_id
    import hashlib

    for rec in sorted((info.path / "signatures").iterdir()):
        rst = intoto_validate(base64.b64decode(json.loads(rec.read_text())["payload"]))
        assert rst.pb.predicate_type == "https://kvgate.dev/signing-record/v1"
        assert [(s.name, dict(s.digest)) for s in rst.pb.subject] == [
            (info.report_id, {"sha256": hashlib.sha256(payload).hexdigest()})]
    # the check can fail: an unknown top-level field, a missing predicateType, a subject without digest
    doc = json.loads(payload)
    for broken in ({**doc, "extra": 1}, {k: v for k, v in doc.items() if k != "predicateType"},
                   {**doc, "subject": [{"name": "x"}]}, {**doc, "_type": "https://in-toto.io/Statement/v0.1"}):
        with pytest.raises((json_format.ParseError, ValueError)):
            intoto_validate(json.dumps(broken).encode())
