"""No input file crashes kvgate: every bad file, given to the command that reads it, ends in the documented
exit code with one line per problem naming the file (and the line where there is one), no traceback, and
memory that stays bounded (alias bombs, deep nesting and a 50 MB file do not grow the process).

The corpus is tests/fixtures/bad_inputs/ (yaml/ and json/ apply to every YAML and JSON input; kinds/ holds
the wrong types and unknown keys of each kind); random bytes, a 50 MB file, a directory, a FIFO with no
writer, a symlink loop and an unreadable file are made here. "Unreadable" is honest even though tests run
as root: the command runs as nobody (root reads any file), or as this user where the tests are not root.
A command that refuses a file writes nothing: the test's directory (the bad file, the bundle, the --out
targets) is as it was after the run, except the re-rendered report of a bundle whose signed raw file
re-evaluates differently (exit 1, the report says what differs).

Every case runs as a process of its own, forked from a server that imported kvgate once (tests/kvgate_fork.py):
its exit code, output, peak RSS (wait4, from a reset at the fork) and user (nobody, by setuid) are a process's,
and nothing one case does reaches another. What a fork skips, the interpreter's start and kvgate's imports,
the ``python_m`` tests cover with ``python -m harness`` for one case of each reader kind, among them the
process-level ones (the bombs' peak RSS against the same command's, nobody, a FIFO, a symlink loop); and
test_forked_runs_are_processes checks the fork against ``python -m`` where it could differ.
Timeouts are hang guards only; no assertion depends on time.
"""

from __future__ import annotations

import json
import os
import pwd
import random
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from functools import cache
from pathlib import Path
from typing import Callable

import pytest

from harness.report import bundle
from harness.safeio import MAX_DEPTH
from kvgate_fork import ForkServer, Ran

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "fixtures" / "bad_inputs"
CONFIGS = ROOT / "tests" / "fixtures" / "configs"
HANG_GUARD_S = 120
RSS_MARGIN_BYTES = 64 << 20  # over the same command on an empty file; the bomb once grew to 1.3 GB

# Problems every YAML input shares: case -> (line, fragment of the one-line message).
YAML_CASES: dict[str, tuple[int | None, str]] = {
    "alias_bomb": (7, "alias bomb"),
    "deep_nesting": (1, f"nested deeper than {MAX_DEPTH} levels"),
    "recursive_alias": (2, "recursive structure"),
    "empty": (1, "file is empty"),
    "comments_only": (1, "file is empty"),
    "list_root": (1, "expected a mapping of keys at the top level, got a list"),
    "duplicate_keys": (2, "duplicate key"),
    "tabs": (2, "a tab character where YAML does not allow one"),
    "non_utf8": (2, "not UTF-8 text: byte 0xe9"),
    "control_char": (2, "character #x0000 is not allowed"),
    "syntax_error": (2, "YAML syntax error"),
    "python_tag": (2, "is not supported here"),
    "two_documents": (2, "found another document (expected a single document in the stream)"),
    "complex_key": (1, "a key must be a plain value"),
    "bad_timestamp": (2, "month must be in 1..12"),
}
# Problems every bundle JSON file shares.
JSON_CASES: dict[str, tuple[int | None, str]] = {
    "deep_nesting": (1, f"nested deeper than {MAX_DEPTH} levels"),
    "empty": (1, "invalid JSON: Expecting value"),
    "array_root": (1, "expected a JSON object, got an array"),
    "duplicate_keys": (4, "duplicate key 'c'"),
    "syntax_error": (4, "invalid JSON"),
    "tab_in_string": (2, "Invalid control character"),
    "non_utf8": (2, "not UTF-8 text: byte 0xe9"),
    "huge_integer": (1, "invalid JSON: Exceeds the limit"),
}
# Wrong types and unknown keys, per kind (kinds/<kind>_<case>.*).
KIND_CASES: dict[str, dict[str, tuple[int | None, str]]] = {
    "inventory": {"wrong_types": (4, "read_streams: Input should be a valid integer"),
                  "unknown_key": (5, "nodes[0].colour: unknown key")},
    "gates": {"wrong_types": (10, "params.iodepth: Input should be a valid integer"),
              "unknown_key": (12, "gates[0].stop_los: unknown key")},
    "engine": {"wrong_types": (4, "argv: Input should be a valid list"),
               "unknown_key": (8, "ready_timout_s: unknown key")},
    "lmcache": {"wrong_types": (2, "chunk_size: expected int, got str"),
                "unknown_key": (4, "max_local_cpu_sise: unknown LMCache 0.5.6 key")},
    "cost": {"wrong_types": (5, "workload.context_tokens: Input should be a valid number"),
             "unknown_key": (6, "workload.contex_tokens: unknown key")},
    "keyring": {"wrong_types": (4, "keys[0].valid_from: invalid time [2026, 1, 1]"),
                "unknown_key": (4, "keys[0].revokd: unknown key")},
    "envelope": {"wrong_types": (3, "envelope: payload must be a JSON string, got a number"),
                 "unknown_key": (5, "envelope: unknown key 'note'")},
    "verdicts": {"wrong_types": (4, "verdicts: expected an array, got an object"),
                 "unknown_key": (7, "verdicts[0]: unknown key 'actul'")},
    "result": {"wrong_types": (6, "metrics.per_gpu_read_gb_s: expected a number, got a string"),
               "unknown_key": (3, "result: unknown key 'evidnce'")},
}
# Files that are not a usable regular file; made by make_special().
SPECIAL_CASES: dict[str, tuple[int | None, str]] = {
    "random_bytes": (None, "not UTF-8 text"),  # the line is that of the first bad byte, computed
    "big": (None, "is larger than the"),
    "directory": (None, "is a directory"),
    "fifo": (None, "is a FIFO"),
    "symlink_loop": (None, "too many levels of symbolic links"),
    "unreadable": (None, "permission denied"),
}
# A file of a signed bundle that is swapped after signing is refused by verification, naming it.
AFTER_SIGNING: dict[str, tuple[int | None, str]] = {
    "directory": (None, "not a regular file"),
    "fifo": (None, "not a regular file"),
    "symlink_loop": (None, "a symbolic link, not a regular file"),  # the one tree walk of a bundle names it
    "unreadable": (None, "cannot read: Permission denied"),
}
MEMORY_CASES = {"alias_bomb", "deep_nesting", "big", "recursive_alias"}
YAML_KINDS = ("inventory", "gates", "engine", "lmcache", "cost", "keyring")
JSON_KINDS = ("envelope", "verdicts", "result")
# where each bundle JSON kind lives in a bundle; messages name it so (the bundle may be a temporary copy)
IN_BUNDLE = {"envelope": "attestation.dsse.json", "verdicts": "verdicts.json", "result": "gates/G1/result.json"}


# Modules the fork server imports before it forks: those the cases run (importing them is most of what a short
# `python -m` run spends).
PRELOAD = ("harness.cli.main", "harness.engines.cpu_reference")
# One case of each reader kind that also runs as `python -m` (the tests named *_python_m), the process-level
# cases among them: peak RSS of a bomb, deep nesting and the 50 MB file; nobody; a FIFO; a symlink loop.
PYTHON_M_YAML = [("inventory", "yaml", "alias_bomb"), ("gates", "special", "symlink_loop"),
                 ("engine", "yaml", "deep_nesting"), ("lmcache", "special", "unreadable"),
                 ("cost", "special", "fifo"), ("keyring", "kinds", "unknown_key")]
PYTHON_M_JSON = [("envelope", "special", "big", "verify"), ("result", "json", "syntax_error", "report"),
                 ("verdicts", "kinds", "wrong_types", "cost")]


def nobody() -> tuple[int, int] | None:
    try:
        pw = pwd.getpwnam("nobody")
    except KeyError:
        return None
    return pw.pw_uid, pw.pw_gid


def run(argv: list[str], *, as_nobody: bool = False, env_extra: dict[str, str] | None = None) -> Ran:
    """Run a command; return its exit code, output and peak RSS (from wait4, this child only)."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", **(env_extra or {}))
    kw: dict = {}
    if as_nobody:
        uid, gid = nobody()  # type: ignore[misc]
        if shutil.which("setpriv"):  # util-linux; Popen(user=) cannot exec the venv's python on some hosts
            argv = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *argv]
        else:
            kw = {"user": uid, "group": gid, "extra_groups": []}
    with tempfile.TemporaryFile() as out:
        p = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                             env=env, **kw)
        guard = threading.Timer(HANG_GUARD_S, p.kill)
        guard.start()
        try:
            _, status, usage = os.wait4(p.pid, 0)
        finally:
            guard.cancel()
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode(errors="replace")
    assert p.returncode != -9, f"hang guard killed {argv} after {HANG_GUARD_S} s:\n{text}"
    return Ran(p.returncode, text, "", usage.ru_maxrss * 1024)


def home_env(shared: Path) -> dict[str, str]:
    """Keys, caches and matplotlib's config in the module's shared home (nobody may write it)."""
    home = str(shared / "home")
    return {"KVGATE_HOME": home, "HOME": home, "MPLCONFIGDIR": home}


class Runner:
    """How a case's command runs: ``python -m`` (a new interpreter) or forked from the fork server. ``argv`` is
    ``[MODULE, ARGS...]``. Keeps the peak RSS of each command on a harmless input, measured the same way."""

    def __init__(self, name: str, run_argv: Callable[[list[str], bool], Ran]):
        self.name, self._run, self._baselines = name, run_argv, {}

    def __call__(self, argv: list[str], as_nobody: bool = False) -> Ran:
        return self._run(argv, as_nobody)

    def baseline_rss(self, key: str, argv: Callable[[], tuple[list[str], int | None]]) -> int:
        """Peak RSS of ``argv()`` (run once per key), which must exit as it says (None: any code)."""
        if key not in self._baselines:
            cmd, rc = argv()
            r = self(cmd)
            assert rc is None or r.rc == rc, f"baseline {cmd}: exit {r.rc}:\n{r.out}"
            self._baselines[key] = r.maxrss_bytes
        return self._baselines[key]


# ------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def shared():
    """A directory nobody can traverse (pytest's tmp_path is 0700), for files a nobody run reads."""
    d = Path(tempfile.mkdtemp(prefix="kvgate-bad-inputs-"))
    d.chmod(0o755)
    (d / "home").mkdir(mode=0o777)
    (d / "home").chmod(0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture()
def work(shared):
    """This test's own directory under ``shared`` (traversable by nobody), removed after the test."""
    d = Path(tempfile.mkdtemp(dir=shared))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def fork_server(shared):
    """The fork server (tests/kvgate_fork.py), in the environment ``python_m`` gives its commands."""
    with ForkServer(PRELOAD, env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1", **home_env(shared))) as server:
        yield server


@pytest.fixture(scope="module")
def forked(fork_server):
    """Each command a child of the fork server."""
    def run_forked(argv: list[str], as_nobody: bool) -> Ran:
        r = fork_server.run(argv[0], *argv[1:], user=nobody() if as_nobody else None, timeout_s=HANG_GUARD_S)
        assert r.rc != -9, f"hang guard killed {argv} after {HANG_GUARD_S} s:\n{r.out}"
        return r

    return Runner("forked", run_forked)


@pytest.fixture(scope="module")
def python_m(shared):
    """Each command ``python -m MODULE ARGS`` from the checkout's root, as a user runs it."""
    return Runner("python -m", lambda argv, as_nobody: run([sys.executable, "-m", *argv], as_nobody=as_nobody,
                                                           env_extra=home_env(shared)))


def make_special(case: str, p: Path) -> Path:
    """A bad file of ``case`` at ``p``: random bytes, 50 MB, a directory, a FIFO, a symlink loop, unreadable."""
    if case == "random_bytes":
        p.write_bytes(random.Random(10).randbytes(4096))
    elif case == "big":
        with open(p, "wb") as f:
            f.write(b"# 50 MB\n")
            f.truncate(50_000_000)
    elif case == "directory":
        p.mkdir()
    elif case == "fifo":
        os.mkfifo(p)  # nothing ever opens it for writing: a blocking open would hang
    elif case == "symlink_loop":
        os.symlink(p.name, p)
    elif case == "unreadable":
        p.write_text("nodes: []\n")
        p.chmod(0)
    return p


@cache
def _cannot_run_as_nobody() -> str | None:
    """Why this root cannot run the command as nobody, or None when it can."""
    if nobody() is None:
        return "running as root and there is no user 'nobody' to drop to"
    try:
        probe = run([sys.executable, "-c", "pass"], as_nobody=True)
    except OSError as exc:
        return f"running as root and cannot start {sys.executable} as nobody: {exc}"
    if probe.rc != 0:
        return f"running as root and nobody cannot run {sys.executable}: {probe.out.strip()}"
    return None


def needs_nobody(case: str) -> bool:
    """Whether the command must run as nobody for the file to be unreadable (root reads anything)."""
    if case != "unreadable" or os.geteuid() != 0:
        return False
    if (why := _cannot_run_as_nobody()) is not None:
        pytest.skip(why)
    return True


def expected_line(case: str, path: Path, line: int | None) -> int | None:
    if case == "random_bytes":
        data = path.read_bytes()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            return data.count(b"\n", 0, exc.start) + 1
    return line


def assert_one_line_error(r: Ran, rc: int, display: str, line: int | None, fragment: str) -> None:
    assert "Traceback" not in r.out, r.out
    assert r.rc == rc, f"exit {r.rc}, expected {rc}:\n{r.out}"
    where = f"{display}:{line}: " if line else f"{display}: "
    hits = [ln for ln in r.out.splitlines() if where in ln and fragment in ln]
    assert hits, f"expected a line with {where!r} and {fragment!r}; got:\n{r.out}"


def tree(d: Path) -> dict[str, tuple[int, int, int]]:
    """Every entry under ``d`` (symbolic links not followed): its type, size and mtime, by relative path."""
    entries = {}
    for top, dirs, files in os.walk(d):
        for name in dirs + files:
            st = os.lstat(os.path.join(top, name))
            entries[os.path.relpath(os.path.join(top, name), d)] = (stat.S_IFMT(st.st_mode), st.st_size,
                                                                    st.st_mtime_ns)
    return entries


def assert_wrote_nothing(before: dict, after: dict, out: str) -> None:
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"the command that refused its input changed {changed}:\n{out}"


# ------------------------------------------------------------------------------------------ YAML inputs


def yaml_command(kind: str, path: Path, work: Path) -> tuple[list[str], int]:
    """The command (``[MODULE, ARGS...]``) that reads a YAML file of ``kind``, and its exit code for a bad file."""
    if kind == "inventory":
        return ["harness", "validate", "-i", str(path), "-g", str(CONFIGS / "good_gates.yaml")], 2
    if kind == "gates":
        return ["harness", "validate", "-i", str(CONFIGS / "good_inventory.yaml"), "-g", str(path)], 2
    if kind == "engine":  # a gate suite names the profile by path
        suite = work / f"suite-{path.name}.yaml"
        suite.write_text((ROOT / "gates" / "g2-cpu-reference.yaml").read_text()
                         .replace("engine: cpu-reference", f"engine: {path}"))
        suite.chmod(0o644)
        return ["harness", "validate", "-i", str(ROOT / "inventory" / "localhost.yaml"), "-g", str(suite)], 2
    if kind == "lmcache":  # the LMCache YAML the reference engine is given (checked before LMCache reads it)
        return ["harness.engines.cpu_reference", "--port", "1", "--lmcache-config", str(path)], 2
    if kind == "cost":
        return ["harness", "cost", "--params", str(path), "--out", str(work / "cost-out")], 2
    if kind == "keyring":  # verify reads the keyring before the bundle (which need not exist here)
        return ["harness", "verify", str(work / "no-such-bundle"), "--keyring", str(path)], 2
    raise AssertionError(kind)


YAML_PARAMS = ([(k, "yaml", c) for k in YAML_KINDS for c in YAML_CASES]
               + [(k, "special", c) for k in YAML_KINDS for c in SPECIAL_CASES]
               + [(k, "kinds", c) for k in YAML_KINDS for c in KIND_CASES[k]])


def check_bad_yaml(run: Runner, kind: str, group: str, case: str, work: Path) -> None:
    if group == "yaml":
        path, (line, fragment) = CORPUS / "yaml" / f"{case}.yaml", YAML_CASES[case]
    elif group == "kinds":
        path, (line, fragment) = CORPUS / "kinds" / f"{kind}_{case}.yaml", KIND_CASES[kind][case]
    else:
        path, (line, fragment) = make_special(case, work / f"{case}.yaml"), SPECIAL_CASES[case]
    as_nobody = needs_nobody(case)
    argv, rc = yaml_command(kind, path, work)
    before = tree(work)
    r = run(argv, as_nobody)
    assert_one_line_error(r, rc, str(path), expected_line(case, path, line), fragment)
    assert_wrote_nothing(before, tree(work), r.out)
    if case in MEMORY_CASES:  # against the same command on an empty file
        base = run.baseline_rss(kind, lambda: (yaml_command(kind, CORPUS / "yaml" / "empty.yaml", work)[0], None))
        assert r.maxrss_bytes <= base + RSS_MARGIN_BYTES, (r.maxrss_bytes, base)


@pytest.mark.parametrize("kind,group,case", YAML_PARAMS, ids=[f"{k}-{c}" for k, _, c in YAML_PARAMS])
def test_bad_yaml_input(kind, group, case, forked, work):
    check_bad_yaml(forked, kind, group, case, work)


@pytest.mark.parametrize("kind,group,case", PYTHON_M_YAML, ids=[f"{k}-{c}" for k, _, c in PYTHON_M_YAML])
def test_bad_yaml_input_python_m(kind, group, case, python_m, work):
    check_bad_yaml(python_m, kind, group, case, work)


# ------------------------------------------------------------------------------------------ bundle JSON


@pytest.fixture(scope="module")
def signer(shared):
    key, pub = bundle.generate_keypair(shared / "signer")
    pub.chmod(0o644)
    return bundle.load_private_key(key), pub


GOOD_SUITE = {"suite": {"name": "bad-inputs", "version": "1"}, "gates": [{
    "id": "G1", "title": "Per-GPU cold read", "workload": "fio-read", "nodes": ["node2"],
    "params": {"target": "scratch", "bs": "1 MiB"}, "metric": "per_gpu_read_gb_s",
    "pass": ">= 0.01 GB/s", "stop_loss": "< 0.001 GB/s"}]}


def good_run(d: Path) -> tuple[Path, dict]:
    """The files of a small G1 run as the runner leaves them: the bundle's suite (which loads with this
    kvgate), captured fio JSON, result.json and verdicts.json; and its predicate. The verdicts come from
    re-evaluating these files, so a re-evaluation of the good bundle agrees with them."""
    import yaml

    from harness.gates.reevaluate import reevaluate_bundle

    (d / "config").mkdir(parents=True)
    shutil.copy(CONFIGS / "good_inventory.yaml", d / "config" / "inventory.yaml")
    (d / "config" / "gates.yaml").write_text(yaml.safe_dump(GOOD_SUITE, sort_keys=False))
    (d / "gates" / "G1" / "node2").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "fixtures" / "fio" / "io_uring_2groups_2jobs_grouped.json",
                d / "gates" / "G1" / "node2" / "fio.json")
    (d / "gates" / "G1" / "result.json").write_text(json.dumps({
        "metrics": {}, "evidence": {"nodes": {"node2": {"page_cache_dropped": False}}}, "invalid_reason": None,
        "error": None, "started_unix_s": 1.0, "finished_unix_s": 2.0}, indent=1))
    re = reevaluate_bundle(d, {"verdicts": []})
    verdicts = [c.reevaluated for c in re.checks]
    assert [v["outcome"] for v in verdicts] == ["PASS"], verdicts
    run = {"started_utc": "2026-01-01T00:00:00Z", "finished_utc": "2026-01-01T00:00:01Z", "duration_s": 1.0}
    (d / "verdicts.json").write_text(json.dumps({"suite": GOOD_SUITE["suite"], "overall": "PASS",
                                                 "verdicts": verdicts, "run": {}}, indent=1))
    return d, {"suite": GOOD_SUITE["suite"], "overall": "PASS", "verdicts": verdicts, "run": run}


def make_bundle(work: Path, signer, replace: str | None = None, content: Path | None = None) -> Path:
    """A signed bundle of good_run() under ``work``; ``content`` (a regular file) is signed in place of
    ``replace``."""
    key, _ = signer
    work = Path(tempfile.mkdtemp(dir=work))
    run_dir, predicate = good_run(work / "run")
    if replace and content is not None:
        shutil.copyfile(content, run_dir / replace)
    info = bundle.write_bundle(run_dir, work / "out", key, predicate, make_tar=False)
    for p in [work, *work.rglob("*")]:  # mkdtemp makes 0700 directories; a nobody run must traverse them
        if p.is_dir():
            p.chmod(0o755)
    return info.path


def bundle_command(command: str, b: Path, pub: Path, work: Path) -> tuple[list[str], int]:
    """The command (``[MODULE, ARGS...]``) that reads bundle ``b``, and its exit code for a bad file."""
    if command == "verify":
        return ["harness", "verify", str(b), "--pubkey", str(pub)], 1
    if command == "report":
        return ["harness", "report", str(b), "--pubkey", str(pub), "--out", str(work / "report-out")], 1
    if command == "cost":
        params = work / "params.yaml"
        if not params.exists():
            shutil.copytree(ROOT / "workloads" / "models", work / "models")
            params.write_text(_without_per_gpu_read((ROOT / "workloads" / "cost-params.example.yaml").read_text()))
        return ["harness", "cost", "--params", str(params), "--bundle", str(b), "--pubkey", str(pub),
                "--out", str(work / "cost-out")], 2
    raise AssertionError(command)


def _without_per_gpu_read(text: str) -> str:
    """The example params without tier.per_gpu_read (a G1 bundle measures it; setting both is an error)."""
    return "".join(ln for ln in text.splitlines(keepends=True)
                   if not ("per_gpu_read:" in ln and not ln.lstrip().startswith("#")))


# kind -> the commands that read it, and which of them a swapped (unsigned) file reaches
READERS = {"envelope": ("verify", "report", "cost"), "verdicts": ("cost",), "result": ("report",)}
# the envelope cases the report and cost commands repeat (they share verify's reader; all cases run on verify)
ENVELOPE_ALSO = {"random_bytes", "deep_nesting", "big", "fifo", "unknown_key", "duplicate_keys"}


def _json_params():
    out = []
    for kind in JSON_KINDS:
        cases = ([("json", c) for c in JSON_CASES] + [("special", c) for c in SPECIAL_CASES]
                 + [("kinds", c) for c in KIND_CASES[kind]])
        for group, case in cases:
            for command in READERS[kind]:
                if kind == "envelope" and command != "verify" and case not in ENVELOPE_ALSO:
                    continue
                out.append((kind, group, case, command))
    return out


JSON_PARAMS = _json_params()


def good_bundle_command(command: str, signer, shared: Path) -> tuple[list[str], int]:
    """``command`` on a fresh good bundle in a directory of its own: exit 0."""
    d = Path(tempfile.mkdtemp(dir=shared))
    d.chmod(0o755)
    return bundle_command(command, make_bundle(d, signer), signer[1], d)[0], 0


def test_good_bundle_passes_every_reader(forked, shared, signer):
    """The bundle the bad cases start from verifies, re-evaluates SAME and feeds cost: so each failure
    below comes from the one bad file."""
    for command in ("verify", "report", "cost"):
        argv, _ = good_bundle_command(command, signer, shared)
        r = forked(argv)
        assert r.rc == 0, f"{command}:\n{r.out}"
        if command == "report":
            assert "verdicts: SAME as signed" in r.out, r.out


def check_bad_bundle_json(run: Runner, kind: str, group: str, case: str, command: str, shared: Path, signer,
                          work: Path) -> None:
    _, pub = signer
    rel = IN_BUNDLE[kind]
    if group == "json":
        src, (line, fragment) = CORPUS / "json" / f"{case}.json", JSON_CASES[case]
    elif group == "kinds":
        src, (line, fragment) = CORPUS / "kinds" / f"{kind}_{case}.json", KIND_CASES[kind][case]
    else:
        src, (line, fragment) = None, SPECIAL_CASES[case]
    if kind == "envelope" or case in AFTER_SIGNING:
        b = make_bundle(work, signer)  # the file is swapped after signing
        target = b / rel
        target.unlink()
        if case in AFTER_SIGNING:
            make_special(case, target)
            if kind == "envelope" and case == "symlink_loop":
                fragment = "is a symbolic link (not followed here)"  # a bundle file is never followed
            elif kind != "envelope":  # verification refuses it before its reader runs
                line, fragment = AFTER_SIGNING[case]
        else:
            src = src or make_special(case, work / f"{case}.json")
            shutil.copyfile(src, target)
    else:
        src = src or make_special(case, work / f"{case}.json")
        b = make_bundle(work, signer, rel, src)  # signed: verification passes, the file's reader refuses it
    as_nobody = needs_nobody(case)
    argv, rc = bundle_command(command, b, pub, work)
    before = tree(work)
    r = run(argv, as_nobody)
    rerendered = kind == "result" and case not in AFTER_SIGNING
    if rerendered:
        assert "DIFFERS" in r.out, r.out  # re-evaluation found the bad raw file: the report says so, exit 1
    assert_one_line_error(r, rc, rel, expected_line(case, src, line) if src else line, fragment)
    after = tree(work)
    if rerendered:  # the re-rendered report, which says what differs, is the one thing written
        assert (work / "report-out" / "reevaluation.json").is_file(), r.out
        after = {k: v for k, v in after.items() if k.split(os.sep)[0] != "report-out"}
    assert_wrote_nothing(before, after, r.out)
    if case in MEMORY_CASES:  # against the same command on a good bundle
        base = run.baseline_rss(command, lambda: good_bundle_command(command, signer, shared))
        assert r.maxrss_bytes <= base + RSS_MARGIN_BYTES, (r.maxrss_bytes, base)


@pytest.mark.parametrize("kind,group,case,command", JSON_PARAMS,
                         ids=[f"{k}-{c}-{cmd}" for k, _, c, cmd in JSON_PARAMS])
def test_bad_bundle_json(kind, group, case, command, forked, shared, signer, work):
    check_bad_bundle_json(forked, kind, group, case, command, shared, signer, work)


@pytest.mark.parametrize("kind,group,case,command", PYTHON_M_JSON,
                         ids=[f"{k}-{c}-{cmd}" for k, _, c, cmd in PYTHON_M_JSON])
def test_bad_bundle_json_python_m(kind, group, case, command, python_m, shared, signer, work):
    check_bad_bundle_json(python_m, kind, group, case, command, shared, signer, work)


# ------------------------------------------------------------------------------------------ the fork server


def test_forked_runs_are_processes(forked, python_m, fork_server, tmp_path):
    """What the forked cases rely on, each against ``python -m`` where it could differ: the same exit code and
    output for a command, and for an exception that escapes one (a traceback, exit 1, which fails a case);
    memory a command takes shows in its peak RSS; a command that hangs is killed; and what one run changes
    (the environment, the working directory, kvgate's modules) does not reach the next."""
    for argv in (["harness", "--version"], ["base64", str(tmp_path / "missing")]):  # base64 lets OSError escape
        f, p = forked(argv), python_m(argv)
        assert (f.rc, f.out.splitlines()[-1]) == (p.rc, p.out.splitlines()[-1]), (f, p)
        assert ("Traceback" in f.out) == ("Traceback" in p.out) == (argv[0] == "base64"), (f, p)
    small = forked(["timeit", "-n1", "-r1", "b'x' * 1"])
    big = forked(["timeit", "-n1", "-r1", "b'x' * (256 << 20)"])
    assert (small.rc, big.rc) == (0, 0), (small, big)
    assert big.maxrss_bytes >= small.maxrss_bytes + (200 << 20), (small.maxrss_bytes, big.maxrss_bytes)
    assert fork_server.run("timeit", "-n1", "-r1", "import time; time.sleep(600)", timeout_s=1).rc == -9
    change = ("import os, sys, harness.safeio; os.environ['KVGATE_LEAK'] = '1'; os.chdir('/');"
              " harness.safeio.MAX_DEPTH = 1; sys.modules['kvgate_leak'] = sys")
    show = ("import os, sys, harness.safeio; print(os.environ.get('KVGATE_LEAK'), os.getcwd(),"
            " harness.safeio.MAX_DEPTH, 'kvgate_leak' in sys.modules, file=sys.stderr)")
    assert forked(["timeit", "-n1", "-r1", "-s", change, "pass"]).rc == 0
    seen = forked(["timeit", "-n1", "-r1", "-s", show, "pass"]).out
    assert f"None {ROOT} {MAX_DEPTH} False" in seen, seen
