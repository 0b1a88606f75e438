"""kvgate render k8s / kvgate collect: manifests valid against the Kubernetes schema, and a collected run.

No cluster here: the rendered pods are run as local processes, one per rank, from the rendered ConfigMap's own
files (the mount paths mapped into a temporary directory), with the real node programs (k8s_task.py,
g3_reader.py) on a tiny KV copy. Their files are what a results volume holds after the Job.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import kubernetes_validate  # the test extras (pyproject.toml): not optional, the manifests' one schema check

from harness.cli.main import main
from harness.config import load_config
from harness.gates.reevaluate import reevaluate_bundle
from harness.node import program_path
from harness.report.bundle import generate_keypair, load_private_key, verify_bundle
from harness.suite.k8s import collect_k8s, render_k8s
from harness.workloads import WORKLOADS

READERS = ("n1", "n2", "n3")
K8S_VERSION = kubernetes_validate.latest_version()


def write_suite(d: Path, pool: str, *, k8s: bool = True, extra_gate: bool = False, max_failed_share: float = 0.0):
    nodes = [{"name": n, "transport": "local", "work_dir": "/w", "nics": [{"name": "eth0", "line_rate_gbit_s": 10.0}],
              "targets": [{"name": "kvpool", "kind": "directory", "path": pool},
                          {"name": "scratch", "kind": "file", "path": "g1.bin", "size": "1 GiB"}]} for n in READERS]
    # The local 'pods' read a local directory through no port at all: the declared rate is set far above what
    # they can read, else the aggregate would exceed it (INVALID: more than the port can carry).
    nodes.append({"name": "storage", "transport": "local", "work_dir": "/w",
                  "nics": [{"name": "st0", "line_rate_gbit_s": 400.0}],
                  "targets": [{"name": "kvpool", "kind": "directory", "path": pool}]})
    inv = {"nodes": nodes}
    if k8s:
        inv["k8s"] = {"namespace": "kv-acceptance", "image": "python:3.11-slim", "results_claim": "kvgate-results",
                      "node_selector": {"nvidia.com/gpu.present": "true"}, "gpus_per_pod": 1, "go_lead_s": 0.5}
    gates = {"suite": {"name": "g3-k8s", "version": "1"}, "gates": [{
        "id": "G3", "title": "three pods read one shared copy", "workload": "g3-shared-read",
        "params": {"port": "storage:st0", "readers": list(READERS), "kv_bytes_per_token": 65536, "chunk_tokens": 16,
                   "chunks": 8, "block": "4 KiB", "streams": 1, "direct": "on", "drop_caches": False,
                   "interval_s": 0.05, "arm_timeout_s": 30, "read_timeout_s": 60, "min_window_s": 0,
                   "max_failed_share": max_failed_share},
        "metric": "nodes_completed", "pass": ">= 3 count"}]}
    if extra_gate:
        gates["gates"].append({"id": "G1", "title": "fio", "workload": "fio-read", "params": {"target": "scratch"},
                               "nodes": ["n1"], "metric": "per_gpu_read_gb_s", "pass": ">= 1 GB/s"})
    (d / "inv.yaml").write_text(yaml.safe_dump(inv, sort_keys=False))
    (d / "gates.yaml").write_text(yaml.safe_dump(gates, sort_keys=False))
    return d / "inv.yaml", d / "gates.yaml"


def docs(path: Path) -> tuple[dict, dict]:
    cm, job = list(yaml.safe_load_all(path.read_text()))
    return cm, job


def run_pods(manifest: Path, root: Path) -> Path:
    """What the cluster would do with the rendered objects, as local processes: the ConfigMap's files at the
    config mount, one k8s_task.py per completion index with its node's name from the downward API, all at
    once. Returns the run's directory in the results volume."""
    cm, job = docs(manifest)
    cfg_dir, results = root / "kvgate", root / "results"
    cfg_dir.mkdir(parents=True)

    def local(text: str) -> str:
        return text.replace("/kvgate/", f"{cfg_dir}/").replace("/results/", f"{results}/")

    for name, text in cm["data"].items():
        (cfg_dir / name).write_text(local(text) if name == "spec.json" else text)
    container = job["spec"]["template"]["spec"]["containers"][0]
    argv = [sys.executable if a == "python3" else local(a + "/").rstrip("/") if a.startswith(("/kvgate", "/results"))
            else a for a in container["command"]]
    nodes = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"]
    procs = []
    for rank, node in enumerate(nodes):
        env = {**os.environ, "JOB_COMPLETION_INDEX": str(rank), "KVGATE_K8S_NODE": node, "HOSTNAME": f"pod-{rank}"}
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
    run_id = json.loads(cm["data"]["render.json"])["run_id"]
    return results / run_id


@pytest.fixture(scope="module")
def pods(tmp_path_factory):
    """One rendered G3 run on three local 'pods', and a signing key."""
    root = tmp_path_factory.mktemp("k8s")
    pool = root / "pool"
    pool.mkdir()
    inv, gates = write_suite(root, str(pool))
    [manifest] = render_k8s(load_config(inv, gates, WORKLOADS), root / "manifests", run_id="t1")
    results = run_pods(manifest, root / "cluster")
    key, pub = generate_keypair(root / "key")
    return {"root": root, "manifest": manifest, "results": results, "key": load_private_key(key), "pub": pub,
            "key_path": key, "record": root / "manifests" / "render.json"}


def test_rendered_objects_validate_against_the_kubernetes_schema(pods):
    cm, job = docs(pods["manifest"])
    for obj in (cm, job):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"], spec["backoffLimit"]) == \
        ("Indexed", 3, 3, 0)
    pod = spec["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert pod["volumes"][0]["configMap"]["name"] == cm["metadata"]["name"]
    task_spec = json.loads(cm["data"]["spec.json"])
    assert sorted(task_spec["entries"]) == list(READERS)
    assert cm["data"]["k8s_task.py"] == Path(program_path("k8s_task.py")).read_text()
    assert [n for n, e in task_spec["entries"].items() if e["creates_pool"]] == ["n1"]


def test_the_validator_refuses_a_broken_job(pods):
    _, job = docs(pods["manifest"])
    job["spec"]["completions"] = "three"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, K8S_VERSION, strict=True)


def test_render_refuses_a_gate_without_a_k8s_launcher_by_name(tmp_path, capsys):
    inv, gates = write_suite(tmp_path, "/mnt/pool", extra_gate=True)
    rc = main(["render", "k8s", str(inv), str(gates), "-o", str(tmp_path / "m")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "gate G1: render k8s: workload fio-read has no Kubernetes launcher" in err
    assert "Traceback" not in err and not (tmp_path / "m").exists()


def test_render_without_a_k8s_block_names_the_inventory(tmp_path, capsys):
    inv, gates = write_suite(tmp_path, "/mnt/pool", k8s=False)
    assert main(["render", "k8s", str(inv), str(gates), "-o", str(tmp_path / "m")]) == 2
    assert f"{inv}: k8s: render k8s needs a `k8s:` block" in capsys.readouterr().err


def test_a_bad_k8s_field_is_one_line_naming_file_line_and_field(tmp_path, capsys):
    inv, gates = write_suite(tmp_path, "/mnt/pool")
    inv.write_text(inv.read_text().replace("results_claim: kvgate-results", "results_claim: Kvgate_Results"))
    assert main(["render", "k8s", str(inv), str(gates), "-o", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err[0].startswith(f"{inv}:") and "k8s.results_claim: " in err[0], err


def test_a_collected_run_is_evaluated_and_signed_like_any_other(pods, tmp_path):
    go = json.loads((pods["results"] / "G3" / "go.json").read_text())
    assert go["armed"] == list(READERS) and go["missing"] == []
    out = collect_k8s(pods["results"], tmp_path / "runs", pods["key"], pods["record"], make_tar=False)
    [v] = out.verdicts
    assert v.outcome.value == "PASS" and v.actual == 3.0, v.reason
    bundle = out.bundle.path
    assert verify_bundle(bundle, pods["pub"]).ok
    for n in READERS:
        assert (bundle / "gates" / "G3" / "nodes" / n / "reader.jsonl").stat().st_size > 0
    result = json.loads((bundle / "gates" / "G3" / "result.json").read_text())
    ev = result["evidence"]
    assert ev["launcher"] == "k8s" and ev["k8s_job"]["go"]["go_s"] == go["go_s"]
    assert sorted(ev["k8s_job"]["tasks"]) == list(READERS)
    assert "start_skew_s" in result["metrics"]
    # the real readers' own figures pass the self-report checks: inside render..collect, the copy's bytes, samples
    # that add up to each reader's total
    checks = {c["name"]: c for c in ev["validity"]}
    assert checks["self-reported figures"]["ok"], checks["self-reported figures"]["how"]
    assert ev["time_frame"]["max_duration_s"] == 30 + 60 + 60
    summary = json.loads((bundle / "verdicts.json").read_text())
    again = reevaluate_bundle(bundle, {"verdicts": summary["verdicts"], "overall": summary["overall"]})
    assert again.same, again.differences


@pytest.mark.parametrize("max_failed_share", [0.0, 0.5])
def test_a_missing_rank_is_error_with_the_others_data_kept(pods, tmp_path, max_failed_share):
    results = tmp_path / "t1"
    shutil.copytree(pods["results"], results)
    for f in (results / "G3").glob("n3.*"):
        f.unlink()
    record = pods["record"]
    if max_failed_share:  # rendered with another failure share: its own render record and config in the volume
        inv, gates = write_suite(tmp_path, str(pods["root"] / "pool"), max_failed_share=max_failed_share)
        render_k8s(load_config(inv, gates, WORKLOADS), tmp_path / "m", run_id="t1")
        cm, _ = docs(tmp_path / "m" / "G3.yaml")
        (results / "config" / "gates.yaml").write_text(cm["data"]["gates.yaml"])
        record = tmp_path / "m" / "render.json"
    out = collect_k8s(results, tmp_path / "runs", pods["key"], record, make_tar=False)
    [v] = out.verdicts
    assert v.outcome.value == "ERROR" and "n3" in v.reason
    assert out.overall.value == "ERROR"
    kept = out.bundle.path / "gates" / "G3" / "nodes"
    assert sorted(p.name for p in kept.iterdir()) == ["n1", "n2"]
    assert json.loads((out.bundle.path / "gates" / "G3" / "result.json").read_text())["metrics"][
        "nodes_completed"] == 2.0


@pytest.mark.parametrize("go_json", [None, '{"armed": ["n1", "n2", "n3"]}', "not json"])
def test_no_record_of_the_common_start_is_error(pods, tmp_path, go_json):
    results = tmp_path / "t1"
    shutil.copytree(pods["results"], results)
    if go_json is None:
        (results / "G3" / "go.json").unlink()
    else:
        (results / "G3" / "go.json").write_text(go_json)
    [v] = collect_k8s(results, tmp_path / "runs", pods["key"], pods["record"], make_tar=False).verdicts
    assert v.outcome.value == "ERROR" and "go.json" in v.reason


def test_collect_of_a_directory_without_a_render_record_is_a_one_line_error(tmp_path, capsys):
    assert main(["collect", str(tmp_path), "-o", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "render.json" in err and "Traceback" not in err


def test_a_pod_stopped_by_kubernetes_stops_its_program_and_records_its_status(tmp_path):
    """SIGTERM (the Job's deadline, kubectl delete) reaches the node program's process group; the task still
    writes the exit status collect reads."""
    cfg, results = tmp_path / "kvgate", tmp_path / "results"
    cfg.mkdir()
    (results / "G3").mkdir(parents=True)
    (results / "G3" / "pool.ready").write_text("n1\n")
    spec = {"gate": "G3", "arm_timeout_s": 5, "go_lead_s": 0.5, "drop_caches": False,
            "entries": {"n2": {"argv": [sys.executable, "-c", "import time; time.sleep(60)"], "creates_pool": False}}}
    (cfg / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "JOB_COMPLETION_INDEX": "1", "KVGATE_K8S_NODE": "n2"}
    task = subprocess.Popen([sys.executable, str(program_path("k8s_task.py")), "--config-dir", str(cfg),
                             "--results", str(results)], env=env)
    try:
        for _ in range(200):
            if (results / "G3" / "n2.task.json").exists():
                break
            task.wait(0.05) if task.poll() is not None else __import__("time").sleep(0.05)
        child = json.loads((results / "G3" / "n2.task.json").read_text())["child_pid"]
        task.terminate()
        assert task.wait(20) == 1
        assert (results / "G3" / "n2.rc").read_text() == "-15\n"
        with pytest.raises(ProcessLookupError):
            os.kill(child, 0)
    finally:
        if task.poll() is None:
            task.kill()


def test_the_cli_renders_and_collects_with_the_run_exit_codes(pods, tmp_path, capsys):
    inv, gates = pods["root"] / "inv.yaml", pods["root"] / "gates.yaml"
    assert main(["render", "k8s", str(inv), str(gates), "-o", str(tmp_path / "m"), "--run-id", "x"]) == 0
    assert (tmp_path / "m" / "G3.yaml").is_file()
    assert main(["collect", str(pods["results"]), "-o", str(tmp_path / "runs"), "--key", str(pods["key_path"]),
                 "--render", str(pods["record"])]) == 0
    out = capsys.readouterr().out
    assert "overall: PASS" in out and "report ID: " in out
