"""Kubernetes: ``kvgate render k8s`` (a gate as an Indexed Job) and ``kvgate collect`` (its pods' files as a run).

Render: for every gate of the suite, a ConfigMap and an Indexed Job (harness/execute/k8s.py) that run the gate's
node-side program on each of its reader nodes with the start barrier of harness/node/k8s_task.py. Only G3
(``g3-shared-read``) has node-side programs behind a launcher seam; any other gate is refused, by name.

Collect: the results volume's files (``config/``, and per gate ``GATE/NODE.{task.json,out,err,rc}`` and
``GATE/go.json``) become a run directory as ``kvgate run`` writes one (config, every node's raw reader output,
``result.json`` and ``verdict.json`` per gate, ``verdicts.json``), evaluated by G3's own pure evaluator, then
signed into a bundle like any other run (``kvgate verify`` and ``gates/reevaluate.py`` read it as they read
any bundle). A collected run never passes unproven: a rank that left no output, or no record of the common
start, makes the gate ERROR whatever the failure policy allows, with every other rank's data kept.

Provenance: render also writes a render record beside the manifests (the operator's, not the cluster's: the
run id, the time, each gate's deadline, the SHA-256 of the suite and every spec the pods get); collect refuses a
results directory without it or whose suite, specs or run differ (ConfigError, exit 2). What the pods wrote is
self-reported: their times are held to render..collect and the Job's deadline, their bytes to the copy's size
(G3's evaluator, INVALID otherwise), and the run says so (``K8S_PROVENANCE``, the report's first lines).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import posixpath
import shutil
import time
from pathlib import Path
from typing import Any

import yaml

from .. import __version__
from ..config import Config, load_config
from ..config.yamlload import load_yaml
from ..errors import ConfigError, ConfigIssue, HarnessError
from ..execute.fanout import FailurePolicy
from ..execute.k8s import CONFIG_MOUNT, RESULTS_MOUNT, TASK_PROGRAM, K8sCluster, config_map, indexed_job, k8s_name
from ..gates.verdict import Outcome, Verdict, evaluate, overall_outcome, skipped
from ..node import program_path
from ..parsers.g3series import NodeSeries, cross_check_port_rate
from ..paths import git_commit
from ..redact import redact_obj, redact_text
from ..report.bundle import BundleInfo, key_fingerprint, write_bundle
from ..report.render import bundle_renderer
from ..workloads import WORKLOADS
from ..workloads.kit.base import CacheDrop, WorkloadResult, target_path, write_summary
from ..workloads.g3_shared_read import (MANIFEST, G3Bounds, G3Evidence, G3Launch, G3NodeRecord, G3Params,
                                        G3SharedRead, _pool_dir, _reader_spec, evaluate_g3, manifest_for,
                                        parse_stream)
from .runner import _write_json, new_run_dir

RENDERABLE = ("g3-shared-read",)
RENDER_FILE = "render.json"
RECORD_SCHEMA = "kvgate-render-record/1"
# What a collected run's evidence is, said in the report's first lines (harness.report.render.provenance_notes).
K8S_PROVENANCE = "self-reported by the pods; port rate declared; clocks assumed"


def sha256_text(text: str) -> str:
    """Pure: the hex SHA-256 of ``text`` as UTF-8 (how render and collect hash what the pods were given)."""
    return hashlib.sha256(text.encode()).hexdigest()


def suite_digests(inventory_text: str, gates_text: str, specs: dict[str, str]) -> dict[str, str]:
    """Pure: the hashes that bind a collected run to its render: the inventory and gates as the pods got them
    (``config/``), and every gate's spec.json (each reader node's command)."""
    return {"config/inventory.yaml": sha256_text(inventory_text), "config/gates.yaml": sha256_text(gates_text),
            **{f"{gid}/spec.json": sha256_text(text) for gid, text in sorted(specs.items())}}


@dataclasses.dataclass
class CollectOutcome:
    """What ``kvgate collect`` made: the verdicts, the overall outcome and the signed bundle."""

    verdicts: list[Verdict]
    overall: Outcome
    bundle: BundleInfo


# ------------------------------------------------------------------------------------------------ render

def _refusals(cfg: Config) -> list[ConfigIssue]:
    issues = []
    _, index = load_yaml(cfg.gates_path)
    for i, gate in enumerate(cfg.suite.gates):
        if gate.workload not in RENDERABLE:
            issues.append(index.issue(("gates", i, "workload"), f"gate {gate.id}: render k8s: workload "
                                      f"{gate.workload} has no Kubernetes launcher (only {', '.join(RENDERABLE)})"))
        elif getattr(cfg.params.get(gate.id), "writer", None) is not None:
            issues.append(index.issue(("gates", i, "params", "writer"), f"gate {gate.id}: render k8s: a G3 writer "
                                      "(isolation) runs with the ssh launcher only"))
    if cfg.inventory.k8s is None:
        issues.append(ConfigIssue(str(cfg.inventory_path), None, "k8s",
                                  "render k8s needs a `k8s:` block in the inventory (image, results_claim, ...; "
                                  "docs/launchers.md)"))
    return issues


def _g3_spec(cfg: Config, gate: Any, cluster: K8sCluster, results_dir: str) -> tuple[dict, list[str], str]:
    """One G3 gate's spec for k8s_task.py (node -> argv, the creating node's copy), its readers and the pool's
    mount path."""
    p: G3Params = cfg.params[gate.id]
    nodes = {n.name: n for n in cfg.gate_nodes(gate)}
    _, _, readers = G3SharedRead()._roles(p, nodes)
    mounts = {target_path(nodes[r], nodes[r].target(p.pool_target)) for r in readers}
    if len(mounts) != 1:
        raise ConfigError(ConfigIssue(str(cfg.gates_path), None, f"gate {gate.id}: params.pool_target",
                                      f"render k8s: the readers' {p.pool_target} targets differ in path "
                                      f"({', '.join(sorted(mounts))}); one pool volume needs one path"))
    gate_dir = posixpath.join(results_dir, gate.id)
    program = posixpath.join(CONFIG_MOUNT, "g3_reader.py")
    creator = p.create_on or readers[0]
    entries = {}
    for r in readers:
        node = nodes[r]
        base = posixpath.join(gate_dir, r)
        argv = list(_reader_spec(node, p, program, base + ".armed", base + ".go", base + ".series.jsonl").argv)
        argv[0] = cluster.python
        entry: dict[str, Any] = {"argv": argv, "creates_pool": r == creator}
        if r == creator:
            pool = _pool_dir(node, p)
            entry.update(pool_manifest=manifest_for(p), pool_manifest_path=posixpath.join(pool, MANIFEST),
                         create_argv=[cluster.python, program, "create", "--pool-dir", pool, "--manifest-json",
                                      json.dumps(manifest_for(p), separators=(",", ":")),
                                      "--block-bytes", str(p.block_bytes)])
        entries[r] = entry
    spec = {"gate": gate.id, "entries": entries, "arm_timeout_s": p.arm_timeout_s, "go_lead_s": cluster.go_lead_s,
            "drop_caches": p.drop_caches}
    return spec, readers, mounts.pop()


def render_k8s(cfg: Config, out_dir: str | Path, run_id: str | None = None) -> list[Path]:
    """Write ``GATE.yaml`` (a ConfigMap and an Indexed Job) for every gate of the suite into ``out_dir``, and the
    render record ``out_dir/render.json`` (the run id, the time, each gate's deadline and the SHA-256 of the
    suite and every spec the pods get: ``kvgate collect --render`` checks the results against it); raise
    ConfigError naming every gate that cannot be rendered (not G3) or a missing ``k8s:`` block, before writing
    anything. ``run_id`` names the run's directory in the results volume (default: a UTC time stamp). Returns
    the manifests' paths."""
    issues = _refusals(cfg)
    if issues:
        raise ConfigError(issues)
    cluster = K8sCluster.from_config(cfg.inventory.k8s)
    run_id = k8s_name(run_id or time.strftime("run-%Y%m%d-%H%M%S", time.gmtime()))
    results_dir = posixpath.join(RESULTS_MOUNT, run_id)
    rendered: dict[str, Any] = {}
    specs = {}
    for gate in cfg.suite.gates:
        p: G3Params = cfg.params[gate.id]
        spec, readers, pool_mount = _g3_spec(cfg, gate, cluster, results_dir)
        name = k8s_name("kvgate", run_id, gate.id)
        deadline_s = p.arm_timeout_s + p.read_timeout_s + cluster.time_margin_s
        specs[gate.id] = (spec, readers, pool_mount, name, deadline_s)
        rendered[gate.id] = {"job": name, "namespace": cluster.namespace, "nodes": readers,
                             "results_dir": posixpath.join(results_dir, gate.id), "deadline_s": deadline_s}
    now = time.time()
    render = {"kvgate": __version__, "run_id": run_id, "rendered_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                     time.gmtime(now)),
              "launcher": "k8s", "gates": rendered}
    inventory_text = redact_text(Path(cfg.inventory_path).read_text())
    gates_text = redact_text(Path(cfg.gates_path).read_text())
    spec_texts = {gid: json.dumps(spec, indent=1) for gid, (spec, *_rest) in specs.items()}
    common = {TASK_PROGRAM: Path(program_path(TASK_PROGRAM)).read_text(),
              "g3_reader.py": Path(program_path("g3_reader.py")).read_text(),
              # k8s_task.py imports its file writes, cache drop and process-group stop from it
              "slurm_task.py": Path(program_path("slurm_task.py")).read_text(),
              "inventory.yaml": inventory_text, "gates.yaml": gates_text,
              RENDER_FILE: json.dumps(render, indent=1)}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # The render record stays with the operator (beside the manifests, not in the cluster): collect compares
    # the results volume with it, so a suite edited after the render, or a volume of another render, is refused.
    record = {"schema": RECORD_SCHEMA, **render, "rendered_unix_s": now,
              "sha256": suite_digests(inventory_text, gates_text, spec_texts)}
    (out / RENDER_FILE).write_text(json.dumps(record, indent=1) + "\n")
    written = []
    for gate_id, (spec, readers, pool_mount, name, deadline_s) in specs.items():
        labels = {"app.kubernetes.io/name": "kvgate", "kvgate/run": run_id, "kvgate/gate": k8s_name(gate_id)}
        cm = config_map(name, cluster.namespace, {**common, "spec.json": spec_texts[gate_id]}, labels)
        job = indexed_job(cluster, name, name, readers, pool_mount, results_dir, deadline_s, labels)
        path = out / f"{gate_id}.yaml"
        path.write_text(yaml.safe_dump_all([cm, job], sort_keys=False, width=120))
        written.append(path)
    return written


# ------------------------------------------------------------------------------------------------ collect

def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def _json(path: Path) -> dict | None:
    text = _read(path)
    try:
        obj = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def check_render_record(record_path: str | Path | None, src: Path, cfg: Config) -> dict:
    """The render record ``kvgate render k8s`` wrote (``--render``), checked against the results directory: the
    same run, and byte for byte the suite and specs that were rendered (their SHA-256). Raises ConfigError
    (exit 2) when the record is missing, unreadable or not a render record, or anything differs; returns it."""
    def refuse(msg: str, where: str = str(record_path)) -> ConfigError:
        return ConfigError(ConfigIssue(where, None, "render", msg))

    if record_path is None:
        raise refuse("no render record: give --render MANIFESTS/render.json, which kvgate render k8s wrote beside "
                     "the manifests; it binds the collected run to the suite that was rendered", "collect")
    record = _json(Path(record_path))
    if record is None or record.get("schema") != RECORD_SCHEMA or not isinstance(record.get("sha256"), dict) \
            or not isinstance(record.get("gates"), dict):
        raise refuse(f"not a render record of kvgate render k8s ({RECORD_SCHEMA})")
    volume = _json(src / "config" / RENDER_FILE) or {}
    if volume.get("run_id") != record.get("run_id"):
        raise refuse(f"the results are of run {volume.get('run_id')!r}, the render record of {record.get('run_id')!r}")
    cluster = K8sCluster.from_config(cfg.inventory.k8s) if cfg.inventory.k8s is not None else None
    have: dict[str, str] = {}
    for name in ("config/inventory.yaml", "config/gates.yaml"):
        have[name] = sha256_text(_read(src / name) or "")
    for gate in cfg.suite.gates:
        if gate.id in record["gates"] and cluster is not None and gate.workload in RENDERABLE:
            spec = _g3_spec(cfg, gate, cluster, posixpath.join(RESULTS_MOUNT, record["run_id"]))[0]
            have[f"{gate.id}/spec.json"] = sha256_text(json.dumps(spec, indent=1))
    want = record["sha256"]
    for name in sorted(set(want) | set(have)):
        if want.get(name) != have.get(name):
            raise refuse(f"{name} differs from what kvgate render k8s wrote (sha256 {str(have.get(name))[:16]}, "
                         f"rendered {str(want.get(name))[:16]}): the suite was changed after the render, or these "
                         "results are not of this render")
    return record


def _copy_go(src: Path, raw_dir: Path) -> tuple[dict | None, float | None]:
    """(the go record, its common start time) from ``src/go.json``, copied raw into ``raw_dir``; (None, None)
    when there is none, or it holds no start time."""
    go = _json(src / "go.json")
    if go is not None:
        shutil.copyfile(src / "go.json", raw_dir / "go.json")
    go_s = go.get("go_s") if go is not None else None
    if isinstance(go_s, bool) or not isinstance(go_s, (int, float)):
        go, go_s = None, None  # a go.json without a start time records no common start
    return go, go_s


def _copy_rank_files(src: Path, raw_dir: Path, name: str) -> tuple[dict | None, str | None]:
    """(task record, output) of the reader pod ``name``: its files in ``src`` that exist, copied raw into
    ``raw_dir`` first; None for one that is missing or unreadable."""
    for ext in ("task.json", "out", "err", "rc"):
        if (src / f"{name}.{ext}").is_file():
            shutil.copyfile(src / f"{name}.{ext}", raw_dir / f"{name}.{ext}")
    return _json(src / f"{name}.task.json"), _read(src / f"{name}.out")


def _keep_rank_output(src: Path, gate_dir: Path, name: str, task: dict | None, out: str | None,
                      go_s: float | None) -> tuple[NodeSeries | None, dict[str, Any]]:
    """The reader pod ``name``'s output kept as a run keeps it (``nodes/NAME/reader.jsonl`` and ``.stderr``) and
    parsed: (its series, its node record's fields, with the error its exit status or its output shows)."""
    rc_text = (_read(src / f"{name}.rc") or "").strip()
    rc = int(rc_text) if rc_text.lstrip("-").isdigit() else None
    ndir = gate_dir / "nodes" / name
    ndir.mkdir(parents=True, exist_ok=True)
    (ndir / "reader.jsonl").write_text(out or "")
    (ndir / "reader.stderr").write_text(_read(src / f"{name}.err") or "")
    info: dict[str, Any] = {"node": name, "rc": rc, "pid": (task or {}).get("child_pid"), "go_node_s": go_s}
    if rc is None:
        info["error"] = "k8s: the task left no exit status"
    elif rc != 0:
        info["error"] = f"reader exited {rc}"
    return parse_stream(name, out or "", 0.0, info, f"nodes/{name}/reader.jsonl")


def _unproven(missing: list[str], readers: list[str], go: dict | None) -> list[str]:
    """What the collected files leave unproven (reader pods without output, no common start): each makes the
    gate's result an error."""
    unproven = []
    if missing:
        unproven.append(f"no output from {len(missing)} of {len(readers)} reader pod(s): {', '.join(missing)}")
    if go is None:
        unproven.append("no go.json with a start time: the common start is not recorded")
    return unproven


def collect_g3(cfg: Config, gate: Any, src: Path, gate_dir: Path, render: dict,
               collected_s: float | None = None) -> WorkloadResult:
    """G3 from its pods' files in ``src`` (``NODE.task.json/.out/.err/.rc``, ``go.json``): each rank's output
    kept under ``gate_dir`` as a run keeps it (``nodes/NODE/reader.jsonl``, the raw files under ``k8s/``),
    parsed and evaluated by G3's own pure evaluator (harness.workloads.g3_shared_read.evaluate_g3). A rank with
    no files, or no ``go.json``, is an error of the gate (ERROR) whatever the failure policy tolerates. ``render``
    is the checked render record: the pods' times are held to its render time, ``collected_s`` and the gate's
    deadline, their byte counts to the copy's size (INVALID otherwise)."""
    p: G3Params = cfg.params[gate.id]
    nodes = {n.name: n for n in cfg.gate_nodes(gate)}
    port_node, nic, readers = G3SharedRead()._roles(p, nodes)
    policy = FailurePolicy(p.max_failed_share, p.on_node_failure)
    ev = G3Evidence(readers=readers, port=p.port, copy_bytes=p.copy_bytes, chunks=p.chunks, chunk_bytes=p.chunk_bytes,
                    streams_per_node=p.streams, block_bytes=p.block_bytes, policy=vars(policy), launcher="k8s")
    declared = next(n.line_rate_gbit_s for n in nodes[port_node].nics if n.name == nic)
    # no session to the port's node: the declared rate, marked as such (K8S_PROVENANCE)
    port = cross_check_port_rate(declared, None, None, p.port_rate_tolerance)
    ev.port_rate = vars(port) | {"notes": list(port.notes)}
    ev.clock_alignment = "assume_synced"
    rendered_s = render.get("rendered_unix_s")
    deadline_s = ((render.get("gates") or {}).get(gate.id) or {}).get("deadline_s")
    if isinstance(rendered_s, (int, float)) and isinstance(deadline_s, (int, float)):
        ev.time_frame = {"not_before_s": float(rendered_s), "not_after_s": collected_s or time.time(),
                         "max_duration_s": float(deadline_s), "slack_s": p.clock_slack_s}
    raw_dir = gate_dir / "k8s"
    raw_dir.mkdir(parents=True, exist_ok=True)
    go, go_s = _copy_go(src, raw_dir)
    series: dict[str, NodeSeries] = {}
    records: dict[str, G3NodeRecord] = {}
    failed: dict[str, str] = {}
    missing: list[str] = []
    tasks: dict[str, dict] = {}
    for name in readers:
        task, out = _copy_rank_files(src, raw_dir, name)
        if task is None and out is None:
            missing.append(name)
            failed[name] = "k8s: no files from this node's pod (it never ran, or its output was lost)"
            records[name] = G3NodeRecord(node=name, error=failed[name])
            continue
        tasks[name] = task or {}
        ev.clock_offsets[name] = {"applied_s": 0.0, "how": "k8s: cluster clocks taken as synchronized"}
        if p.drop_caches and isinstance((task or {}).get("cache_drop"), dict):
            ev.page_cache_dropped[name] = CacheDrop.model_validate(task["cache_drop"])
        parsed, info = _keep_rank_output(src, gate_dir, name, task, out, go_s)
        if parsed is not None:
            series[name] = parsed
        if info["error"]:
            failed[name] = info["error"]
        records[name] = G3NodeRecord.model_validate(info)
    ev.nodes, ev.failed_nodes = records, failed
    ev.launch = G3Launch(go_ref_s=go_s, events=[{"event": "go", **go}] if go is not None else [])
    ev.k8s_job = {**(render.get("gates") or {}).get(gate.id, {}), "run_id": render.get("run_id"),
                  "go": go, "missing_ranks": missing, "tasks": tasks}
    result = evaluate_g3(ev, series, port, policy, p.min_window_s, 0.0, go_s, bounds=G3Bounds.of(p))
    unproven = _unproven(missing, readers, go)
    if unproven:
        result = dataclasses.replace(result, error="k8s: " + "; ".join(unproven))
    write_summary(gate_dir, "g3.json", result)
    return result


def _new_collect_dir(out_dir: Path, cfg_src: Path, render: dict) -> Path:
    """A new run directory under ``out_dir`` holding the suite (``cfg_src``'s inventory and gates) and the
    operator's checked render record, as a run's ``config/`` holds them."""
    run_dir = new_run_dir(out_dir)
    (run_dir / "config").mkdir()
    for name in ("inventory.yaml", "gates.yaml"):
        shutil.copyfile(cfg_src / name, run_dir / "config" / name)
    (run_dir / "config" / RENDER_FILE).write_text(json.dumps(render, indent=1) + "\n")  # the operator's record
    return run_dir


def _pods_started_s(result: WorkloadResult, lo_s: float, collected_s: float) -> float:
    """The gate's start: the earliest of its pods' own start times that is possible (not before ``lo_s``, the
    render's time less the clock slack, nor after this collect at ``collected_s``); ``collected_s`` when none is."""
    times = [t.get("started_at_s") for t in (result.evidence.k8s_job or {}).get("tasks", {}).values()]
    times = [t for t in times if isinstance(t, (int, float)) and not isinstance(t, bool) and lo_s <= t <= collected_s]
    return min(times) if times else collected_s


def _collected_run(started: float, finished: float, src: Path, render: dict) -> dict[str, Any]:
    """The ``run`` record of a collected run: its times, where it was collected from, and the render it is of."""
    return {"started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(finished)),
            "duration_s": round(finished - started, 3), "launcher": "k8s", "collected_from": str(src),
            "provenance": K8S_PROVENANCE, "render_sha256": render["sha256"]}


def collect_k8s(src_dir: str | Path, out_dir: str | Path, private_key: Any, render_record: str | Path | None,
                key_kind: str = "operator", make_tar: bool = True) -> CollectOutcome:
    """Turn a results volume's files (``src_dir``, as the pods of ``kvgate render k8s`` left them) into a run
    directory under ``out_dir`` and sign it into a bundle there. Raises ConfigError when ``src_dir`` holds no
    suite (``config/inventory.yaml``, ``config/gates.yaml``, ``config/render.json``), or when it is not bound to
    ``render_record`` (the render record ``kvgate render k8s`` wrote; :func:`check_render_record`)."""
    src = Path(src_dir)
    cfg_src = src / "config"
    collected_s = time.time()
    render = _json(cfg_src / RENDER_FILE)
    if render is None or not isinstance(render.get("gates"), dict):
        raise ConfigError(ConfigIssue(str(cfg_src / RENDER_FILE), None, "<root>",
                                      "not a render record of kvgate render k8s (its rank 0 pod copies it there)"))
    cfg = load_config(cfg_src / "inventory.yaml", cfg_src / "gates.yaml", WORKLOADS)
    render = check_render_record(render_record, src, cfg)
    run_dir = _new_collect_dir(Path(out_dir), cfg_src, render)
    started = finished = None
    verdicts: list[Verdict] = []
    stop_at = None
    for gate in cfg.suite.gates:
        wl = cfg.workload(gate)
        unit = wl.metric_unit(gate.metric)
        if stop_at:
            verdicts.append(skipped(gate, f"skipped: stop-loss hit at {stop_at}", unit))
            continue
        if gate.id not in render["gates"]:
            verdicts.append(skipped(gate, "skipped: not rendered for Kubernetes", unit))
            continue
        gate_dir = run_dir / "gates" / gate.id
        gate_dir.mkdir(parents=True, exist_ok=True)
        result = collect_g3(cfg, gate, src / gate.id, gate_dir, render, collected_s)
        lo = float(render.get("rendered_unix_s") or 0.0) - cfg.params[gate.id].clock_slack_s
        t0 = _pods_started_s(result, lo, collected_s)
        started = t0 if started is None else min(started, t0)
        verdict = evaluate(gate, result, unit, wl.metric_unit)
        verdict = dataclasses.replace(verdict, reason=redact_text(verdict.reason), evidence=redact_obj(verdict.evidence))
        finished = time.time()
        _write_json(gate_dir / "result.json", {**result.as_dict(), "started_unix_s": t0, "finished_unix_s": finished})
        _write_json(gate_dir / "verdict.json", verdict.to_dict())
        verdicts.append(verdict)
        if verdict.outcome is Outcome.STOP:
            stop_at = gate.id
    started = started or time.time()
    finished = finished or time.time()
    overall = overall_outcome(verdicts)
    run = _collected_run(started, finished, src, render)
    _write_json(run_dir / "verdicts.json", {"suite": cfg.suite.suite.model_dump(), "overall": overall.value,
                                            "verdicts": [v.to_dict() for v in verdicts], "run": run})
    predicate = {"kvgate": {"version": __version__, "commit": git_commit()}, "suite": cfg.suite.suite.model_dump(),
                 "overall": overall.value, "verdicts": [v.to_dict() for v in verdicts], "run": run,
                 "signing_key": {"kind": key_kind, "fingerprint": key_fingerprint(private_key.public_key())}}
    try:
        bundle = write_bundle(run_dir, Path(out_dir), private_key, predicate, make_tar=make_tar,
                              render=bundle_renderer(predicate), move=True)
    except OSError as exc:
        raise HarnessError(f"the bundle was not written ({exc}); the run directory is kept at {run_dir}") from None
    return CollectOutcome(verdicts, overall, bundle)
