"""The hardened readers every input goes through: regular files only, size cap, UTF-8 with the bad byte's
line, strict JSON (duplicate keys, nesting) with the exact line, and the YAML composer's limits."""

import base64
import json
import os
from pathlib import Path

import pytest

from harness.cli import main as cli
from harness.report import bundle
from harness.errors import ConfigError
from harness.safeio import MAX_DEPTH, InputFileError, decode_utf8, parse_json, read_bytes, read_text
from harness.config import yamlload
from harness.config.yamlload import MAX_ALIAS_VALUES, load_yaml


def test_reads_a_regular_file_up_to_the_cap(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"x" * 100)
    assert read_bytes(p, max_bytes=100) == b"x" * 100
    with pytest.raises(InputFileError, match=r"is larger than the 99 bytes limit for a file \(100 bytes\)"):
        read_bytes(p, max_bytes=99)


def test_a_fifo_without_writer_is_refused_not_waited_on(tmp_path):
    os.mkfifo(tmp_path / "q")
    with pytest.raises(InputFileError, match="is a FIFO, not a regular configuration file"):
        read_text(tmp_path / "q", max_bytes=10, what="configuration file")


def test_directory_symlink_loop_and_missing_file_are_named(tmp_path):
    os.symlink("loop", tmp_path / "loop")
    (tmp_path / "link").symlink_to(tmp_path / "d")
    (tmp_path / "d").mkdir()
    for name, msg in (("d", "is a directory"), ("loop", "too many levels of symbolic links"),
                      ("gone", "no such file")):
        with pytest.raises(InputFileError, match=msg) as ei:
            read_bytes(tmp_path / name, max_bytes=10)
        assert str(ei.value) == f"{tmp_path / name}: {ei.value.message}"
    with pytest.raises(InputFileError, match=r"is a symbolic link \(not followed here\)"):
        read_bytes(tmp_path / "link", max_bytes=10, follow_symlinks=False)


def test_bad_utf8_names_line_and_column_of_the_first_bad_byte():
    with pytest.raises(InputFileError) as ei:
        decode_utf8(b"a: 1\nb: caf\xe9\n", "f.yaml")
    assert str(ei.value) == "f.yaml:2: not UTF-8 text: byte 0xe9 at column 7 (expected a UTF-8 text file)"


def test_duplicate_json_key_is_found_at_its_own_line_not_an_earlier_same_name():
    text = '{"a": {"k": 1},\n "b": {"k": 1,\n  "j": 2,\n  "k": 3}}'
    with pytest.raises(InputFileError) as ei:
        parse_json(text, "x.json")
    assert (ei.value.line, ei.value.message) == (4, "duplicate key 'k' (each key may appear once)")


def test_json_nesting_is_limited_with_a_line():
    ok = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert parse_json(ok, "x.json") is not None
    deep = "{\n" + '"a":\n' + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "}"
    with pytest.raises(InputFileError, match=f"nested deeper than {MAX_DEPTH} levels") as ei:
        parse_json(deep, "x.json")
    assert ei.value.line == 3
    # past the interpreter's own recursion limit: the same one-line error, not a RecursionError
    with pytest.raises(InputFileError, match="nested deeper"):
        parse_json("[" * 100_000 + "]" * 100_000, "x.json")


def test_strings_with_brackets_and_quotes_do_not_confuse_the_locator():
    text = '{"a": "{[\\"", "a": 1}'
    with pytest.raises(InputFileError, match="duplicate key 'a'"):
        parse_json(text, "x.json")


# ------------------------------------------------------------------------------------------------ YAML


@pytest.fixture(params=["libyaml", "pure-python"])
def yaml_events(request, monkeypatch):
    """Run a YAML test with events from libyaml (the default where PyYAML has it) and from pure Python."""
    if request.param == "libyaml":
        if yamlload._CParser is None:
            pytest.skip("PyYAML without libyaml")
        monkeypatch.setattr(yamlload, "_LOADER", yamlload._CLoader)
    else:
        monkeypatch.setattr(yamlload, "_LOADER", yamlload._PyLoader)
    return request.param


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_aliases_within_the_budget_expand_as_written(yaml_events, tmp_path):
    data, index = load_yaml(write(tmp_path, "base: &b {x: 1, y: [1, 2]}\none: *b\ntwo: *b\n"))
    assert data == {"base": {"x": 1, "y": [1, 2]}, "one": {"x": 1, "y": [1, 2]}, "two": {"x": 1, "y": [1, 2]}}
    assert index.line(("two", "x")) == 1  # an alias's values are written where the anchor is


def test_alias_expansion_past_the_budget_is_refused_at_the_first_line_past_it(yaml_events, tmp_path):
    # each level is 10x the one before; level k expands to about 10**(k+1) values
    lines = ["l0: &l0 [" + ", ".join(["x"] * 10) + "]"]
    lines += [f"l{k}: &l{k} [" + ", ".join([f"*l{k - 1}"] * 10) + "]" for k in range(1, 7)]
    with pytest.raises(ConfigError) as ei:
        load_yaml(write(tmp_path, "\n".join(lines) + "\n"))
    (issue,) = ei.value.issues
    # level k stands for 10**(k+1) scalars plus the lists holding them; the written values are under 200
    first_over = next(k for k in range(7) if (10 ** (k + 2) - 1) // 9 > MAX_ALIAS_VALUES + 200)
    assert issue.line == first_over + 1 and "alias bomb" in issue.message


@pytest.mark.parametrize("text,line,msg", [
    ("a: &a [1, *a]\n", 1, "recursive structure"),
    ("a: " + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1) + "\n", 1, f"nested deeper than {MAX_DEPTH} levels"),
    ("a: &a " + "[" * 40 + "]" * 40 + "\nb: " + "[" * 30 + "*a" + "]" * 30 + "\n", 2,
     f"aliases nest this deeper than {MAX_DEPTH} levels"),
    ("a: *nowhere\n", 1, "found undefined alias"),
    ("a: !!set {x, y}\n", 1, "not supported here"),
    ("<<: {a: 1}\n", 1, "merge keys are not supported"),
    ("a: 1\n\x07\n", 2, "character #x0007 is not allowed"),
    ("a: !!int " + "9" * 5000 + "\n", 1, "bad value"),
    ("a:\n\tb: 1\n", 2, "a tab character where YAML does not allow one"),
    ("a: " + "[" * 5000 + "]" * 5000 + "\n", 1, f"nested deeper than {MAX_DEPTH} levels"),
    ("a: [1, 2\nb: 1\n", 2, "YAML syntax error"),
    ("a: 1\n---\nb: 2\n", 2, "expected a single document"),
])
def test_yaml_limits_and_refusals_are_one_issue_at_a_line(yaml_events, tmp_path, text, line, msg):
    with pytest.raises(ConfigError) as ei:
        load_yaml(write(tmp_path, text))
    assert [(i.line, msg in i.message) for i in ei.value.issues] == [(line, True)], ei.value.issues
    assert "\n" not in str(ei.value.issues[0])


def test_depth_up_to_the_limit_is_accepted(yaml_events, tmp_path):
    n = MAX_DEPTH - 1  # the top-level mapping is one level
    data, _ = load_yaml(write(tmp_path, "a: " + "[" * n + "]" * n + "\n"))
    d, depth = data["a"], 1
    while d:
        d, depth = d[0], depth + 1
    assert depth == n


# ------------------------------------------------------------------------------------------------ bundles


def signed_envelope(d: Path, statement: object) -> Path:
    """A bundle directory whose envelope carries ``statement``, validly signed: the checks after the
    signature are what is under test."""
    key, pub = bundle.generate_keypair(d / "k")
    private = bundle.load_private_key(key)
    payload = json.dumps(statement, sort_keys=True, separators=(",", ":")).encode()  # canonical, as kvgate signs
    sig = private.sign(bundle.pae(bundle.PAYLOAD_TYPE, payload))
    b = d / "b"
    b.mkdir()
    (b / bundle.ENVELOPE).write_text(json.dumps({
        "payloadType": bundle.PAYLOAD_TYPE, "payload": base64.b64encode(payload).decode(),
        "signatures": [{"keyid": "k", "sig": base64.b64encode(sig).decode()}]}))
    return b, pub


GOOD_DIGEST = {"sha256": "0" * 64}


@pytest.mark.parametrize("statement,msg", [
    ([], "statement: expected a JSON object, got an array"),
    ({"_type": bundle.STATEMENT_TYPE, "predicateType": bundle.PREDICATE_TYPE, "subject": "x", "predicate": {}},
     "subject must be an array"),
    ({"_type": bundle.STATEMENT_TYPE, "predicateType": bundle.PREDICATE_TYPE,
      "subject": [{"name": "../../etc/passwd", "digest": GOOD_DIGEST}], "predicate": {"created_utc": "x"}},
     "is not a relative path inside the bundle"),
    ({"_type": bundle.STATEMENT_TYPE, "predicateType": bundle.PREDICATE_TYPE,
      "subject": [{"name": "a", "digest": {"sha256": 5}}], "predicate": {"created_utc": "x"}},
     "digest.sha256 is not 64 lowercase hex digits"),
    ({"_type": bundle.STATEMENT_TYPE, "predicateType": bundle.PREDICATE_TYPE, "subject": [], "predicate": "p"},
     "predicate must be an object"),
    ({"_type": bundle.STATEMENT_TYPE, "predicateType": bundle.PREDICATE_TYPE, "subject": [], "predicate": {},
      "extra": 1}, "statement: unknown key 'extra'"),
])
def test_a_signed_but_malformed_statement_fails_verification_by_name(tmp_path, statement, msg):
    b, pub = signed_envelope(tmp_path, statement)
    res = bundle.verify_bundle(b, pub)
    assert not res.ok and msg in res.error, res.error


def test_verify_prints_a_signed_predicate_of_odd_types_without_crashing(tmp_path, capsys):
    """A predicate this kvgate did not write (other types) still verifies; verify prints it as data."""
    from harness.report.bundle import derive_report_id

    pred = {"created_utc": "2026-01-01T00:00:00Z", "rendered_files": [], "signing_key": "k",
            "verdicts": ["x", {"gate_id": "G1", "actual": "fast"}], "input_report_ids": 3}
    pred["report_id"] = derive_report_id([], pred)
    b, pub = signed_envelope(tmp_path, {"_type": bundle.STATEMENT_TYPE, "predicateType": bundle.PREDICATE_TYPE,
                                        "subject": [], "predicate": pred})
    assert cli.main(["verify", str(b), "--pubkey", str(pub), "-v"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"OK {pred['report_id']}: ") and "G1: None None = 'fast'" in out
