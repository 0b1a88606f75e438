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


def third_party_report_id(bundle_dir) -> str:
    """The report ID derived as docs/evidence.md ("What a report ID binds") says, with hashlib and json only:
    no kvgate code. Raises AssertionError where a verifier must refuse."""
    import hashlib
    import os
    import re
    import stat

    env = json.loads((bundle_dir / ENVELOPE).read_text())
    payload = base64.b64decode(env["payload"], validate=True)
    st = json.loads(payload)
    assert json.dumps(st, sort_keys=True, separators=(",", ":")).encode() == payload, "payload not canonical"
    pred = st["predicate"]
    rid = pred["report_id"]
    assert re.fullmatch(r"KVG-\d{8}-[0-9a-f]{64}", rid) and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ",
                                                                         pred["created_utc"])
    placeholder = b"KVG-00000000-" + b"0" * 64
    files, dirs_with_files, dirs = set(), set(), set()
    for dirpath, dirnames, filenames in os.walk(bundle_dir):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, bundle_dir).replace(os.sep, "/")
            mode = os.lstat(p).st_mode
            if stat.S_ISDIR(mode):
                dirs.add(rel)
            else:
                assert stat.S_ISREG(mode), f"{rel}: not a regular file"
                files.add(rel)
                parts = rel.split("/")
                dirs_with_files.update("/".join(parts[:i]) for i in range(1, len(parts)))
    assert dirs <= dirs_with_files, "an empty directory"
    named = {s["name"] for s in st["subject"]}
    assert files - {ENVELOPE} - {f for f in files if f.startswith("signatures/")} == named
    core_subjects = []
    for s in sorted(st["subject"], key=lambda s: s["name"]):
        data = (bundle_dir / s["name"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == s["digest"]["sha256"]
        assert placeholder not in data
        core_subjects.append({"name": s["name"], "digest": {"sha256": hashlib.sha256(
            data.replace(rid.encode(), placeholder)).hexdigest()}})
    core = {"scheme": "kvgate-report-id/v2", "subject": core_subjects,
            "predicate": {k: v for k, v in pred.items() if k != "report_id"}}
    digest = hashlib.sha256(json.dumps(core, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    derived = f"KVG-{pred['created_utc'][:10].replace('-', '')}-{digest}"
    assert derived == rid, f"claimed {rid}, derived {derived}"
    return derived


def test_a_third_party_derives_the_report_id_from_every_byte(cosigned, tmp_path):
    """The documented derivation, implemented here without kvgate, gives the bundle's ID; changing any file
    (the rendered report.html included) and re-hashing it into the statement derives another ID."""
    _, info, _ = cosigned
    assert third_party_report_id(info.path) == info.report_id == info.path.name
    assert info.report_id in (info.path / "report.html").read_text()  # the reports print the ID they bind
    copy = shutil.copytree(info.path, tmp_path / "copy")
    html = copy / "report.html"
    html.write_text(html.read_text().replace("FAIL", "PASS"))
    env = json.loads((copy / ENVELOPE).read_text())
    st = json.loads(base64.b64decode(env["payload"]))
    import hashlib
    for s in st["subject"]:
        if s["name"] == "report.html":
            s["digest"]["sha256"] = hashlib.sha256(html.read_bytes()).hexdigest()
    env["payload"] = base64.b64encode(json.dumps(st, sort_keys=True, separators=(",", ":")).encode()).decode()
    (copy / ENVELOPE).write_text(json.dumps(env))
    with pytest.raises(AssertionError, match="claimed"):
        third_party_report_id(copy)
