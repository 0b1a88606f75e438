"""Property: whatever is done to a real bundle, ``verify``, ``report``, ``cosign`` and ``library build`` either
accept an unchanged content or refuse in one line (exit 1 or 2, never a traceback), and write nothing outside
the output directory they were given.

The bundles are real: the fixed report run (tests/fixtures/reports/, its G1 gate) signed by kvgate's own
writer with its reports rendered, as a run writes it. Two kinds of attacker:

- a tamperer changes a signed bundle afterwards (bytes, sizes, names, added and removed files, symlinks to
  files and directories, FIFOs, JSON shapes of the envelope and records): the content is not the signed one,
  so every command refuses it (``library build`` lists it as failed) and cosign changes nothing;
- a hostile signer signs what it likes with kvgate's writer (predicate fields of other types, deep nesting,
  huge numbers, nulls, Markdown/HTML in text; raw evidence files of any shape): it verifies, and every reader
  answers in one line whatever it holds.

The commands run in-process through ``harness.cli.main`` (tests/hostile_fixture.py). Hypothesis runs with a
fixed seed (``derandomize``), no example database, and a bounded number of examples per property; the
per-example ``deadline`` is a hang guard well above what an example takes, not a timing target.

Two mutation kinds have their own tests: a symlinked directory inside a bundle (the one tree walk refuses
it) and an evidence key that walks out of ``--out`` (every output path is confined).
"""

from __future__ import annotations

import base64
import copy
import json
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.report.bundle import ENVELOPE, generate_keypair
from hostile_fixture import Ran, kvgate_inproc, sign_run

SETTINGS = dict(derandomize=True, database=None, deadline=60_000, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])

HOSTILE_TEXT = ["PASS | x\n# G1: PASS", "<script>alert(1)</script>", "[x](javascript:alert(1))", "`", "\u202e",
                "../../../../escaped", "/etc/passwd", "", " ", "\x00", "NaN", "é" * 3]
HUGE = [10 ** 400, -(10 ** 400), 2 ** 63, 1e308, -0.0, float("inf"), float("-inf"), float("nan")]


def json_values(max_leaves: int = 6):
    scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.sampled_from(HUGE),
                        st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                        st.sampled_from(HOSTILE_TEXT))
    return st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                        max_leaves=max_leaves)


def nested(depth: int) -> object:
    v: object = 1
    for i in range(depth):
        v = [v] if i % 2 else {"k": v}
    return v


def raw_texts():
    """Whole-file contents: JSON of any shape, nesting far past the readers' limit, not JSON, not UTF-8."""
    return st.one_of(
        json_values().map(json.dumps),
        st.integers(50, 100_000).map(lambda n: "[" * n + "]" * n),
        st.integers(50, 100_000).map(lambda n: '{"a":' * n + "1" + "}" * n),
        st.binary(max_size=64).map(lambda b: b.decode("latin-1")),
        st.sampled_from(["", "{", '{"a": 1, "a": 2}', "\ufeff{}", "1e99999", "[" + "1," * 5000 + "1]"]),
    )


# --------------------------------------------------------------------------- fixtures


@dataclass
class Base:
    root: Path
    key: Path
    pub: Path
    cosigner: Path
    bundle: Path       # a signed bundle directory (the one all tampering starts from)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Base:
    root = tmp_path_factory.mktemp("mutations")
    key, pub = generate_keypair(root / "keys" / "signer")
    cosigner, _ = generate_keypair(root / "keys" / "cosigner")
    b = sign_run(root / "src", key, render=True)
    return Base(root, key, pub, cosigner, b.path)


def _entries(root: Path) -> dict[str, str]:
    """Everything under ``root`` (not following links): path -> kind and content digest / link target."""
    out: dict[str, str] = {}
    if not root.exists():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = p.relative_to(root).as_posix()
            m = p.lstat().st_mode
            if stat.S_ISLNK(m):
                out[rel] = "L " + os.readlink(p)
            elif stat.S_ISREG(m):
                out[rel] = "F " + str(hash(p.read_bytes()))
            elif stat.S_ISDIR(m):
                out[rel] = "D"
            else:
                out[rel] = f"S {stat.S_IFMT(m):o}"
    return out


class Sandbox:
    """One example's directory: the bundle under ``in/``, outputs deep under ``o/o/o/out`` (so that a path
    that walks out of ``--out`` lands where this test sees it)."""

    def __init__(self, base: Base):
        self.dir = Path(tempfile.mkdtemp(prefix="ex-", dir=base.root))
        self.bundles = self.dir / "in"
        self.bundles.mkdir()
        self.out = self.dir / "o" / "o" / "o" / "out"
        self.out.mkdir(parents=True)
        self.cwd_before = set(os.listdir("."))

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def outside(self, before: dict[str, str], allowed: list[Path]) -> list[str]:
        """Paths created or changed under the sandbox, outside ``out`` and ``allowed``."""
        now = _entries(self.dir)
        keep = [self.out] + allowed
        changed = [rel for rel in set(now) | set(before) if now.get(rel) != before.get(rel)]
        bad = [rel for rel in changed
               if not any((self.dir / rel) == k or k in (self.dir / rel).parents for k in keep)]
        bad += [f"./{n} (in the working directory)" for n in set(os.listdir(".")) - self.cwd_before]
        return sorted(bad)


def _one_line(r: Ran, allowed: set[int], what: str) -> None:
    assert r.raised is None, f"{what}: {type(r.raised).__name__}: {r.raised}"
    assert r.rc in allowed, f"{what}: exit {r.rc}\nstdout: {r.out[-800:]}\nstderr: {r.err[-800:]}"
    assert "Traceback" not in r.err + r.out, f"{what}: {r.err[-800:]}"
    if r.rc == 2:
        lines = r.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), f"{what}: stderr not one line: {r.err!r}"


def _library_status(sb: Sandbox, rid_dir: str) -> str | None:
    lib = json.loads((sb.out / "site" / "library.json").read_text())
    found = [e for e in lib["bundles"] if e["report_id"] == rid_dir]
    return found[0]["status"] if found else None


def run_readers(base: Base, sb: Sandbox, bundle: Path, *, content_unchanged: bool) -> None:
    """verify, report, library build, cosign on ``bundle``; the property for a bundle whose content is
    (``content_unchanged``) or is not the signed one."""
    before = _entries(sb.dir)
    v = kvgate_inproc("verify", bundle, "--pubkey", base.pub)
    _one_line(v, {0, 1, 2}, "verify")
    if not content_unchanged:
        assert v.rc != 0, f"verify accepted a changed bundle: {v.out}"
    rep = kvgate_inproc("report", bundle, "--pubkey", base.pub, "--out", sb.out / "report")
    _one_line(rep, {0, 1, 2}, "report")
    if v.rc != 0:
        assert rep.rc != 0, "report accepted what verify refused"
    lib = kvgate_inproc("library", "build", sb.bundles, "--pubkey", base.pub, "--out", sb.out / "site")
    _one_line(lib, {0, 1, 2}, "library build")
    if lib.rc == 0 and v.rc != 0:
        assert _library_status(sb, bundle.name) in ("failed", None), "the library published a refused bundle"
    assert not sb.outside(before, []), f"written outside --out: {sb.outside(before, [])}"
    twin = bundle.parent / (bundle.name + ".tar.gz")
    held = _entries(bundle)
    c = kvgate_inproc("cosign", bundle, "--key", base.cosigner, "--pubkey", base.pub)
    _one_line(c, {0, 1, 2}, "cosign")
    if v.rc != 0:
        assert c.rc != 0, "cosign signed a bundle that does not verify"
        assert _entries(bundle) == held, "a refused cosign changed the bundle"
    assert not sb.outside(before, [bundle, twin]), f"written outside --out: {sb.outside(before, [bundle, twin])}"


# --------------------------------------------------------------------------- the tamperer


def _json_equal_but_hints(a: bytes, b: bytes) -> bool:
    """Two envelopes or records that differ only in JSON whitespace or the unauthenticated keyid hints."""
    try:
        x, y = json.loads(a), json.loads(b)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False
    def strip(e):
        if isinstance(e, dict) and isinstance(e.get("signatures"), list):
            e = dict(e, signatures=[{k: v for k, v in s.items() if k != "keyid"} if isinstance(s, dict) else s
                                    for s in e["signatures"]])
        return e
    return strip(x) == strip(y)


@st.composite
def tampering(draw, files: list[str]):
    """(description, function(bundle_dir, outside_dir) -> content_unchanged)."""
    rel = draw(st.sampled_from(files))
    kind = draw(st.sampled_from(["flip", "truncate", "append", "delete", "rename", "add", "link-file",
                                 "link-outside", "dangling", "fifo", "dir-for-file", "json", "empty-dir"]))
    offset, xor = draw(st.integers(0, 1 << 20)), draw(st.integers(1, 255))
    extra = draw(st.binary(min_size=1, max_size=64))
    name = draw(st.sampled_from(["x.json", "gates/G1/x", "signatures/x.dsse.json", ".hidden", "nodes/n9/snapshot.json",
                                 "gates/G1/requests-readback.jsonl", "signatures/" + "0" * 64 + ".dsse.json",
                                 "a" * 200, "tables/G1-streams.csv.bak"]))
    value = draw(json_values())

    def apply(d: Path, outside: Path) -> bool:
        p = d / rel
        data = p.read_bytes()
        if kind == "flip":
            if not data:
                p.write_bytes(b"\x01")
                return False
            i = offset % len(data)
            new = data[:i] + bytes([data[i] ^ xor]) + data[i + 1:]
            p.write_bytes(new)
            return (rel == ENVELOPE or rel.startswith("signatures/")) and _json_equal_but_hints(data, new)
        if kind == "truncate":
            p.write_bytes(data[: offset % max(len(data), 1)])
            return False
        if kind == "append":
            p.write_bytes(data + extra)
            return False
        if kind == "delete":
            p.unlink()
            return rel.startswith("signatures/")  # a bundle without a record is one of an older kvgate: valid
        if kind == "rename":
            q = d / name
            if q.exists() or q.is_symlink():
                q = d / (name + ".2")
            q.parent.mkdir(parents=True, exist_ok=True)
            p.rename(q)
            return False
        if kind == "add":
            q = d / name
            q.parent.mkdir(parents=True, exist_ok=True)
            if q.exists() or q.is_symlink():
                q = d / (name + ".2")
            q.write_bytes(extra)
            return False
        if kind in ("link-file", "link-outside", "dangling"):
            target = {"link-file": d / files[(offset % len(files))], "link-outside": outside / "copy",
                      "dangling": outside / "nothing-here"}[kind]
            if kind == "link-outside":
                outside.mkdir(exist_ok=True)
                target.write_bytes(data)  # the very same bytes, behind a link
            p.unlink()
            p.symlink_to(target)
            return False
        if kind == "fifo":
            p.unlink()
            os.mkfifo(p)
            return False
        if kind == "dir-for-file":
            p.unlink()
            (p / "inner").mkdir(parents=True)
            (p / "inner" / "f").write_bytes(data)
            return False
        if kind == "json":  # the JSON at rel with one value replaced (when rel holds JSON)
            try:
                doc = json.loads(data)
            except (ValueError, UnicodeDecodeError):
                p.write_text(json.dumps(value))
                return False
            if isinstance(doc, dict) and doc:
                k = sorted(doc)[offset % len(doc)]
                doc[k] = value
            else:
                doc = value
            new = json.dumps(doc).encode()
            p.write_bytes(new)
            return (rel == ENVELOPE or rel.startswith("signatures/")) and _json_equal_but_hints(data, new) \
                or new == data
        if kind == "empty-dir":
            (d / "empty" / "dir").mkdir(parents=True)
            return True  # no file added: nothing a statement could name
        raise AssertionError(kind)

    return f"{kind} {rel} ({name})", apply


def _bundle_files(b: Path) -> list[str]:
    return sorted(p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file())


@pytest.mark.timeout(600)
def test_a_tampered_bundle_is_refused_in_one_line(base):
    files = _bundle_files(base.bundle)

    @settings(max_examples=12, **SETTINGS)
    @given(t=tampering(files))
    def prop(t):
        what, apply = t
        sb = Sandbox(base)
        try:
            d = Path(shutil.copytree(base.bundle, sb.bundles / base.bundle.name, symlinks=True))
            unchanged = apply(d, sb.dir / "elsewhere")
            run_readers(base, sb, d, content_unchanged=unchanged)
        finally:
            sb.close()

    prop()


@pytest.mark.timeout(600)
def test_a_tampered_archive_is_refused_in_one_line(base):
    """The .tar.gz twin: bytes flipped, cut or appended anywhere in the archive."""
    tar_src = base.root / "archive"
    if not tar_src.exists():
        from harness.report.bundle import tar_bundle
        tar_src.mkdir()
        tar_bundle(base.bundle, tar_src / f"{base.bundle.name}.tar.gz")
    data = (tar_src / f"{base.bundle.name}.tar.gz").read_bytes()

    @settings(max_examples=6, **SETTINGS)
    @given(kind=st.sampled_from(["flip", "truncate", "append"]), offset=st.integers(0, len(data) - 1),
           xor=st.integers(1, 255), extra=st.binary(min_size=1, max_size=4096))
    def prop(kind, offset, xor, extra):
        sb = Sandbox(base)
        try:
            tar = sb.bundles / f"{base.bundle.name}.tar.gz"
            new = {"flip": lambda: data[:offset] + bytes([data[offset] ^ xor]) + data[offset + 1:],
                   "truncate": lambda: data[:offset], "append": lambda: data + extra}[kind]()
            tar.write_bytes(new)
            # gzip ignores some header bytes (mtime, OS, flags' extras) and trailing data after the end
            # marker may be skipped: then the content is unchanged, which the property allows
            run_readers(base, sb, tar, content_unchanged=True)
        finally:
            sb.close()

    prop()


@pytest.mark.timeout(600)
def test_a_symlinked_directory_in_a_bundle_is_refused(base):
    @settings(max_examples=4, **SETTINGS)
    @given(which=st.sampled_from(["nodes/n2", "nodes/n9", "gates/G1/n2", "steps/x"]))
    def prop(which):
        sb = Sandbox(base)
        try:
            d = Path(shutil.copytree(base.bundle, sb.bundles / base.bundle.name, symlinks=True))
            elsewhere = sb.dir / "elsewhere"
            src = d / which
            if src.is_dir():
                shutil.copytree(src, elsewhere)
                shutil.rmtree(src)
            else:
                (elsewhere).mkdir()
                (elsewhere / "snapshot.json").write_text('{"kernel": "unsigned"}')
            src.symlink_to(elsewhere, target_is_directory=True)
            run_readers(base, sb, d, content_unchanged=False)
        finally:
            sb.close()

    prop()


# --------------------------------------------------------------------------- the hostile signer


def _paths(doc, prefix=()):
    """Every path into a JSON document (dict keys and list indexes), the document itself first."""
    yield prefix
    if isinstance(doc, dict):
        for k in sorted(doc):
            yield from _paths(doc[k], prefix + (k,))
    elif isinstance(doc, list):
        for i, x in enumerate(doc):
            yield from _paths(x, prefix + (i,))


def _set(doc, path, value):
    if not path:
        return value
    cur = doc
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = value
    return doc


@st.composite
def doc_edit(draw, doc):
    """A JSON document with one value (at any depth) replaced by a value of any shape, deleted, or nested."""
    paths = list(_paths(doc))[1:] or [()]
    # the fields readers name (top level, a verdict's own) are few among the evidence leaves: draw them as often
    shallow = [p for p in paths if len(p) <= 1 or (len(p) <= 3 and p[0] == "verdicts")]
    path = draw(st.sampled_from(shallow or paths) if draw(st.booleans()) else st.sampled_from(paths))
    how = draw(st.sampled_from(["value", "value", "delete", "deep", "huge"]))
    new = copy.deepcopy(doc)
    if how == "delete" and path:
        parent = new
        for k in path[:-1]:
            parent = parent[k]
        del parent[path[-1]]
        return f"delete {path}", new
    value = {"value": lambda: draw(json_values()), "deep": lambda: nested(draw(st.integers(10, 400))),
             "huge": lambda: draw(st.sampled_from(HUGE))}.get(how, lambda: draw(json_values()))()
    return f"{how} at {path}", _set(new, path, value)


@pytest.mark.timeout(600)
def test_a_signed_predicate_of_any_shape_is_answered_in_one_line(base, tmp_path_factory):
    from report_fixture import FIXED
    pred0 = json.loads((FIXED / "predicate.json").read_text())
    pred0["verdicts"] = [v for v in pred0["verdicts"] if v["gate_id"] == "G1"]

    @settings(max_examples=16, **SETTINGS)
    @given(edit=doc_edit(pred0))
    def prop(edit):
        what, pred = edit
        if not isinstance(pred, dict):
            return
        sb = Sandbox(base)
        try:
            try:
                b = sign_run(sb.dir / "src", base.key, pred_edit=lambda p: (p.clear(), p.update(pred)))
            except (ValueError, RecursionError, TypeError):
                return  # what json.dumps cannot write, kvgate's writer cannot sign either
            d = Path(shutil.move(str(b.path), str(sb.bundles / b.path.name)))
            shutil.rmtree(sb.dir / "src")
            run_readers(base, sb, d, content_unchanged=True)
        finally:
            sb.close()

    prop()


RAW_FILES = ["gates/G1/result.json", "gates/G1/n1/fio.json", "nodes/n1/snapshot.json", "nodes/n1/provenance.json",
             "verdicts.json", "gates/G1/requests-readback.jsonl", "gates/G1/requests-recompute.jsonl",
             "steps/003-n1-drop-caches/rc", "nodes/n1/nvmeof-managed.json", "config/gates.yaml"]


@pytest.mark.timeout(600)
def test_signed_raw_evidence_of_any_shape_is_answered_in_one_line(base):
    from report_fixture import FIXED
    docs = {rel: json.loads((FIXED / "fixed_run" / rel).read_text()) for rel in RAW_FILES
            if rel.endswith(".json") and (FIXED / "fixed_run" / rel).is_file()}

    @st.composite
    def raw_edit(draw):
        rel = draw(st.sampled_from(RAW_FILES))
        if rel in docs and draw(st.booleans()):
            what, doc = draw(doc_edit(docs[rel]))
            try:
                return rel, what, json.dumps(doc)
            except (ValueError, RecursionError):
                return rel, what, "[]"
        if rel.endswith(".jsonl"):
            lines = draw(st.lists(raw_texts(), min_size=1, max_size=3))
            return rel, "lines", "\n".join(x.replace("\n", " ") for x in lines) + "\n"
        return rel, "text", draw(raw_texts())

    @settings(max_examples=16, **SETTINGS)
    @given(e=raw_edit())
    def prop(e):
        rel, what, text = e
        sb = Sandbox(base)
        try:
            def edit(run: Path) -> None:
                (run / rel).parent.mkdir(parents=True, exist_ok=True)
                (run / rel).write_bytes(text.encode("utf-8", "surrogatepass"))
            b = sign_run(sb.dir / "src", base.key, run_edit=edit)
            d = Path(shutil.move(str(b.path), str(sb.bundles / b.path.name)))
            shutil.rmtree(sb.dir / "src")
            run_readers(base, sb, d, content_unchanged=True)
        finally:
            sb.close()

    prop()


@pytest.mark.timeout(600)
def test_a_signed_evidence_key_never_writes_outside_out(base):
    @settings(max_examples=4, **SETTINGS)
    @given(key=st.sampled_from(["x/../../../../escaped", "../../../../../escaped", "x/../../../escaped",
                                "/tmp/escaped-abs"]))
    def prop(key):
        sb = Sandbox(base)
        try:
            b = sign_run(sb.dir / "src", base.key,
                         pred_edit=lambda p: p["verdicts"][0]["evidence"].update({key: [{"a": 1}]}))
            d = Path(shutil.move(str(b.path), str(sb.bundles / b.path.name)))
            shutil.rmtree(sb.dir / "src")
            run_readers(base, sb, d, content_unchanged=True)
            assert not Path("/tmp/escaped-abs.csv").exists()
        finally:
            sb.close()

    prop()
