"""G3's start skew through Slurm against through SSH, on the 8-node rig: one rig, one Slurm cluster, both launchers.

Builds one 8-node rig (prefix kvgss-, subnet 10.81.0.0/24, the port shaped to --port-mbit) and a real Slurm over
it (harness/rigs/slurm.py: slurmctld on this machine, one slurmd per rig node, munge), lays the KV copy out once
on the storage side (no measured run pays for it), then runs the whole `kvgate run` of gates/g3-rig.yaml (as
tests/integration/test_g3_slurm.py runs it: 4 chunk files per node, read_timeout_s 90) through `launcher: ssh`
and through `launcher: slurm`, alternating (ssh first in trials 1, 3, ..., slurm first in 2, 4, ...), each in a fresh
process. Needs root (namespaces) and what scripts/setup.sh --test installs (slurmctld, slurmd, munge).

  python3 benchmarks/g3_slurm_skew.py [--trials 3] [--port-mbit 500] [--chunks 4] [--json FILE]

Printed per trial: the start skew (max - min of the evidence's start_times_node_clock_s, each reader's first
read on its node's clock; one clock on the rig), nic_ceiling_ratio and the verdict, and what the barrier is
made of: the lead (how far ahead of the go-file writes the start was set), the margin left (start instant -
the last go file written), the latest reader's wake-up after the start instant (its start record's t_s - go_s),
the time from spawning the readers to the last one armed (for slurm: srun's fan-out, the job step's start),
and, for slurm, the spread of the tasks' own start times (slurm_task.py's started_at_s). Then the medians per
launcher and the goal of issue 27 (start skew <= 5 ms at 8 nodes through Slurm, as through SSH); nothing
here asserts it. Everything started is stopped in a finally (slurm daemons by PID, the rig by name), also on
Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from g3_bench import lay_out_copy  # noqa: E402  (benchmarks/ is this script's directory)

LAUNCHERS = ("ssh", "slurm")


# ------------------------------------------------------------------------------------------ pure parts

def order(round_: int) -> tuple[str, ...]:
    """Pure: the launchers of round ``round_`` (0-based), alternating which goes first (ssh in even rounds)."""
    return LAUNCHERS if round_ % 2 == 0 else LAUNCHERS[::-1]


def suite_data(base: dict, launcher: str, chunks: int, read_timeout_s: float) -> dict:
    """Pure: gates/g3-rig.yaml's data with the benchmark's chunks, read timeout and launcher."""
    data = json.loads(json.dumps(base))
    data["gates"][0]["params"].update(chunks=chunks, read_timeout_s=read_timeout_s, launcher=launcher)
    return data


def skew_ms(start_times: dict) -> float | None:
    """Pure: max - min of the readers' start times (seconds), in ms; None without two starts."""
    vals = [v for v in start_times.values() if v is not None]
    return 1e3 * (max(vals) - min(vals)) if len(vals) >= 2 else None


def barrier_figures(launch: dict, starts: dict[str, dict], tasks: dict[str, dict] | None) -> dict:
    """Pure: what the barrier of one run was made of, from its launch.json, each reader's start record
    (node -> {t_s, go_s}) and, under slurm, each task's provenance (node -> {started_at_s, ...}).

    lead_ms: how far ahead of its go-file writes the start instant was set; margin_ms: the start instant less
    the last go file's write (negative: a write landed late); wake_max_ms: the latest reader's first read after
    its go instant; arm_s: from spawning the readers to the last one armed; task_spread_ms: max - min of the
    Slurm tasks' own start times (srun's fan-out, which the barrier has to absorb)."""
    released = next((e for e in launch.get("events", []) if e.get("event") == "released"), {})
    spawned = next((e["t_s"] for e in launch.get("events", []) if e.get("event") == "spawned"), None)
    go_ref = launch.get("go_ref_s")
    nodes = launch.get("nodes", {})
    writes = [r["go_written_at_s"] for r in nodes.values() if r.get("go_written_at_s") is not None]
    armed = [r["armed_at_s"] for r in nodes.values() if r.get("armed_at_s") is not None]
    wakes = [s["t_s"] - s["go_s"] for s in starts.values() if s.get("t_s") is not None and s.get("go_s") is not None]
    task_starts = [t["started_at_s"] for t in (tasks or {}).values() if t.get("started_at_s") is not None]
    return {
        "lead_ms": 1e3 * released["lead_s"] if "lead_s" in released else None,
        "late_go_writes": released.get("late_go_writes", []),
        "margin_ms": 1e3 * (go_ref - max(writes)) if go_ref is not None and writes else None,
        "wake_max_ms": 1e3 * max(wakes) if wakes else None,
        "wake_min_ms": 1e3 * min(wakes) if wakes else None,
        "arm_s": max(armed) - spawned if armed and spawned is not None else None,
        "task_spread_ms": 1e3 * (max(task_starts) - min(task_starts)) if len(task_starts) >= 2 else None,
    }


def reader_starts(nodes_dir: Path) -> dict[str, dict]:
    """Each reader's start record (its first `"type":"start"` line) from the bundle's nodes/NODE/reader.jsonl."""
    out = {}
    for f in sorted(nodes_dir.glob("*/reader.jsonl")):
        for line in f.read_text().splitlines():
            if '"type":"start"' in line.replace(" ", ""):
                try:
                    out[f.parent.name] = json.loads(line)
                except ValueError:
                    pass
                break
    return out


def median(vals) -> float | None:
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def fmt(v, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


# ------------------------------------------------------------------------------------------ one trial

def trial(work: Path, state, st, launcher: str, suites: dict[str, Path], key: Path, idx: int, children: list
          ) -> dict:
    """One `kvgate run` through ``launcher`` in a fresh process; its verdict, skew and barrier figures."""
    inv = yaml.safe_load(Path(state.inventory_path).read_text())
    if launcher == "slurm":
        inv["slurm"] = {"partition": st.partition, "job_dir": str(work / "jobs"), "env": st.env(),
                        "time_margin_s": 60}
    inv_path = work / f"inv-{idx}-{launcher}.yaml"
    inv_path.write_text(yaml.safe_dump(inv, sort_keys=False))
    out = work / f"out-{idx}-{launcher}"
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "harness", "run", "-i", str(inv_path), "-g", str(suites[launcher]),
                             "--known-hosts", state.known_hosts, "--out", str(out), "--key", str(key)],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    children.append(proc)
    _, stderr = proc.communicate()
    run_s = time.monotonic() - t0
    bundles = list(out.glob("KVG-*/verdicts.json"))
    r = {"trial": idx, "launcher": launcher, "rc": proc.returncode, "run_s": run_s, "load1": load0}
    if not bundles:
        r.update(outcome="NO BUNDLE", error=stderr[-2000:])
        return r
    bundle = bundles[0].parent
    verdict = json.loads(bundles[0].read_text())["verdicts"][0]
    gate = bundle / "gates" / "G3"
    ev = json.loads((gate / "g3.json").read_text()).get("evidence", {})
    launch = json.loads((gate / "launch.json").read_text()) if (gate / "launch.json").exists() else {}
    tasks = (ev.get("slurm_job") or {}).get("tasks") if launcher == "slurm" else None
    r.update(outcome=verdict["outcome"], metrics=verdict.get("metrics", {}),
             skew_ms=skew_ms(ev.get("start_times_node_clock_s") or {}),
             nic_ceiling_ratio=verdict.get("metrics", {}).get("nic_ceiling_ratio"),
             start_priority=sorted({s.get("start_priority") for s in reader_starts(gate / "nodes").values()}),
             **barrier_figures(launch, reader_starts(gate / "nodes"), tasks))
    if r["outcome"] != "PASS":
        r["reason"] = verdict.get("reason")
    return r


# ------------------------------------------------------------------------------------------ main

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=3, help="runs per launcher (default 3), alternating")
    ap.add_argument("--port-mbit", type=int, default=500, help="the shaped storage port (default 500, as the tests)")
    ap.add_argument("--chunks", type=int, default=4, help="32 MiB chunk files read per node (default 4)")
    ap.add_argument("--read-timeout-s", type=float, default=90.0)
    ap.add_argument("--json", default=None, help="also write every trial's figures here")
    a = ap.parse_args()

    from harness.report.bundle import generate_keypair
    from harness.rigs.netns import RigSpec, check_prerequisites, rig_down, rig_up
    from harness.rigs.slurm import check_slurm_prerequisites, remove_state, slurm_down, slurm_up

    missing = check_prerequisites() + check_slurm_prerequisites()
    if missing:
        print(f"rig/slurm prerequisites missing: {', '.join(missing)}", file=sys.stderr)
        return 2

    def on_term(_sig, _frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)

    runs: list[dict] = []
    children: list[subprocess.Popen] = []
    t_all = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kvgate-g3-slurm-skew-") as tmp:
        work = Path(tmp)
        spec = RigSpec(prefix="kvgss-", state_dir=work / "rig", node_count=8, subnet="10.81.0.0/24",
                       port_rate_mbit=a.port_mbit)
        st = None
        try:
            t0 = time.monotonic()
            state = rig_up(spec)
            st = slurm_up(spec, state, work / "slurm")
            print(f"rig of 8 nodes and its Slurm cluster up in {time.monotonic() - t0:.1f} s", flush=True)
            base = yaml.safe_load((REPO / "gates" / "g3-rig.yaml").read_text())
            suites = {}
            for launcher in LAUNCHERS:
                data = suite_data(base, launcher, a.chunks, a.read_timeout_s)
                suites[launcher] = work / f"g3-{launcher}.yaml"
                suites[launcher].write_text(yaml.safe_dump(data, sort_keys=False))
            lay_out_copy(spec, data["gates"][0]["params"])
            generate_keypair(work / "k")
            for rnd in range(a.trials):
                for launcher in order(rnd):
                    r = trial(work, state, st, launcher, suites, work / "k.key", rnd + 1, children)
                    runs.append(r)
                    print(f"trial {rnd + 1} {launcher:5s} [{r['outcome']}] skew {fmt(r.get('skew_ms'))} ms, ratio "
                          f"{fmt(r.get('nic_ceiling_ratio'), '.3f')}, lead {fmt(r.get('lead_ms'), '.1f')} ms, margin "
                          f"{fmt(r.get('margin_ms'), '.1f')} ms, wake max {fmt(r.get('wake_max_ms'), '.3f')} ms, armed "
                          f"{fmt(r.get('arm_s'))} s after spawn, task spread {fmt(r.get('task_spread_ms'), '.1f')} ms, "
                          f"run {r['run_s']:.1f} s, load {r['load1']:.1f}"
                          + (f"\n  {r.get('reason') or r.get('error')}" if r["outcome"] != "PASS" else ""), flush=True)
        finally:
            for p in children:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGTERM)
                    p.wait(30)
            if st is not None:
                slurm_down(st)
            rig_down(spec)
            if st is not None:
                remove_state(st)
    if a.json:
        Path(a.json).write_text(json.dumps(runs, indent=1))

    print(f"\n{a.trials} trial(s) per launcher, alternating; 8 nodes, port {a.port_mbit} Mbit/s, {a.chunks} x 32 MiB "
          f"per node; {os.cpu_count()} CPUs; load average (1 min) {min(r['load1'] for r in runs):.1f}-"
          f"{max(r['load1'] for r in runs):.1f}; whole benchmark {time.monotonic() - t_all:.0f} s")
    print("| trial | launcher | start skew ms | nic_ceiling_ratio | verdict | lead ms | margin ms | wake max ms "
          "| armed after spawn s | srun task spread ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        print(f"| {r['trial']} | {r['launcher']} | {fmt(r.get('skew_ms'))} | {fmt(r.get('nic_ceiling_ratio'), '.3f')} "
              f"| {r['outcome']} | {fmt(r.get('lead_ms'), '.0f')} | {fmt(r.get('margin_ms'), '.0f')} "
              f"| {fmt(r.get('wake_max_ms'), '.3f')} | {fmt(r.get('arm_s'))} | {fmt(r.get('task_spread_ms'), '.0f')} |")
    print("\nmedians:")
    print("| launcher | start skew ms (max) | nic_ceiling_ratio | verdicts | lead ms | armed after spawn s | run s |")
    print("|---|---|---|---|---|---|---|")
    for launcher in LAUNCHERS:
        rs = [r for r in runs if r["launcher"] == launcher]
        skews = [r.get("skew_ms") for r in rs if r.get("skew_ms") is not None]
        print(f"| {launcher} | {fmt(median(skews))} ({fmt(max(skews) if skews else None)}) "
              f"| {fmt(median(r.get('nic_ceiling_ratio') for r in rs), '.3f')} "
              f"| {', '.join(sorted({r['outcome'] for r in rs}))} | {fmt(median(r.get('lead_ms') for r in rs), '.0f')} "
              f"| {fmt(median(r.get('arm_s') for r in rs))} | {fmt(median(r['run_s'] for r in rs), '.1f')} |")
    sl = [r.get("skew_ms") for r in runs if r["launcher"] == "slurm" and r.get("skew_ms") is not None]
    worst = max(sl) if sl else None
    print(f"\ngoal (issue 27: start skew <= 5 ms at 8 nodes through Slurm, as through SSH): slurm median "
          f"{fmt(median(sl))} ms, worst {fmt(worst)} ms: "
          + ("met" if worst is not None and worst <= 5.0 and all(r["outcome"] == "PASS" for r in runs
                                                                 if r["launcher"] == "slurm") else "NOT met"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
