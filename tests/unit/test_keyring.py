"""Keyring files: every error as FILE:LINE: path: message, all at once; times and roles as documented."""

from datetime import datetime, timezone

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from harness.report.bundle import generate_keypair
from harness.errors import ConfigError
from harness.report.keyring import load_keyring


def pem_block(pub_path, indent="      "):
    return "|\n" + "".join(indent + line + "\n" for line in pub_path.read_text().splitlines())


@pytest.fixture
def pubs(tmp_path):
    return [generate_keypair(tmp_path / n)[1] for n in ("a", "b")]


def errors(path):
    with pytest.raises(ConfigError) as exc:
        load_keyring(path)
    return [str(i) for i in exc.value.issues]


def test_a_good_keyring(tmp_path, pubs):
    ring = tmp_path / "ring.yaml"
    ring.write_text(f"""keys:
  - name: Acme QA
    role: vendor
    public_key_file: a.pub
    valid_from: 2026-01-01
    valid_until: 2026-12-31
  - name: Example Bank
    role: customer
    public_key: {pem_block(pubs[1])}    revoked: 2026-06-01T12:00:00Z
    revocation_reason: laptop lost
""")
    kr = load_keyring(ring)
    a, b = kr.entries
    assert (a.label, b.label) == ("Acme QA (vendor)", "Example Bank (customer)")
    assert a.valid_from == datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert a.valid_until == datetime(2027, 1, 1, tzinfo=timezone.utc)  # through the end of the day
    assert b.revoked == datetime(2026, 6, 1, 12, tzinfo=timezone.utc)
    assert b.refusal(datetime(2026, 6, 1, 11, 59, 59, tzinfo=timezone.utc)) is None
    assert "after the key's revocation" in b.refusal(datetime(2026, 6, 1, 12, tzinfo=timezone.utc))
    assert a.refusal(datetime(2026, 12, 31, 23, 59, tzinfo=timezone.utc)) is None
    # the keyring a published library carries round-trips, keys inline
    copy = tmp_path / "copy.yaml"
    copy.write_text(kr.to_yaml())
    again = load_keyring(copy)
    assert [(e.name, e.role, e.fingerprint, e.valid_until, e.revoked, e.revocation_reason) for e in again.entries] == \
        [(e.name, e.role, e.fingerprint, e.valid_until, e.revoked, e.revocation_reason) for e in kr.entries]


def test_unknown_role_and_malformed_keys_are_reported_with_lines(tmp_path, pubs):
    rsa_pub = tmp_path / "rsa.pub"
    rsa_pub.write_bytes(rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    ring = tmp_path / "ring.yaml"
    ring.write_text("""keys:
  - name: Acme QA
    role: auditor
    public_key_file: a.pub
  - name: Broken
    role: lab
    public_key: |
      -----BEGIN PUBLIC KEY-----
      bm90IGEga2V5
      -----END PUBLIC KEY-----
  - name: RSA
    role: lab
    public_key_file: rsa.pub
  - name: Nothing
    role: customer
  - name: Acme QA
    role: vendor
    public_key_file: a.pub
    colour: blue
""")
    assert errors(ring) == [
        f"{ring}:3: keys[0].role: unknown role 'auditor' (expected one of: vendor, customer, lab)",
        f"{ring}:7: keys[1].public_key: not a PEM public key (the data between BEGIN and END does not decode to a key)",
        f"{ring}:13: keys[2].public_key_file: not an Ed25519 public key (RSAPublicKey); kvgate signs with Ed25519",
        f"{ring}:14: keys[3]: give exactly one of public_key (PEM text) and public_key_file",
        f"{ring}:19: keys[4].colour: unknown key (not allowed here; check spelling)",
    ]


def test_duplicates_and_inconsistent_dates(tmp_path, pubs):
    ring = tmp_path / "ring.yaml"
    ring.write_text(f"""keys:
  - name: A
    public_key_file: a.pub
  - name: A
    public_key: {pem_block(pubs[0])}  - name: C
    public_key_file: b.pub
    valid_from: 2026-05-01
    valid_until: 2026-04-01
""")
    assert errors(ring) == [f"{ring}:9: keys[2]: valid_until must be after valid_from"]
    ring.write_text(ring.read_text().replace("valid_until: 2026-04-01", "valid_until: 2026-06-01"))
    assert errors(ring) == [
        f"{ring}:5: keys[1].public_key: the same key as keys[0] (A); list each key once",
        f"{ring}:4: keys[1].name: duplicate name (also keys[0]); names identify signers",
    ]


def test_yaml_errors_keep_their_line(tmp_path):
    ring = tmp_path / "ring.yaml"
    ring.write_text("keys:\n  - name: [unclosed\n")
    (e,) = errors(ring)
    assert e.startswith(f"{ring}:") and "YAML syntax error" in e
