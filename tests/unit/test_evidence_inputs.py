"""The files the evidence commands read go through kvgate's hardened readers (harness.safeio,
harness.config.yamlload): a key file, a signing record, a bundle's envelope, a library's index, a file in a
bundle that is not a regular file. Each is refused in one line naming the file (and the line, where there is
one); nothing hangs on a FIFO, nothing is read past its size cap."""

import json
import os
import shutil

import pytest

from evidence_fixture import acceptance_bundle, created_of
from harness.errors import BundleError, ConfigError, VerificationError
from harness.report.bundle import ENVELOPE, generate_keypair, load_private_key, verify_bundle
from harness.report.cosign import cosign_bundle, verify_signers
from harness.report.dsse import MAX_RECORD_BYTES, record_name
from harness.report.keyring import KeyEntry, keyring_from_pubkeys, load_keyring
from harness.report.library import build_library, check_library, tree_digest
from harness.safeio import MAX_KEY_BYTES

pytestmark = pytest.mark.timeout(120)  # a FIFO opened for reading would block: fail instead of hanging

CREATED = "2026-03-01T10:00:00Z"


@pytest.fixture
def keys(tmp_path):
    return {n: generate_keypair(tmp_path / "keys" / n) for n in ("vendor", "customer")}


@pytest.fixture
def signed(tmp_path, keys):
    return acceptance_bundle(tmp_path, tmp_path / "runs", keys["vendor"][0], CREATED)


def vendor(keys):
    return KeyEntry(name="V", public_key=keys["vendor"][1].read_text())


# ------------------------------------------------------------------------------------------ key files


def test_a_keyring_key_file_that_is_not_a_regular_file_is_named_at_its_line(tmp_path, keys):
    os.mkfifo(tmp_path / "fifo.pub")
    (tmp_path / "dir.pub").mkdir()
    (tmp_path / "big.pub").write_bytes(b"x" * (MAX_KEY_BYTES + 1))
    ring = tmp_path / "ring.yaml"
    ring.write_text("keys:\n"
                    "  - name: F\n    public_key_file: fifo.pub\n"
                    "  - name: D\n    public_key_file: dir.pub\n"
                    "  - name: B\n    public_key_file: big.pub\n"
                    "  - name: M\n    public_key_file: missing.pub\n")
    with pytest.raises(ConfigError) as exc:
        load_keyring(ring)
    assert [str(i) for i in exc.value.issues] == [
        f"{ring}:3: keys[0].public_key_file: cannot use {tmp_path}/fifo.pub: is a FIFO, not a regular key file",
        f"{ring}:5: keys[1].public_key_file: cannot use {tmp_path}/dir.pub: is a directory, not a regular key file",
        f"{ring}:7: keys[2].public_key_file: cannot use {tmp_path}/big.pub: is larger than the 64 KiB limit for a "
        f"key file ({MAX_KEY_BYTES + 1} bytes)",
        f"{ring}:9: keys[3].public_key_file: cannot use {tmp_path}/missing.pub: no such file",
    ]


def test_a_keyring_with_yaml_tricks_is_refused_by_the_hardened_loader(tmp_path, keys):
    ring = tmp_path / "ring.yaml"
    ring.write_text("keys:\n  - &k\n    name: A\n    public_key_file: keys/vendor.pub\n  - <<: *k\n    name: B\n")
    with pytest.raises(ConfigError) as exc:
        load_keyring(ring)
    assert [str(i) for i in exc.value.issues] == [
        f"{ring}:5: keys[1]: YAML merge keys are not supported (write the keys out)"]


def test_a_pubkey_that_is_not_a_regular_file_is_one_line(tmp_path, keys):
    os.mkfifo(tmp_path / "fifo.pub")
    with pytest.raises(BundleError, match=rf"^{tmp_path}/fifo.pub: is a FIFO, not a regular key file$"):
        keyring_from_pubkeys([tmp_path / "fifo.pub"])
    (tmp_path / "bin.pub").write_bytes(b"\xff\xfe")
    with pytest.raises(BundleError, match=r"bin.pub: not a PEM public key"):
        keyring_from_pubkeys([tmp_path / "bin.pub"])
    assert keyring_from_pubkeys([keys["vendor"][1]])[0].name == "vendor.pub"


# ------------------------------------------------------------------------------------------ signing records


@pytest.mark.parametrize("kind", ["fifo", "symlink", "big", "subdir", "duplicate_key"])
def test_a_bad_signing_record_fails_verification_naming_it(signed, keys, kind):
    cust = load_private_key(keys["customer"][0])
    cosign_bundle(signed.path, cust, now=created_of(signed.path).replace(hour=23))
    rel = record_name(cust.public_key())
    rec = signed.path / rel
    good = rec.read_text()
    rec.unlink()
    if kind == "fifo":
        os.mkfifo(rec)
        want = f"{rel}: a FIFO, not a regular file"  # the one tree walk names it first
    elif kind == "symlink":
        (signed.path.parent / "elsewhere.json").write_text(good)
        rec.symlink_to(signed.path.parent / "elsewhere.json")
        want = f"{rel}: a symbolic link, not a regular file"  # the one tree walk names it first
    elif kind == "big":
        rec.write_text(good[:-2] + " " * MAX_RECORD_BYTES + "}\n")
        want = f"{rel}: is larger than the 64 KiB limit for a signing record"
    elif kind == "subdir":
        rec.write_text(good)
        (signed.path / "signatures" / "more").mkdir()
        want = "signatures/more/: an empty directory"  # the one tree walk names it first
    else:
        env = json.loads(good)
        rec.write_text('{\n "payloadType": "x",' + json.dumps(env, indent=1)[1:])
        want = f"{rel}:3: duplicate key 'payloadType'"
    res = verify_bundle(signed.path, keys["vendor"][1])
    assert not res.ok and want in res.error and "\n" not in res.error, res.error
    r = verify_signers(signed.path, trusted=[vendor(keys)])
    assert not r.ok and want in r.error, r.error


# ------------------------------------------------------------------------------------------ envelopes


def test_an_envelope_with_a_duplicate_key_is_not_cosigned(signed, keys):
    env_path = signed.path / ENVELOPE
    text = env_path.read_text()
    env_path.write_text(text.replace('"payloadType"', '"payloadType": "x",\n "payloadType"', 1))
    before = env_path.read_bytes()
    records = sorted(p.name for p in (signed.path / "signatures").iterdir())  # the original signer's own record
    with pytest.raises(VerificationError, match=r"not cosigned: .*attestation.dsse.json:\d+: duplicate key 'payloadType'"):
        cosign_bundle(signed.path, load_private_key(keys["customer"][0]))
    assert env_path.read_bytes() == before
    assert sorted(p.name for p in (signed.path / "signatures").iterdir()) == records  # no record added
    r = verify_signers(signed.path, trusted=[vendor(keys)])
    assert not r.ok and "attestation.dsse.json:" in r.error and "duplicate key 'payloadType'" in r.error


def test_an_envelope_that_is_a_fifo_is_named_without_blocking(signed, keys):
    env_path = signed.path / ENVELOPE
    env_path.unlink()
    os.mkfifo(env_path)
    r = verify_signers(signed.path, trusted=[vendor(keys)])
    assert not r.ok and r.error == f"{ENVELOPE}: is a FIFO, not a regular envelope"
    with pytest.raises(VerificationError, match="is a FIFO"):
        cosign_bundle(signed.path, load_private_key(keys["customer"][0]))


def test_an_unreadable_archive_is_a_failed_verification_in_one_line(tmp_path, keys):
    tar = tmp_path / "KVG-20260101-00000000.tar.gz"
    tar.write_bytes(b"\x1f\x8b\x08\x00" + b"\x00" * 40)
    r = verify_signers(tar, trusted=[vendor(keys)])
    assert not r.ok and r.error.startswith(f"{tar}: not a readable bundle archive")


# ------------------------------------------------------------------------------------------ the library


def test_a_bundle_holding_a_fifo_is_listed_as_failed_and_never_opened(signed, keys, tmp_path):
    shutil.rmtree(signed.path)
    src = tmp_path / "src"
    b = acceptance_bundle(tmp_path, src, keys["vendor"][0], "2026-03-02T10:00:00Z", make_tar=False)
    os.mkfifo(b.path / "pipe")
    d1 = tree_digest(b.path)
    assert d1 == tree_digest(b.path)  # the FIFO is described by its type, never read
    res = build_library([src], tmp_path / "site", [vendor(keys)], built_utc="2026-07-01T00:00:00Z")
    (e,) = res.entries
    assert e["status"] == "failed" and e["reason"].startswith("pipe: a FIFO, not a regular file"), e


def test_a_library_index_that_is_not_strict_json_is_one_line(signed, keys, tmp_path):
    site = tmp_path / "site"
    build_library([signed.path.parent], site, [vendor(keys)], built_utc="2026-07-01T00:00:00Z")
    assert check_library(site, [vendor(keys)]).ok
    lib = site / "library.json"
    text = lib.read_text()
    lib.write_text(text.replace('"format"', '"built_utc": "x",\n "format"', 1))
    with pytest.raises(BundleError, match=rf"^{site}: not a kvgate library: {lib}:\d+: duplicate key 'built_utc'"):
        check_library(site, [vendor(keys)])
    lib.write_text(json.dumps({"format": "kvgate-library/v1", "built_utc": "x", "bundles": {}}))
    with pytest.raises(BundleError, match="not a kvgate library .*a list of bundles"):
        check_library(site, [vendor(keys)])
    lib.unlink()
    os.mkfifo(lib)
    with pytest.raises(BundleError, match=f"{lib}: is a FIFO, not a regular library index"):
        check_library(site, [vendor(keys)])
