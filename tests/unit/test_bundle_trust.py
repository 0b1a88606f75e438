"""What a report ID binds and what a bundle may hold, tried as an adversarial signer would (issue 21).

- A report ID names exactly one content: every byte of every file, the rendered reports included; nothing is
  left out because the signer listed it somewhere, and the ID carries the whole sha256 (no grinding).
- A bundle holds nothing but regular files the statement names: a symlinked directory, a FIFO or an empty
  directory is a refusal in verify, cosign, report and the library (one shared walk).
- Every path kvgate writes from bundle content (gate IDs, evidence keys) stays inside the output directory.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from evidence_fixture import acceptance_bundle, clock_at
from harness.errors import BundleError
from harness.report.bundle import (ENVELOPE, check_statement, generate_keypair, load_private_key, verify_bundle,
                                   write_bundle)
from harness.report.cosign import cosign_bundle, verify_signers
from harness.report.keyring import keyring_from_pubkeys
from harness.report.library import build_library
from harness.report.render import render_bundle_reports, write_reports
from harness.safeio import InputFileError
from report_fixture import fixed_run

NEW_ID = re.compile(r"^KVG-\d{8}-[0-9a-f]{64}$")


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("keys")
    return generate_keypair(tmp / "signer")


def _signed(tmp: Path, key_path: Path, name: str, render) -> Path:
    run = tmp / f"run-{name}"
    run.mkdir()
    (run / "raw.json").write_text('{"bytes": 1}\n')
    info = write_bundle(run, tmp / f"out-{name}", load_private_key(key_path), {"suite": {"name": "t"}},
                        make_tar=False, render=render, clock=clock_at("2026-03-01T00:00:00Z"))
    return info.path


# --------------------------------------------------------------------------- the ID binds every byte


def test_two_bundles_with_different_verdicts_never_share_an_id(tmp_path, keys):
    """The signer's render hook writes verdicts.json, so it is listed among the rendered files; on the old
    derivation both bundles (5.2 and 0.1 GB/s) verified with one ID."""
    ids = []
    for gb_s in (5.2, 0.1):
        def render(rid, d, gb_s=gb_s):
            (d / "verdicts.json").write_text(json.dumps({"G1": {"actual": gb_s, "unit": "GB/s"}}))
            (d / "report.md").write_text(f"# {rid}\n")
            return ["report.md", "verdicts.json"]

        path = _signed(tmp_path, keys[0], str(gb_s), render)
        res = verify_bundle(path, keys[1])
        assert res.ok, res.error
        ids.append(res.report_id)
    assert ids[0] != ids[1]


def test_a_rendered_file_changed_and_re_signed_changes_the_id(tmp_path, keys):
    """Every subject is bound: the same evidence with a different report.md is another ID."""
    a = _signed(tmp_path, keys[0], "a", lambda rid, d: [(d / "report.md").write_text(f"# {rid} PASS\n"), "report.md"][1:])
    b = _signed(tmp_path, keys[0], "b", lambda rid, d: [(d / "report.md").write_text(f"# {rid} FAIL\n"), "report.md"][1:])
    assert verify_bundle(a, keys[1]).ok and verify_bundle(b, keys[1]).ok
    assert a.name != b.name


def test_the_id_carries_the_whole_sha256(tmp_path, keys):
    """32 bits of digest can be ground in minutes to give a second content a victim's ID; the ID carries all 256."""
    path = _signed(tmp_path, keys[0], "full", lambda rid, d: [(d / "REPORT_ID").write_text(rid + "\n"), "REPORT_ID"][1:])
    assert NEW_ID.match(path.name), path.name
    assert (path / "REPORT_ID").read_text() == path.name + "\n"


def _resign(bundle: Path, key_path: Path, mutate) -> None:
    """Rewrite a bundle's statement with ``mutate(statement)`` and sign it again with the signer's key: what a
    signer can do with any bundle of their own."""
    from harness.report.dsse import PAYLOAD_TYPE, canonical, key_fingerprint, pae

    env = json.loads((bundle / ENVELOPE).read_text())
    st = json.loads(base64.b64decode(env["payload"]))
    mutate(st)
    for s in st["subject"]:
        s["digest"]["sha256"] = hashlib.sha256((bundle / s["name"]).read_bytes()).hexdigest()
    payload = canonical(st)
    key = load_private_key(key_path)
    env = {"payloadType": PAYLOAD_TYPE, "payload": base64.b64encode(payload).decode(),
           "signatures": [{"keyid": key_fingerprint(key.public_key()),
                           "sig": base64.b64encode(key.sign(pae(PAYLOAD_TYPE, payload))).decode()}]}
    (bundle / ENVELOPE).write_text(json.dumps(env))


def test_a_claimed_id_that_does_not_follow_from_the_files_is_refused(tmp_path, keys):
    """A signer who edits the evidence and keeps the old ID (re-signing the statement) is refused: the
    verifier recomputes the ID from the files."""
    path = _signed(tmp_path, keys[0], "claimed", lambda rid, d: [(d / "report.md").write_text(f"# {rid}\n"),
                                                                  "report.md"][1:])
    (path / "raw.json").write_text('{"bytes": 2}\n')
    _resign(path, keys[0], lambda st: st["predicate"].__setitem__("rendered_files", ["raw.json", "report.md"]))
    res = verify_bundle(path, keys[1])
    assert not res.ok and "does not match" in res.error and "\n" not in res.error


def test_an_old_32_bit_id_is_refused_in_one_line(tmp_path, keys):
    """A bundle of the old ID format (8 hex digits) is refused with one line saying why."""
    path = _signed(tmp_path, keys[0], "old", lambda rid, d: [])
    old = "KVG-20260301-0123abcd"
    _resign(path, keys[0], lambda st: st["predicate"].__setitem__("report_id", old))
    moved = path.parent / old
    path.rename(moved)
    res = verify_bundle(moved, keys[1])
    assert not res.ok and "\n" not in res.error
    assert "older report ID format" in res.error and old in res.error


def test_the_placeholder_in_a_file_is_refused(tmp_path, keys):
    """The ID placeholder must not occur in a bundle's files, or two contents (one printing the ID, one the
    placeholder) would share an ID."""
    run = tmp_path / "run-ph"
    run.mkdir()
    (run / "raw.txt").write_text("KVG-00000000-" + "0" * 64)
    with pytest.raises(BundleError, match="raw.txt: holds the report ID placeholder"):
        write_bundle(run, tmp_path / "out-ph", load_private_key(keys[0]), {}, make_tar=False)


@pytest.mark.parametrize("created", ["../../../../tmp/x", "2026-03-01", "2026-03-01T00:00:00+01:00"])
def test_created_utc_must_be_a_utc_second(created):
    """created_utc is printed into the report ID, which names directories: it must be YYYY-MM-DDTHH:MM:SSZ."""
    st = {"_type": "https://in-toto.io/Statement/v1", "predicateType": "https://kvgate.dev/acceptance-report/v1",
          "subject": [], "predicate": {"created_utc": created}}
    with pytest.raises(InputFileError, match="created_utc"):
        check_statement(st, "payload")


# --------------------------------------------------------------------------- only regular files


@pytest.fixture(scope="module")
def real(tmp_path_factory, keys):
    tmp = tmp_path_factory.mktemp("real")
    info = acceptance_bundle(tmp, tmp / "out", keys[0], "2026-03-01T10:00:00Z", make_tar=False)
    return info


def _copy(real, tmp_path) -> Path:
    return Path(shutil.copytree(real.path, tmp_path / "b" / real.path.name, symlinks=True))


def _hostile_trees():
    def dir_link(d: Path):
        elsewhere = d.parent.parent / "elsewhere"
        shutil.copytree(d / "nodes" / "n1", elsewhere)
        (elsewhere / "snapshot.json").write_text('{"kernel": "unsigned 9.9"}\n')
        (d / "nodes" / "n9").symlink_to(elsewhere, target_is_directory=True)

    def file_link(d: Path):
        (d / "gates" / "G1" / "extra.json").symlink_to(d / "verdicts.json")

    def fifo(d: Path):
        os.mkfifo(d / "gates" / "G1" / "pipe")

    def empty_dir(d: Path):
        (d / "nodes" / "n9").mkdir()

    def dangling(d: Path):
        (d / "nodes" / "n8").symlink_to(d / "no-such-dir")

    return {"dir symlink": dir_link, "file symlink": file_link, "fifo": fifo, "empty dir": empty_dir,
            "dangling link": dangling}


@pytest.mark.parametrize("kind", sorted(_hostile_trees()))
def test_a_non_regular_entry_is_refused_everywhere(kind, real, keys, tmp_path):
    d = _copy(real, tmp_path)
    _hostile_trees()[kind](d)
    res = verify_bundle(d, keys[1])
    assert not res.ok, f"{kind} passed verify"
    assert "\n" not in res.error and ("nodes/n" in res.error or "gates/G1/" in res.error), res.error
    trusted = keyring_from_pubkeys([keys[1]])
    assert not verify_signers(d, trusted=trusted).ok
    other_key, _ = generate_keypair(tmp_path / "cosigner")
    with pytest.raises(Exception) as exc:
        cosign_bundle(d, load_private_key(other_key), trusted=trusted)
    assert "\n" not in str(exc.value)
    site = tmp_path / "site"
    res = build_library([d.parent], site, trusted, built_utc="2026-07-01T00:00:00Z")
    assert [e["status"] for e in res.entries] == ["failed"]
    assert not (site / "bundles" / d.name).exists()


# --------------------------------------------------------------------------- writes stay inside the output


def _inside(root: Path, tmp_path: Path) -> list[Path]:
    root = root.resolve()
    return [p for p in tmp_path.rglob("*") if not p.resolve().is_relative_to(root)
            and p.name in ("escaped.csv", "escaped-streams.csv", "x-escaped.csv")]


@pytest.mark.parametrize("gate_id,key", [
    ("G1", "x/../../../../escaped"),
    ("../../../escaped", "streams"),
    ("G1", "/abs/escaped"),
    ("..", "streams"),
])
def test_rendered_paths_stay_inside_the_output(gate_id, key, tmp_path):
    run, pred = fixed_run(tmp_path)
    v = pred["verdicts"][0]
    v["gate_id"] = gate_id
    v["evidence"][key] = [{"node": "n1", "read_gb_s": 1.0}]
    out = tmp_path / "a" / "b" / "c" / "out"
    out.mkdir(parents=True)
    try:
        files = write_reports("KVG-20260101-" + "0" * 64, run, pred, out)
    except InputFileError as exc:  # a gate ID that is not a name: the predicate's shape check refuses it first
        assert "gate_id" in str(exc) and "is not a gate ID" in str(exc) and gate_id != "G1"
        files = []
    for rel in files:
        p = (out / rel).resolve()
        assert p.is_relative_to(out.resolve()) and p.is_file(), rel
    outside = [p for p in tmp_path.rglob("*.csv") if not p.resolve().is_relative_to(out.resolve())
               and not p.resolve().is_relative_to(run.resolve())]
    assert outside == []


def test_a_gate_id_does_not_read_outside_the_bundle(tmp_path):
    """A gate ID like ../../x would read result.json and request logs from outside the bundle, unsigned."""
    run, pred = fixed_run(tmp_path)
    secret = tmp_path / "outside"
    secret.mkdir()
    (secret / "requests-readback.jsonl").write_text('{"ttft_s": 123.456, "request_id": "UNSIGNED"}\n')
    pred["verdicts"][1]["gate_id"] = os.path.relpath(secret, run / "gates")
    with pytest.raises(InputFileError, match="is not a gate ID"):  # refused by the predicate's shape check
        write_reports("KVG-20260101-" + "0" * 64, run, pred, tmp_path / "out")
    out = tmp_path / "out"
    assert not any("UNSIGNED" in f.read_text(errors="replace") for f in out.rglob("*") if f.is_file())


def test_a_pre_existing_link_in_the_output_is_not_followed(tmp_path):
    """--out may already exist: a tables -> elsewhere link in it is refused rather than written through."""
    run, pred = fixed_run(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (out / "tables").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(BundleError, match="outside"):
        write_reports("KVG-20260101-" + "0" * 64, run, pred, out)
    assert list((tmp_path / "elsewhere").iterdir()) == []


@pytest.mark.parametrize("chunk", [1, 7, 76, 77, 78, 1 << 20])
def test_scan_file_replaces_the_id_across_chunk_boundaries(tmp_path, monkeypatch, chunk):
    """The streamed normalization equals bytes.replace on the whole file, wherever the chunks end."""
    import harness.report.bundle as B

    rid = "KVG-20260301-" + "ab" * 32
    data = (b"x" * 75 + rid.encode() + b"KVG-2026" + rid.encode() * 2 + b"y" * 13 + rid.encode()[:40]) * 3
    p = tmp_path / "f"
    p.write_bytes(data)
    monkeypatch.setattr(B, "_CHUNK", chunk)
    raw, norm = B.scan_file(p, rid)
    assert raw == hashlib.sha256(data).hexdigest()
    assert norm == hashlib.sha256(data.replace(rid.encode(), B.ID_PLACEHOLDER.encode())).hexdigest()
    p.write_bytes(b"z" * 70 + B.ID_PLACEHOLDER.encode() + b"z")
    with pytest.raises(B.PlaceholderFound):
        B.scan_file(p, rid)


def test_a_hostile_claimed_report_id_writes_nothing(tmp_path, keys):
    """A statement whose report_id is a path (``KVG-../../x``) is refused by verify, report and the library in
    one line; nothing is written outside their outputs."""
    from harness.cli.main import main

    path = _signed(tmp_path, keys[0], "hostile-id", lambda rid, d: [])
    _resign(path, keys[0], lambda st: st["predicate"].__setitem__("report_id", "KVG-../../../../escaped"))
    res = verify_bundle(path, keys[1])
    assert not res.ok and "is not a report ID" in res.error and "\n" not in res.error
    cwd = os.getcwd()
    work = tmp_path / "w" / "x" / "y"
    work.mkdir(parents=True)
    os.chdir(work)
    try:
        assert main(["report", str(path), "--pubkey", str(keys[1])]) == 1
    finally:
        os.chdir(cwd)
    assert [p for p in tmp_path.rglob("*escaped*")] == []
    res = build_library([path.parent], tmp_path / "site", keyring_from_pubkeys([keys[1]]),
                        built_utc="2026-07-01T00:00:00Z")
    assert [e["status"] for e in res.entries] == ["failed"]
    assert sorted(p.name for p in (tmp_path / "site" / "bundles").iterdir()) == [f"{path.name}.tar.gz"]


def test_an_archive_whose_bundle_is_a_link_is_refused(tmp_path, keys):
    """The one directory of a bundle archive must be a directory, not a link to one (cosign would otherwise
    sign, and re-pack, whatever the link points at)."""
    import tarfile

    from harness.report.bundle import extract_archive

    name = "KVG-20260301-" + "1" * 64
    tar = tmp_path / f"{name}.tar.gz"
    with tarfile.open(tar, "w:gz") as tf:
        info = tarfile.TarInfo(name)
        info.type, info.linkname = tarfile.SYMTYPE, "."
        tf.addfile(info)
    with pytest.raises(BundleError, match="exactly one bundle directory"):
        extract_archive(tar, tmp_path / "into")
    with pytest.raises(BundleError, match="exactly one bundle directory"):
        cosign_bundle(tar, load_private_key(keys[0]))


def test_a_deep_tree_is_walked_without_recursion(tmp_path):
    """A hostile archive can nest thousands of directories: the one walk is iterative. The tree is removed
    here, bottom up: pytest's own clean-up (shutil.rmtree) would recurse past the limit on it."""
    from harness.report.bundle import tree_entries

    d = tmp_path / "deep"
    depth = 1100  # deeper than Python's recursion limit; os.makedirs would itself recurse
    paths = [str(d)]
    for _ in range(depth):
        paths.append(paths[-1] + "/a")
    try:
        for p in paths:
            os.mkdir(p)
        Path(paths[-1], "f").write_text("x")
        files, empty = tree_entries(d)
        assert files == ["a/" * depth + "f"] and empty == []
        Path(paths[-1], "f").unlink()
        assert tree_entries(d)[1] == ["/".join(["a"] * depth)]
    finally:
        Path(paths[-1], "f").unlink(missing_ok=True)
        for p in reversed(paths):
            if os.path.isdir(p):
                os.rmdir(p)
