"""kvgate cosign and signature judging: the statement never changes, both twins stay consistent, every
signature has a signed time, and a keyring refuses signatures made after a key's revocation."""

import base64
import json
import shutil
import tarfile
from datetime import datetime, timedelta, timezone

import pytest

from evidence_fixture import acceptance_bundle, created_of, statement
from harness.report.bundle import ENVELOPE, generate_keypair, key_fingerprint, load_private_key, pae, verify_bundle
from harness.report.cosign import cosign_bundle, verify_signers
from harness.report.dsse import record_name
from harness.errors import BundleError
from harness.report.keyring import KeyEntry, fmt_utc, load_keyring

CREATED = "2026-03-01T10:00:00Z"
AT = datetime(2026, 3, 2, 9, 30, tzinfo=timezone.utc)  # a cosigning time after CREATED


@pytest.fixture
def keys(tmp_path):
    out = {}
    for name in ("vendor", "customer", "lab"):
        key, pub = generate_keypair(tmp_path / "keys" / name)
        out[name] = (key, pub)
    return out


@pytest.fixture
def signed(tmp_path, keys):
    return acceptance_bundle(tmp_path, tmp_path / "runs", keys["vendor"][0], CREATED)


def entry(name, pub, role=None, **kw):
    return KeyEntry(name=name, role=role, public_key=pub.read_text(), **kw)


def tar_member(tar, rel):
    with tarfile.open(tar) as tf:
        return tf.extractfile(tf.getmember(rel)).read()


def test_cosign_keeps_statement_and_subjects_and_updates_both_twins(signed, keys, tmp_path):
    before_st, before_payload = statement(signed.path)
    files_before = {p.relative_to(signed.path).as_posix(): p.read_bytes()
                    for p in signed.path.rglob("*") if p.is_file() and p.name != ENVELOPE}
    cust = load_private_key(keys["customer"][0])
    at = created_of(signed.path) + timedelta(days=2)
    res = cosign_bundle(signed.tar_path, cust, now=at)
    assert res.action == "signed" and res.report_id == signed.report_id
    assert res.signed_utc == fmt_utc(at) and res.directory == signed.path and res.archive == signed.tar_path
    after_st, after_payload = statement(signed.path)
    assert after_payload == before_payload  # the same statement: report ID and every subject unchanged
    files_after = {p.relative_to(signed.path).as_posix(): p.read_bytes()
                   for p in signed.path.rglob("*") if p.is_file() and p.name != ENVELOPE}
    rec = record_name(cust.public_key())
    assert set(files_after) - set(files_before) == {rec}
    assert record_name(load_private_key(keys["vendor"][0]).public_key()) in files_before  # the original's record
    assert all(files_after[k] == v for k, v in files_before.items())
    env = json.loads((signed.path / ENVELOPE).read_text())
    assert [s["keyid"] for s in env["signatures"]] == [key_fingerprint(load_private_key(keys["vendor"][0]).public_key()),
                                                      key_fingerprint(cust.public_key())]
    # the twin archive carries the same envelope and record
    assert tar_member(signed.tar_path, f"{signed.report_id}/{ENVELOPE}") == (signed.path / ENVELOPE).read_bytes()
    assert tar_member(signed.tar_path, f"{signed.report_id}/{rec}") == (signed.path / rec).read_bytes()
    for b in (signed.path, signed.tar_path):
        for k in ("vendor", "customer"):
            assert verify_bundle(b, keys[k][1]).ok, (b, k)
        r = verify_signers(b, trusted=[entry("V", keys["vendor"][1]), entry("C", keys["customer"][1])],
                           require_keys=[entry("V", keys["vendor"][1]), entry("C", keys["customer"][1])])
        assert r.ok, r.error
        assert [(c.name, c.status, c.signed_utc, c.time_source) for c in r.signatures] == [
            ("V", "accepted", CREATED, "signing record"), ("C", "accepted", fmt_utc(at), "signing record")]
    assert not [p for p in signed.path.parent.iterdir() if p.name.startswith(".")]


def test_cosign_an_archive_alone_and_again(signed, keys, tmp_path):
    shutil.rmtree(signed.path)
    cust = load_private_key(keys["customer"][0])
    res = cosign_bundle(signed.tar_path, cust, now=created_of_tar(signed.tar_path, tmp_path) + timedelta(hours=1))
    assert res.action == "signed" and res.directory is None
    assert not signed.path.exists() and not [p for p in signed.tar_path.parent.iterdir() if p.name.startswith(".")]
    assert verify_bundle(signed.tar_path, keys["customer"][1]).ok
    data = signed.tar_path.read_bytes()
    again = cosign_bundle(signed.tar_path, cust, now=AT)
    assert again.action == "already signed" and signed.tar_path.read_bytes() == data


def created_of_tar(tar, tmp_path):
    with tarfile.open(tar) as tf:
        tf.extractall(tmp_path / "peek", filter="data")
    return created_of(next((tmp_path / "peek").iterdir()))


def test_a_stale_archive_is_rebuilt_and_a_richer_one_is_not_overwritten(signed, keys, tmp_path):
    old_tar = signed.tar_path.read_bytes()
    cust = load_private_key(keys["customer"][0])
    cosign_bundle(signed.path, cust, now=AT)
    signed.tar_path.write_bytes(old_tar)  # as if interrupted before the archive was rebuilt
    res = cosign_bundle(signed.path, cust, now=AT)
    assert res.action == "already signed" and res.archive_refreshed
    assert verify_bundle(signed.tar_path, keys["customer"][1]).ok
    # an archive signed by the lab, whose directory the lab never signed: refused, nothing changes
    lab_copy = tmp_path / "lab"
    lab_copy.mkdir()
    shutil.copy(signed.tar_path, lab_copy / signed.tar_path.name)
    cosign_bundle(lab_copy / signed.tar_path.name, load_private_key(keys["lab"][0]), now=AT)
    shutil.copy(lab_copy / signed.tar_path.name, signed.tar_path)
    env_before = (signed.path / ENVELOPE).read_bytes()
    with pytest.raises(BundleError, match="holds signatures that .* lacks"):
        cosign_bundle(signed.path, load_private_key(keys["vendor"][0]), now=AT)
    assert (signed.path / ENVELOPE).read_bytes() == env_before


def test_a_tampered_bundle_is_not_cosigned(signed, keys):
    (signed.path / "verdicts.json").write_text("{}")
    env = (signed.path / ENVELOPE).read_bytes()
    with pytest.raises(BundleError, match="not cosigned: .*verdicts.json: sha256 does not match"):
        cosign_bundle(signed.path, load_private_key(keys["customer"][0]), now=AT)
    assert (signed.path / ENVELOPE).read_bytes() == env
    assert not (signed.path / record_name(load_private_key(keys["customer"][0]).public_key())).exists()


def test_cosign_checks_the_given_signer_first(signed, keys):
    with pytest.raises(BundleError, match="not cosigned: .*signature does not verify"):
        cosign_bundle(signed.path, load_private_key(keys["customer"][0]), trusted=[entry("L", keys["lab"][1])])


def test_signing_records_are_checked(signed, keys):
    cust = load_private_key(keys["customer"][0])
    cosign_bundle(signed.path, cust, now=created_of(signed.path) + timedelta(hours=1))
    rec = signed.path / record_name(cust.public_key())
    good = rec.read_bytes()
    # a flipped byte anywhere in the record's payload or signature
    env = json.loads(good)
    for field in ("payload", "sig"):
        e = json.loads(good)
        target = e if field == "payload" else e["signatures"][0]
        raw = bytearray(base64.b64decode(target[field]))
        raw[len(raw) // 2] ^= 1
        target[field] = base64.b64encode(bytes(raw)).decode()
        rec.write_text(json.dumps(e))
        res = verify_bundle(signed.path, keys["vendor"][1])
        assert not res.ok and record_name(cust.public_key()) in res.error, field
    # a record re-dated by someone without the key: the record's own signature no longer matches
    st = json.loads(base64.b64decode(env["payload"]))
    st["predicate"]["signed_utc"] = "2020-01-01T00:00:00Z"
    env["payload"] = base64.b64encode(json.dumps(st).encode()).decode()
    rec.write_text(json.dumps(env))
    assert "not signed by its own key" in verify_bundle(signed.path, keys["vendor"][1]).error
    rec.write_bytes(good)
    assert verify_bundle(signed.path, keys["vendor"][1]).ok
    # a stray file in signatures/
    (signed.path / "signatures" / "notes.txt").write_text("hi")
    assert "not a signing record name" in verify_bundle(signed.path, keys["vendor"][1]).error


def test_an_interrupted_cosign_is_named_and_repaired(signed, keys):
    cust = load_private_key(keys["customer"][0])
    env_before = (signed.path / ENVELOPE).read_bytes()
    cosign_bundle(signed.path, cust, now=AT)
    (signed.path / ENVELOPE).write_bytes(env_before)  # the record was renamed in, the envelope never was
    res = verify_bundle(signed.path, keys["vendor"][1])
    assert not res.ok and "interrupted kvgate cosign? run it again" in res.error
    assert cosign_bundle(signed.path, cust, now=AT).action == "signed"
    assert verify_bundle(signed.path, keys["customer"][1]).ok


def test_every_named_key_must_have_signed(signed, keys):
    v, c = entry("V", keys["vendor"][1]), entry("C", keys["customer"][1])
    r = verify_signers(signed.path, trusted=[v, c], require_keys=[v, c])
    assert not r.ok and r.error.startswith("no accepted signature by C")
    r = verify_signers(signed.path, trusted=[v, c], require_roles=["customer"])
    assert not r.ok and "role customer" in r.error
    assert verify_signers(signed.path, trusted=[v], require_keys=[v]).ok


def test_revocation_and_validity_judge_the_signed_time(signed, keys):
    created = created_of(signed.path)
    cust = load_private_key(keys["customer"][0])
    cosign_bundle(signed.path, cust, now=created + timedelta(days=10))
    vendor = entry("Acme", keys["vendor"][1], "vendor")

    def judge(**kw):
        r = verify_signers(signed.path, trusted=[vendor, entry("Bank", keys["customer"][1], "customer", **kw)])
        return r, r.signatures[1]

    r, c = judge(revoked=created + timedelta(days=20))
    assert r.ok and c.status == "accepted"  # signed before the revocation
    r, c = judge(revoked=created + timedelta(days=5), revocation_reason="laptop lost")
    assert not r.ok and c.status == "refused"
    assert c.reason == (f"signed {fmt_utc(created + timedelta(days=10))}, after the key's revocation at "
                        f"{fmt_utc(created + timedelta(days=5))} (laptop lost)")
    assert r.error.startswith("signature by Bank (customer) ") and "refused" in r.error
    r, c = judge(valid_from=created + timedelta(days=11))
    assert c.status == "refused" and "before the key's validity" in c.reason
    r, c = judge(valid_until=created + timedelta(days=9))
    assert c.status == "refused" and "after the key expired" in c.reason
    # the original signer's time is its own signing record, written with the bundle
    r = verify_signers(signed.path, trusted=[entry("Acme", keys["vendor"][1], "vendor",
                                                  revoked=created - timedelta(seconds=1))])
    assert not r.ok and r.signatures[0].status == "refused" and r.signatures[0].time_source == "signing record"


def test_a_revoked_key_named_as_signing_key_gets_no_date_from_created_utc(tmp_path, keys):
    """The attacker holds a key revoked on 2026-06-01 and signs a statement whose created_utc (which the
    statement's author writes) says 2026-03-01, naming that key as signing_key, with no signing record (as
    another DSSE tool, or kvgate before records, writes it). The statement's claim dates nothing: refused."""
    forged = acceptance_bundle(tmp_path, tmp_path / "runs", keys["lab"][0], CREATED, make_tar=False)
    shutil.rmtree(forged.path / "signatures")  # the signature alone, no record of when it was made
    lab = entry("Lab", keys["lab"][1], "lab", revoked=datetime(2026, 6, 1, tzinfo=timezone.utc),
                revocation_reason="key stolen")
    assert statement(forged.path)[0]["predicate"]["signing_key"]["fingerprint"] == lab.fingerprint
    r = verify_signers(forged.path, trusted=[lab])
    assert not r.ok
    c = r.signatures[0]
    assert (c.status, c.signed_utc, c.time_source) == ("refused", None, None)
    assert c.reason == "no signed signing time, and the key is revoked since 2026-06-01T00:00:00Z (key stolen)"
    assert "signing time not recorded" in c.line()
    # a key with validity dates is refused the same way; a key without dates or revocation stands (undated)
    r = verify_signers(forged.path, trusted=[entry("Lab", keys["lab"][1], "lab",
                                                   valid_until=datetime(2027, 1, 1, tzinfo=timezone.utc))])
    assert not r.ok and "no signed signing time" in r.signatures[0].reason
    r = verify_signers(forged.path, trusted=[entry("Lab", keys["lab"][1], "lab")])
    assert r.ok and r.signatures[0].signed_utc is None


def test_cosign_by_the_original_signer_adds_its_missing_record(tmp_path, keys):
    """A bundle whose original signature has no record (written before records existed): cosigning it with
    that same key adds the record (dated now) instead of answering "already signed"."""
    old = acceptance_bundle(tmp_path, tmp_path / "runs", keys["vendor"][0], CREATED, make_tar=False)
    shutil.rmtree(old.path / "signatures")
    _, payload = statement(old.path)
    res = cosign_bundle(old.path, load_private_key(keys["vendor"][0]), now=AT)
    assert res.action == "signed" and res.signed_utc == fmt_utc(AT)
    assert statement(old.path)[1] == payload and len(json.loads((old.path / ENVELOPE).read_text())["signatures"]) == 1
    r = verify_signers(old.path, trusted=[entry("V", keys["vendor"][1], revoked=AT + timedelta(days=1))])
    assert r.ok and (r.signatures[0].signed_utc, r.signatures[0].time_source) == (fmt_utc(AT), "signing record")


def test_a_signature_without_a_signed_time_is_refused_for_a_revoked_key(signed, keys):
    """A signature added by another DSSE tool (no signing record): valid, but its time is unknown."""
    created = created_of(signed.path)
    lab = load_private_key(keys["lab"][0])
    env = json.loads((signed.path / ENVELOPE).read_text())
    sig = lab.sign(pae(env["payloadType"], base64.b64decode(env["payload"])))
    env["signatures"].append({"keyid": key_fingerprint(lab.public_key()), "sig": base64.b64encode(sig).decode()})
    (signed.path / ENVELOPE).write_text(json.dumps(env))
    vendor = entry("Acme", keys["vendor"][1], "vendor")
    r = verify_signers(signed.path, trusted=[vendor, entry("Lab", keys["lab"][1], "lab")])
    assert r.ok and r.signatures[1].status == "accepted" and r.signatures[1].signed_utc is None
    r = verify_signers(signed.path, trusted=[vendor, entry("Lab", keys["lab"][1], "lab",
                                                          revoked=created + timedelta(days=300))])
    assert not r.ok and "no signed signing time" in r.signatures[1].reason
    # cosign with that key adds the missing record (dated now), and the signature then has a time
    cosign_bundle(signed.path, lab, now=created + timedelta(days=1))
    r = verify_signers(signed.path, trusted=[vendor, entry("Lab", keys["lab"][1], "lab",
                                                          revoked=created + timedelta(days=300))])
    assert r.ok and r.signatures[1].time_source == "signing record"


def test_unknown_and_invalid_signatures(signed, keys):
    cust = load_private_key(keys["customer"][0])
    cosign_bundle(signed.path, cust, now=AT)
    vendor = entry("Acme", keys["vendor"][1], "vendor")
    r = verify_signers(signed.path, trusted=[vendor])
    assert r.ok and [c.status for c in r.signatures] == ["accepted", "untrusted"]  # record carries the key
    env = json.loads((signed.path / ENVELOPE).read_text())
    raw = bytearray(base64.b64decode(env["signatures"][0]["sig"]))
    raw[0] ^= 1
    env["signatures"][0]["sig"] = base64.b64encode(bytes(raw)).decode()
    (signed.path / ENVELOPE).write_text(json.dumps(env))
    r = verify_signers(signed.path, trusted=[vendor])
    vendor_rec = record_name(load_private_key(keys["vendor"][0]).public_key())
    assert not r.ok and r.error.startswith(f"{vendor_rec}: signing record of key {vendor.fingerprint}, which has no "
                                           "signature in the envelope")
    (signed.path / vendor_rec).unlink()  # as a bundle without the original's record: the signature is judged
    r = verify_signers(signed.path, trusted=[vendor])
    assert not r.ok and r.signatures[0].status == "invalid"
    assert r.error.startswith("signature by Acme (vendor)") and "does not verify" in r.error


def test_keyring_file_drives_the_judgement(signed, keys, tmp_path):
    created = created_of(signed.path)
    cosign_bundle(signed.path, load_private_key(keys["customer"][0]), now=created + timedelta(days=3))
    ring = tmp_path / "ring.yaml"
    ring.write_text(f"""keys:
  - name: Acme QA
    role: vendor
    public_key_file: keys/vendor.pub
  - name: Example Bank
    role: customer
    public_key_file: keys/customer.pub
    revoked: {(created + timedelta(days=1)).date().isoformat()}
    revocation_reason: key handed to a contractor
""")
    r = verify_signers(signed.tar_path.parent / signed.report_id, trusted=list(load_keyring(ring).entries))
    assert not r.ok
    assert [(c.name, c.role, c.status) for c in r.signatures] == [("Acme QA", "vendor", "accepted"),
                                                                   ("Example Bank", "customer", "refused")]
