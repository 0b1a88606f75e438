"""`kvgate collect` and `kvgate report` on G3 results volumes written by hand, no pod run (issue 35), as a user
runs them: a volume is bound to its render record (exit 2 without it, or edited after it); impossible pod
times are INVALID with a run that never ends before it starts; the report's first lines say what kvgate did not
measure; a signed bundle whose raw readers say 0.024 against a signed 0.984 is DIFFERS (exit 1)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import yaml

from harness.report.bundle import ENVELOPE, generate_keypair, load_private_key, verify_bundle, write_bundle
from harness.report.render import bundle_renderer
from kvgate_cli import kvgate

pytestmark = pytest.mark.e2e

READERS = ("n1", "n2", "n3")
CHUNKS, CHUNK_BYTES = 8, 16 * 65536
COPY = CHUNKS * (28 + CHUNK_BYTES)  # 8,388,832 bytes per reader
PORT_GBIT_S = 0.1  # 0.0125 GB/s: three readers of COPY in 2.046 s make 0.984 of it
PROVENANCE = "G3 evidence: self-reported by the pods; port rate declared; clocks assumed"


def suite(d: Path) -> tuple[Path, Path]:
    nodes = [{"name": n, "transport": "local", "work_dir": "/w", "nics": [{"name": "eth0", "line_rate_gbit_s": 10.0}],
              "targets": [{"name": "kvpool", "kind": "directory", "path": "/mnt/pool"}]} for n in READERS]
    nodes.append({"name": "storage", "transport": "local", "work_dir": "/w",
                  "nics": [{"name": "st0", "line_rate_gbit_s": PORT_GBIT_S}],
                  "targets": [{"name": "kvpool", "kind": "directory", "path": "/mnt/pool"}]})
    inv = {"nodes": nodes, "k8s": {"image": "python:3.11-slim", "results_claim": "kvgate-results"}}
    gates = {"suite": {"name": "g3-k8s", "version": "1"}, "gates": [{
        "id": "G3", "title": "three pods read one shared copy", "workload": "g3-shared-read",
        "params": {"port": "storage:st0", "readers": list(READERS), "kv_bytes_per_token": 65536, "chunk_tokens": 16,
                   "chunks": CHUNKS, "direct": "on", "drop_caches": False, "interval_s": 0.05, "arm_timeout_s": 30,
                   "read_timeout_s": 60, "min_window_s": 0,
                   # these volumes are written just after the render: their pods 'ran' up to 100 s before it
                   "clock_slack_s": 300},
        "metric": "nic_ceiling_ratio", "pass": ">= 0.90 x", "stop_loss": "< 0.80 x"}]}
    (d / "inv.yaml").write_text(yaml.safe_dump(inv, sort_keys=False))
    (d / "gates.yaml").write_text(yaml.safe_dump(gates, sort_keys=False))
    return d / "inv.yaml", d / "gates.yaml"


def reader_out(node: str, start: float, seconds: float, samples: int = 8) -> str:
    """What a G3 reader prints, written by hand: COPY bytes in ``samples`` even samples over ``seconds``."""
    recs = [{"type": "header", "schema": "kvgate-g3-reader/1", "node": node},
            {"type": "armed", "t_s": start - 0.5, "files": CHUNKS, "direct_used": True},
            {"type": "start", "t_s": start, "go_s": start, "start_priority": "fifo"}]
    step = seconds / samples
    recs += [{"type": "sample", "t0_s": start + i * step, "t1_s": start + (i + 1) * step, "bytes": COPY // samples}
             for i in range(samples)]
    recs.append({"type": "end", "t_s": start + seconds, "bytes": COPY, "completed": True, "files_done": CHUNKS})
    return "".join(json.dumps(r) + "\n" for r in recs)


def hand_written_volume(root: Path, start: float, seconds: float) -> tuple[Path, Path]:
    """A render (its manifests and record), and a results volume nobody's pods wrote: the config copied out of the
    ConfigMap, each reader's files and go.json by hand. Returns (results dir, render record)."""
    inv, gates = suite(root)
    r = kvgate("render", "k8s", inv, gates, "-o", root / "manifests", "--run-id", "r1")
    assert r.returncode == 0, r.stdout + r.stderr
    cm = next(yaml.safe_load_all((root / "manifests" / "G3.yaml").read_text()))
    results = root / "volume" / "r1"
    (results / "config").mkdir(parents=True)
    for name in ("inventory.yaml", "gates.yaml", "render.json"):
        (results / "config" / name).write_text(cm["data"][name])
    g = results / "G3"
    g.mkdir()
    for rank, n in enumerate(READERS):
        (g / f"{n}.out").write_text(reader_out(n, start, seconds))
        (g / f"{n}.err").write_text("")
        (g / f"{n}.rc").write_text("0\n")
        (g / f"{n}.task.json").write_text(json.dumps({"node": n, "rank": rank, "started_at_s": start - 3,
                                                      "child_pid": 100 + rank}))
    (g / "go.json").write_text(json.dumps({"go_s": start, "written_at_s": start - 2, "armed": list(READERS),
                                           "missing": []}))
    return results, root / "manifests" / "render.json"


@pytest.fixture(scope="module")
def key(tmp_path_factory):
    return generate_keypair(tmp_path_factory.mktemp("keys") / "op")


def test_collect_without_its_render_record_is_refused(tmp_path, key):
    results, _ = hand_written_volume(tmp_path, time.time() - 30, 2.046)
    r = kvgate("collect", results, "-o", tmp_path / "runs", "--key", key[0])
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no render record: give --render MANIFESTS/render.json" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.parametrize("edit, why", [
    # the suite loosened after the render: a pass bound, the port's declared rate
    (lambda res: (res / "config" / "gates.yaml").write_text(
        (res / "config" / "gates.yaml").read_text().replace(">= 0.90 x", ">= 0.85 x")), "config/gates.yaml differs"),
    (lambda res: (res / "config" / "inventory.yaml").write_text(
        (res / "config" / "inventory.yaml").read_text().replace("line_rate_gbit_s: 0.1", "line_rate_gbit_s: 0.05")),
     "config/inventory.yaml differs"),
    # another render's volume
    (lambda res: (res / "config" / "render.json").write_text(json.dumps({"run_id": "other", "gates": {"G3": {}}})),
     "the results are of run 'other'"),
])
def test_collect_of_a_volume_edited_after_its_render_is_refused(tmp_path, key, edit, why):
    results, record = hand_written_volume(tmp_path, time.time() - 30, 2.046)
    edit(results)
    r = kvgate("collect", results, "-o", tmp_path / "runs", "--key", key[0], "--render", record)
    assert r.returncode == 2, r.stdout + r.stderr
    assert why in r.stderr and len(r.stderr.strip().splitlines()) <= 2 and "Traceback" not in r.stderr


def test_a_hand_written_volume_from_2027_is_invalid_and_says_what_kvgate_did_not_measure(tmp_path, key):
    # issue 35's volume: a run from 2027-01-15, collected 2026-12: it was PASS with a -3609522 s run
    start = time.time() + 3_609_522
    results, record = hand_written_volume(tmp_path, start, 2.046)
    r = kvgate("collect", results, "-o", tmp_path / "runs", "--key", key[0], "--render", record)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "evidence: self-reported by the pods; port rate declared; clocks assumed" in r.stdout
    assert "G3     INVALID" in r.stdout and "a time in the future" in r.stdout
    rid = next(l.split(": ")[1] for l in r.stdout.splitlines() if l.startswith("report ID: "))
    bundle = tmp_path / "runs" / rid
    run = json.loads((bundle / "verdicts.json").read_text())["run"]
    assert run["duration_s"] >= 0 and run["provenance"] == "self-reported by the pods; port rate declared; clocks assumed"
    head = (bundle / "report.md").read_text().splitlines()[:8]
    assert f"> **{PROVENANCE}** (kvgate did not measure this itself)" in head, head
    assert PROVENANCE in (bundle / "report.html").read_text()
    rep = kvgate("report", bundle, "--pubkey", key[1], "--out", tmp_path / "rr")
    assert rep.returncode == 0, rep.stdout + rep.stderr
    lines = rep.stdout.splitlines()
    assert lines[1] == f"  {PROVENANCE} (kvgate did not measure this itself)", lines[:3]
    assert "G3: signed INVALID, re-evaluated INVALID (raw output re-parsed (g3-shared-read))" in rep.stdout


def _resign(bundle: Path, out: Path, key: Path, mutate) -> Path:
    """The bundle's evidence files, changed by ``mutate(run_dir)``, signed again with its own predicate: a
    signer that signs figures its raw files do not hold."""
    pred = verify_bundle(bundle, key.with_suffix(".pub")).statement["predicate"]
    rendered = pred["rendered_files"]
    pred = {k: v for k, v in pred.items() if k not in ("created_utc", "rendered_files", "report_id")}
    run = out / "run"
    shutil.copytree(bundle, run)
    for rel in [ENVELOPE, *rendered]:
        (run / rel).unlink()
    shutil.rmtree(run / "signatures", ignore_errors=True)
    for d in sorted((p for p in run.rglob("*") if p.is_dir()), reverse=True):
        if not any(d.iterdir()):
            d.rmdir()
    mutate(run)
    return write_bundle(run, out / "b", load_private_key(key), pred, make_tar=False,
                        render=bundle_renderer(pred)).path


def test_a_signed_bundle_whose_raw_readers_say_0_024_against_a_signed_0_984_differs(tmp_path, key):
    results, record = hand_written_volume(tmp_path, time.time() - 100, 2.046)
    r = kvgate("collect", results, "-o", tmp_path / "runs", "--key", key[0], "--render", record)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "G3     PASS     nic_ceiling_ratio = 0.984 ratio" in r.stdout  # plausible, so self-reported: said so
    rid = next(l.split(": ")[1] for l in r.stdout.splitlines() if l.startswith("report ID: "))
    honest = tmp_path / "runs" / rid
    rep = kvgate("report", honest, "--pubkey", key[1], "--out", tmp_path / "r0")
    assert rep.returncode == 0 and "verdicts: SAME as signed (overall PASS)" in rep.stdout, rep.stdout + rep.stderr

    def slow_readers(run: Path) -> None:  # the same bytes over 41 x the time: ratio 0.024
        for n in READERS:
            (run / "gates" / "G3" / "nodes" / n / "reader.jsonl").write_text(
                reader_out(n, time.time() - 100, 2.046 * 0.984 / 0.024))

    lying = _resign(honest, tmp_path / "lie", key[0], slow_readers)
    result = json.loads((lying / "gates" / "G3" / "result.json").read_text())
    assert result["metrics"]["nic_ceiling_ratio"] == pytest.approx(0.984, abs=1e-3)  # what was signed
    rep = kvgate("report", lying, "--pubkey", key[1], "--out", tmp_path / "r1")
    assert rep.returncode == 1, rep.stdout + rep.stderr
    assert "G3: signed PASS, re-evaluated STOP (raw output re-parsed (g3-shared-read))  DIFFERS" in rep.stdout
    assert "re-evaluated from raw data 0.024" in rep.stdout

    def empty_reader(run: Path) -> None:
        (run / "gates" / "G3" / "nodes" / "n2" / "reader.jsonl").write_text("")

    rep = kvgate("report", _resign(honest, tmp_path / "empty", key[0], empty_reader), "--pubkey", key[1],
                 "--out", tmp_path / "r2")
    assert rep.returncode == 1, rep.stdout + rep.stderr
    assert "G3: signed PASS, re-evaluated ERROR" in rep.stdout and "reader.jsonl is empty" in rep.stdout


def test_a_volume_whose_readers_read_faster_than_the_port_can_carry_is_invalid(tmp_path, key):
    # three readers of the copy in 0.08 s: 0.31 GB/s through a 0.1 Gbit/s (0.0125 GB/s) port, 25 x its ceiling
    results, record = hand_written_volume(tmp_path, time.time() - 100, 0.08)
    r = kvgate("collect", results, "-o", tmp_path / "runs", "--key", key[0], "--render", record)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "G3     INVALID  nic_ceiling_ratio = 25.17 ratio" in r.stdout
    assert "x the port's ceiling 0.1 Gbit/s (0.0125 GB/s), beyond the 0.02 allowed for counter timing: more than " \
           "the port can carry" in r.stdout
