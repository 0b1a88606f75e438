"""Bundle tamper detection: any flipped byte, missing or added file, or wrong key fails verify."""

import json
import os
import re
import shutil
import tarfile

import pytest

from harness.report.bundle import ENVELOPE, generate_keypair, load_private_key, verify_bundle, write_bundle


@pytest.fixture
def bundle(tmp_path):
    run = tmp_path / "run"
    (run / "gates" / "G1").mkdir(parents=True)
    (run / "gates" / "G1" / "fio.json").write_text('{"jobs": []}')
    (run / "verdicts.json").write_text(json.dumps({"overall": "PASS"}))
    (run / "empty.txt").write_text("")
    key, pub = generate_keypair(tmp_path / "k")
    other_key, other_pub = generate_keypair(tmp_path / "other")

    def render(rid, d):
        (d / "report.md").write_text(f"# {rid}\n")
        return ["report.md"]

    info = write_bundle(run, tmp_path / "out", load_private_key(key), {"suite": {"name": "t"}}, render=render)
    return info, pub, other_pub


def test_roundtrip_dir_and_tar(bundle):
    info, pub, _ = bundle
    for path in (info.path, info.tar_path):
        res = verify_bundle(path, pub)
        assert res.ok, res.error
        assert res.report_id == info.report_id
    assert (info.path / "report.md").read_text() == f"# {info.report_id}\n"
    assert re.fullmatch(r"KVG-\d{8}-[0-9a-f]{64}", info.report_id)
    assert not [p for p in info.path.parent.iterdir() if p.name.startswith(".incomplete")]


def test_private_key_mode(tmp_path):
    key, pub = generate_keypair(tmp_path / "x")
    assert (os.stat(key).st_mode & 0o777) == 0o600
    with pytest.raises(Exception):
        generate_keypair(tmp_path / "x")


def test_every_flipped_byte_is_caught(bundle, tmp_path):
    info, pub, _ = bundle
    files = sorted(p for p in info.path.rglob("*") if p.is_file())
    assert len(files) >= 4
    for f in files:
        data = f.read_bytes()
        positions = [0, len(data) // 2, len(data) - 1] if data else []
        for pos in positions:
            copy = tmp_path / "copy"
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(info.path, copy)
            target = copy / f.relative_to(info.path)
            b = bytearray(data)
            b[pos] ^= 0x01
            target.write_bytes(bytes(b))
            res = verify_bundle(copy, pub)
            assert not res.ok, f"flip of byte {pos} in {f.name} not caught"
        if not data:
            copy = tmp_path / "copy"
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(info.path, copy)
            (copy / f.relative_to(info.path)).write_bytes(b"x")
            assert not verify_bundle(copy, pub).ok


def test_wrong_key(bundle):
    info, _, other = bundle
    res = verify_bundle(info.path, other)
    assert not res.ok and "signature does not verify" in res.error


def test_removed_and_added_files(bundle, tmp_path):
    info, pub, _ = bundle
    c1 = tmp_path / "c1"
    shutil.copytree(info.path, c1)
    (c1 / "gates" / "G1" / "fio.json").unlink()
    res = verify_bundle(c1, pub)
    assert not res.ok and res.error.startswith("gates/G1/fio.json: missing")
    c2 = tmp_path / "c2"
    shutil.copytree(info.path, c2)
    (c2 / "gates" / "extra.txt").write_text("hi")
    res = verify_bundle(c2, pub)
    assert not res.ok and res.error.startswith("gates/extra.txt: file not in the signed statement")


def test_tampered_tar(bundle, tmp_path):
    info, pub, _ = bundle
    out = tmp_path / "t"
    with tarfile.open(info.tar_path) as tf:
        tf.extractall(out, filter="data")
    d = out / info.report_id
    (d / "verdicts.json").write_text(json.dumps({"overall": "PASS "}))
    bad = tmp_path / "bad.tar.gz"
    with tarfile.open(bad, "w:gz") as tf:
        tf.add(d, arcname=info.report_id)
    res = verify_bundle(bad, pub)
    assert not res.ok and "verdicts.json" in res.error


def test_statement_is_in_toto_v1_naming_every_file(bundle):
    """The signed statement is an in-toto Statement v1 with one subject per file and the report ID."""
    import base64
    info, _, _ = bundle
    env = json.loads((info.path / ENVELOPE).read_text())
    st = json.loads(base64.b64decode(env["payload"]))
    assert st["predicate"]["report_id"] == info.report_id
    assert st["_type"] == "https://in-toto.io/Statement/v1"
    assert {s["name"] for s in st["subject"]} >= {"verdicts.json", "report.md", "gates/G1/fio.json"}


def test_failed_signing_of_a_moved_run_dir_puts_it_back(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "raw.json").write_text("{}")
    key, _ = generate_keypair(tmp_path / "k")

    def broken_render(rid, d):
        (d / "report.md").write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        write_bundle(run, tmp_path / "out", load_private_key(key), {}, render=broken_render, move=True)
    assert sorted(p.name for p in run.iterdir()) == ["raw.json"]
    assert [p.name for p in (tmp_path / "out").iterdir()] == []


def test_moved_run_dir_becomes_the_bundle(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "raw.json").write_text("{}")
    key, pub = generate_keypair(tmp_path / "k")
    info = write_bundle(run, tmp_path / "out", load_private_key(key), {}, move=True, make_tar=False)
    assert not run.exists() and (info.path / "raw.json").exists()
    assert verify_bundle(info.path, pub).ok


def test_a_compressed_bomb_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    """An archive whose members' declared sizes exceed the cap (here lowered to 1 MiB; 4 GiB by default)
    is refused from its headers: nothing unpacked, a one-line reason."""
    import harness.report.bundle as B
    bomb_dir = tmp_path / "KVG-20261130-00000000"
    bomb_dir.mkdir()
    with open(bomb_dir / "zeros.bin", "wb") as f:
        f.truncate(8 << 20)  # 8 MiB of zeros: a few KiB compressed
    tar = tmp_path / "bomb.tar.gz"
    with tarfile.open(tar, "w:gz") as tf:
        tf.add(bomb_dir, arcname=bomb_dir.name)
    assert tar.stat().st_size < 64 << 10
    monkeypatch.setattr(B, "MAX_EXTRACTED_BYTES", 1 << 20)
    into = tmp_path / "x"
    with pytest.raises(B.BundleError, match="would unpack to more than 1048576 bytes"):
        B.extract_archive(tar, into)
    assert list(into.iterdir()) == []
    _key, pub = generate_keypair(tmp_path / "k")
    res = verify_bundle(tar, pub)
    assert not res.ok and "would unpack to more than" in res.error
