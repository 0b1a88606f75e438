"""kv-read (G1 through the KV connector): the reader's output parsed from captured real runs
(tests/fixtures/kv_read), the pure sizing / LMCache YAML / fio job builders, the evaluator's outcomes, run()
through a scripted node (every command as planned, in order), re-evaluation from the raw files, and the report's
paired fio / connector bars."""

import json
from pathlib import Path

import pytest
import yaml

from harness.config import load_config
from harness.engines import arch_from_config, check_lmcache_config, load_profile
from harness.errors import ConfigError, WorkloadError
from harness.gates.verdict import Outcome, evaluate
from harness.parsers.fio import parse_fio_json
from harness.node.kv_reader import BARRIER_TIMEOUT_S, barrier_timeout_s
from harness.parsers.kvread import parse_layout, parse_read
from harness.report.render import gate_charts
from harness.suite.plan import gate_plan, plan_mismatch
from harness.transport.doubles import Reply, ScriptedTransport
from harness.transport.steps import StepLog
from harness.workloads import WORKLOADS
from harness.workloads.kit.base import DROP_CACHES_ARGV, GateContext
from harness.workloads.kit.probes import fio_stream_rows
from harness.workloads.kv_read import (FioSettings, KvNodeEvidence, KvReadEvidence, connector_rows,
                                       evaluate_kv_read, fio_job, kv_shape, parallel_read_settings,
                                       reader_lmcache_config, record_checks, reevaluate_kv_read, sizing)

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "kv_read"
KEY = "kvgate-kv-read/llama-3-8b@1@0@32ae5292e1497ba6@bfloat16"  # the chunk flipped in read-fs-mismatch.json


def fixture(name: str) -> str:
    return (FIX / name).read_text()


# ----------------------------------------------------------------------------------------------- parsers


def test_layout_of_a_real_run_lists_every_chunk_file_lmcache_wrote():
    lay = parse_layout(fixture("layout-fs-2streams.json"))
    assert not lay.reused and lay.error is None
    assert lay.chunks == len(lay.files) == 16
    assert lay.kv_bytes == 16 * 32 * 2 ** 20
    # the fs connector's files: the key with '/' as -SEP-, '.data', a 28-byte header before the KV bytes
    assert lay.file_bytes == lay.kv_bytes + 16 * 28
    assert all(f.file.endswith(".data") and f.key.split("@")[-2] in f.file for f in lay.files)
    assert sorted((f.prompt, f.index) for f in lay.files) == [(p, i) for p in range(4) for i in range(4)]
    assert lay.versions["lmcache"] == "0.5.6"


def test_cold_read_of_a_real_run_gives_per_stream_rates_and_the_device_bytes():
    run = parse_read(fixture("read-fs-2streams.json"))
    assert [s.label for s in run.streams] == ["stream0", "stream1"]
    s0 = run.streams[0]
    assert s0.chunks == s0.chunks_retrieved == 8 and s0.kv_bytes == 8 * 32 * 2 ** 20
    assert s0.read_gb_s == pytest.approx(s0.kv_bytes / s0.read_s / 1e9)
    assert len(s0.retrieve_s) == 2 and not s0.mismatches and not s0.missing
    assert run.kv_bytes == 16 * 32 * 2 ** 20
    assert run.device_read_bytes >= run.kv_bytes  # dropped page cache: the device read all of it


def test_read_with_a_flipped_byte_names_the_chunk():
    run = parse_read(fixture("read-fs-mismatch.json"))
    assert [len(s.mismatches) for s in run.streams] == [0, 1]
    m = run.streams[1].mismatches[0]
    assert m.key == KEY and m.expected_sha256 != m.actual_sha256 and m.file.endswith(".data")


def test_read_of_streams_that_failed_to_start_keeps_each_error():
    run = parse_read(fixture("read-gpu-on-cpu-only-torch.json"))
    assert [s.error for s in run.streams] == ["RuntimeError: destination gpu, but torch 2.13.0+cpu sees no CUDA "
                                              "device"] * 2
    assert all(s.read_gb_s is None for s in run.streams)
    assert run.errors == ("readers did not all start: BrokenBarrierError",)


@pytest.mark.parametrize("text,msg", [
    ("", "printed no read document"),
    ('{"schema": "kvgate-kv-read/1", "type": "layout"}\n', "printed no read document"),
    ('LMCache noise\n{"schema": "kvgate-kv-read/1", "type": "read", "streams": [{"chunks": 1}]}\n',
     "stream record is malformed"),
    ('{"schema": "kvgate-kv-read/1", "type": "read", "streams": [{"label": "s", "read_s": "fast"}]}', "not a number"),
])
def test_reader_output_that_is_not_a_document_is_a_workload_error(text, msg):
    with pytest.raises(WorkloadError, match=msg):
        parse_read(text)


def test_a_reader_that_failed_as_a_whole_parses_as_its_error():
    run = parse_read('{"schema":"kvgate-kv-read/1","type":"read","error":"RuntimeError: no complete layout"}\n')
    assert run.error == "RuntimeError: no complete layout" and run.streams == ()


# ------------------------------------------------------------------------------------------------ pure parts


def test_sizing_is_whole_retrieves_per_stream_from_the_models_kv_bytes():
    cfg = json.loads((ROOT / "workloads" / "models" / "llama-3-8b.json").read_text())
    bpt = arch_from_config(cfg).kv_bytes_per_token
    assert bpt == 32 * 8 * 128 * 2 * 2
    sz = sizing(bpt, 256, 4, 2, 600 * 2 ** 20)
    assert (sz.chunk_bytes, sz.prompts_per_stream, sz.prompts, sz.kv_bytes) == (32 * 2 ** 20, 2, 4, 512 * 2 ** 20)
    with pytest.raises(ValueError, match="holds no whole retrieve per stream: 2 stream"):
        sizing(bpt, 256, 4, 2, 200 * 2 ** 20)


@pytest.mark.parametrize("model", ["llama-3-8b", "qwen2.5-32b", "deepseek-v3"])
def test_lmcache_kv_shape_holds_exactly_the_kv_bytes_per_token(model):
    arch = arch_from_config(json.loads((ROOT / "workloads" / "models" / f"{model}.json").read_text()))
    shape, mla = kv_shape(arch, 256)
    layers, kv, tokens, heads, dim = shape
    assert mla == (arch.attention == "mla") and tokens == 256
    assert layers * kv * heads * dim * arch.dtype_bytes == arch.kv_bytes_per_token


def test_reader_lmcache_yaml_puts_the_pool_on_the_target_and_keeps_the_profiles_chunking():
    prof = load_profile("vllm-lmcache")
    fs = reader_lmcache_config(prof, {"max_local_cpu_size": 1.0, "extra_config": {"save_chunk_meta": False}},
                               "fs", "/mnt/kv/pool", 3 * 2 ** 30)
    assert fs["remote_url"] == "fs://localhost:0/mnt/kv/pool" and fs["chunk_size"] == 256
    assert fs["remote_serde"] == "naive" and fs["max_local_cpu_size"] == 1.0
    assert fs["extra_config"] == {"fs_connector_use_odirect": True, "save_chunk_meta": False}  # merged, not replaced
    disk = reader_lmcache_config(prof, {"extra_config": {"disk_io_threads": 16}}, "local_disk", "/mnt/kv/pool",
                                 3 * 2 ** 30)
    assert "remote_url" not in disk and disk["local_disk"] == "/mnt/kv/pool"
    assert disk["max_local_disk_size"] >= 3  # local_disk would evict (delete) chunk files past its size
    assert check_lmcache_config(fs, "0.5.6") == [] and check_lmcache_config(disk, "0.5.6") == []


def test_parallel_read_settings_say_when_lmcache_ignores_o_direct():
    fs = parallel_read_settings({"extra_config": {"fs_connector_use_odirect": True}}, "fs", 8)
    assert fs["in_flight_chunk_reads"] == 8 and fs["odirect_effective"] is False and "save_chunk_meta" in fs["note"]
    direct = parallel_read_settings({"extra_config": {"fs_connector_use_odirect": True, "save_chunk_meta": False}},
                                    "fs", 8)
    assert direct["odirect_effective"] is True and "note" not in direct
    disk = parallel_read_settings({"extra_config": {"disk_io_threads": 2}}, "local_disk", 8)
    assert disk["disk_io_threads"] == 2 and disk["in_flight_chunk_reads"] == 2


def test_fio_job_reads_each_streams_files_once_in_its_own_group():
    job = fio_job([("gpu0", ["/p/a.data", "/p/b.data"], "0-7"), ("gpu1", ["/p/c.data"], None)], FioSettings(bs="1 MiB"))
    assert "direct=1" in job and "time_based" not in job and "file_service_type=sequential" in job
    assert "[gpu0]\nfilename=/p/a.data:/p/b.data\ncpus_allowed=0-7" in job
    assert "[gpu1]\nnew_group\nfilename=/p/c.data" in job
    with pytest.raises(WorkloadError, match="containing ':'"):
        fio_job([("s", ["/p/a:b.data"], None)], FioSettings())


# ------------------------------------------------------------------------------------------------ evaluation


def evidence(read_fixture: str, with_fio: bool = True) -> KvReadEvidence:
    run = parse_read(fixture(read_fixture))
    fio = parse_fio_json(fixture("fio-2streams.json")) if with_fio else None
    rec = KvNodeEvidence(target="scratch", kind="file", pool_dir="/var/tmp/kvgate-work/kvgate-kv-read",
                         pool_device="/dev/vda", page_cache_dropped=True,
                         layout={"chunks": 16, "reused": False, "kv_bytes": 536870912, "file_bytes": 536871360})
    record_checks(rec, run)
    rows, details = connector_rows("localhost", run, fio)
    return KvReadEvidence(engine_profile="vllm-lmcache", backend="fs", model="llama-3-8b", kv_bytes_per_token=131072,
                          chunk_tokens=256, chunk_bytes=32 * 2 ** 20, chunks_per_retrieve=4, destination="cpu",
                          nodes={"localhost": rec}, streams=rows, stream_details=details,
                          fio_streams=fio_stream_rows("localhost", fio, {}) if fio else [])


def g1c_gate():
    cfg = load_config(ROOT / "inventory" / "localhost.yaml", ROOT / "gates" / "g1-connector.yaml", WORKLOADS)
    return cfg, cfg.suite.gates[0]


def test_cold_read_with_every_chunk_equal_passes_with_its_fio_comparison():
    result = evaluate_kv_read(evidence("read-fs-2streams.json"))
    assert result.error is None and result.invalid_reason is None and result.failed_check is None
    m = result.metrics
    conn = [s.read_gb_s for s in result.evidence.streams]
    assert m["connector_read_gb_s"] == min(conn) and m["connector_read_gb_s_mean"] == pytest.approx(sum(conn) / 2)
    assert m["fio_read_gb_s"] == pytest.approx(0.547827461)
    assert m["connector_efficiency"] == pytest.approx(m["connector_read_gb_s"] / m["fio_read_gb_s"])
    assert m["mismatched_chunks"] == m["missing_chunks"] == 0
    # each connector bar carries the same stream's fio figure, for the side-by-side chart
    assert [s.fio_read_gb_s for s in result.evidence.streams] == pytest.approx([0.547827461, 0.618514875])
    checks = {c.name: c for c in result.evidence.validity}
    assert checks["cold"].ok and checks["data"].ok and checks["data"].value == 0
    assert checks["cold"].unit == "B" and checks["cold"].value >= result.metrics["kv_bytes_read"]
    _, gate = g1c_gate()
    assert evaluate(gate, result, "GB/s").outcome is Outcome.PASS


def test_a_chunk_read_back_different_is_fail_naming_its_key_whatever_the_bandwidth():
    result = evaluate_kv_read(evidence("read-fs-mismatch.json"))
    assert KEY in result.failed_check and "localhost/stream1" in result.failed_check
    _, gate = g1c_gate()
    v = evaluate(gate, result, "GB/s")
    assert v.outcome is Outcome.FAIL and KEY in v.reason
    assert result.metrics["connector_read_gb_s"] > 0.05  # above the pass threshold, still FAIL
    data = next(c for c in result.evidence.validity if c.name == "data")
    assert data.ok is False and KEY in data.how and data.value >= 1


def test_a_chunk_stored_but_not_retrieved_is_fail_naming_its_key():
    text = fixture("read-fs-2streams.json").replace('"missing":[]', '"missing":["model@1@0@abc@bfloat16"]', 1)
    ev = evidence("read-fs-2streams.json")
    run = parse_read(text)
    record_checks(ev.nodes["localhost"], run)
    result = evaluate_kv_read(ev)
    assert "chunk model@1@0@abc@bfloat16 was stored but LMCache did not retrieve it" in result.failed_check


def test_reads_served_from_the_page_cache_are_invalid():
    result = evaluate_kv_read(evidence("read-fs-warm-cache.json"))
    assert result.invalid_reason.startswith("served from a cache: the pool's device on localhost (/dev/vda) read ")
    _, gate = g1c_gate()
    assert evaluate(gate, result, "GB/s").outcome is Outcome.INVALID


def test_a_device_that_cannot_be_measured_is_invalid():
    ev = evidence("read-fs-2streams.json")
    ev.nodes["localhost"].device_read_bytes = None
    assert "could not be measured" in evaluate_kv_read(ev).invalid_reason


def test_readers_that_failed_are_an_error_naming_node_and_stream():
    result = evaluate_kv_read(evidence("read-gpu-on-cpu-only-torch.json"))
    assert "node localhost stream gpu0: RuntimeError: destination gpu" in result.error
    assert "connector_read_gb_s" not in result.metrics


def test_no_fio_figure_is_an_error():
    assert evaluate_kv_read(evidence("read-fs-2streams.json", with_fio=False)).error == \
        "no fio figure for the same chunk files"


# ------------------------------------------------------------------------------------------ run() and plan


def reader_node(read_json: str, drop_rc: int = 0, seen: dict | None = None) -> ScriptedTransport:
    """localhost as the captured run saw it: findmnt, the reader's layout and read, the device counters, fio."""
    # the pool device probe's answers: findmnt's device (captured) with each captured stat line after it
    mark = "kvgate-pool-device {1} {0}\n".format(*fixture("findmnt-vda.txt").split())
    stats = [mark + line for line in fixture("blockstat-around-fio.txt").splitlines(keepends=True)]
    stats[:1] = [stats[0]] * 3  # the pool device found, after the layout (nothing written on the captured run), before fio
    seen = {} if seen is None else seen

    def handler(call):
        argv = call.argv
        if argv == DROP_CACHES_ARGV:
            return Reply(rc=drop_rc, stderr="" if drop_rc == 0 else "sh: 1: cannot create: Permission denied\n")
        if len(argv) > 2 and argv[1].endswith("/kv_reader.py"):
            seen[argv[2]] = dict(call.env)
            return Reply(stdout=fixture("layout-fs-2streams.json" if argv[2] == "layout" else read_json))
        if argv[:2] == ("sh", "-c") and "kvgate-pool-blockstat" in argv:
            return Reply(stdout=stats.pop(0))
        if argv[:2] == ("fio", "--output-format=json"):
            return Reply(stdout=fixture("fio-2streams.json"))
        if argv[0] in ("mkdir", "sync"):
            return Reply()
        return Reply(rc=127, stderr=f"{argv[0]}: not expected")
    return ScriptedTransport(handler, name="localhost")


def g1c_context(tmp_path, node) -> GateContext:
    cfg, gate = g1c_gate()
    gate_dir = tmp_path / "gates" / gate.id
    gate_dir.mkdir(parents=True)
    return GateContext(gate=gate, params=cfg.params[gate.id], nodes={n.name: n for n in cfg.gate_nodes(gate)},
                       transports={"localhost": node}, steps=StepLog(tmp_path), gate_dir=gate_dir)


def test_run_sends_the_planned_commands_in_order_and_measures_from_the_readers_output(tmp_path):
    seen: dict = {}
    node = reader_node("read-fs-2streams.json", seen=seen)
    ctx = g1c_context(tmp_path, node)
    result = WORKLOADS["kv-read"]().run(ctx)

    assert result.error is None and result.invalid_reason is None and result.failed_check is None
    cfg, gate = g1c_gate()
    # the SMART reads are planned where the device is an NVMe namespace (/dev/vda is none): not sent here
    assert node.commands == [s.argv for s in gate_plan(cfg, gate) if s.argv and not s.optional]
    # cold first: the page cache dropped after the layout and before the readers; the layout's writes synced and
    # counted after the read; not dropped again before fio, whose O_DIRECT reads it never serves (the pool
    # device's counters around fio prove them)
    cmds = [c[2] if len(c) > 2 and c[1].endswith("kv_reader.py") else c[0] for c in node.commands]
    assert cmds == ["mkdir", "sh", "layout", "sh", "read", "sync", "sh", "sh", "fio", "sh"]
    synced = next(i for i, c in enumerate(node.commands) if c[0] == "sync")
    assert not any("drop_caches" in " ".join(c) for c in node.commands[synced:])
    assert "direct=1" in node.files["/var/tmp/kvgate-work/kvgate-kvread-G1C-localhost/kv-fio.job"].decode()
    # one hash seed for the layout and every reader (LMCache's builtin chunk hash), no telemetry
    assert seen["layout"]["PYTHONHASHSEED"] == seen["read"]["PYTHONHASHSEED"] == "0"
    assert seen["read"]["LMCACHE_TRACK_USAGE"] == "false"
    # the spec the readers got: the pool device found by findmnt, disjoint prompts per stream
    spec = json.loads(node.files["/var/tmp/kvgate-work/kvgate-kvread-G1C-localhost/spec.json"])
    assert spec["device_stat"] == "/sys/dev/block/254:0/stat"
    assert [s["prompts"] for s in spec["streams"]] == [[0, 2], [1, 3]]
    assert spec["chunk_bytes"] == 32 * 2 ** 20 and spec["kv_dtype"] == "bfloat16" and spec["destination"] == "cpu"
    # the readers may take as long to start as the gate lets them read (their imports under qemu TCG took over
    # the reader's own 600 s bound on a loaded host, and broke its barrier)
    assert barrier_timeout_s(spec) == spec["read_timeout_s"] == cfg.params[gate.id].read_timeout_s
    lm = yaml.safe_load(node.files["/var/tmp/kvgate-work/kvgate-kvread-G1C-localhost/lmcache.yaml"])
    assert lm["remote_url"] == "fs://localhost:0/var/tmp/kvgate-work/kvgate-kv-read" and lm["max_local_cpu_size"] == 1.0
    assert node.files["/var/tmp/kvgate-work/kvgate-kvread-G1C-localhost/kv_reader.py"].startswith(b'"""kvgate\'s KV')
    # fio read the chunk files the layout listed, stream by stream
    job = node.files["/var/tmp/kvgate-work/kvgate-kvread-G1C-localhost/kv-fio.job"].decode()
    lay = parse_layout(fixture("layout-fs-2streams.json"))
    stream1 = [f.file for f in sorted(lay.files, key=lambda f: (f.prompt, f.index)) if f.prompt in (1, 3)]
    assert "[stream1]\nnew_group\nfilename=" + ":".join(
        f"/var/tmp/kvgate-work/kvgate-kv-read/{f}" for f in stream1) in job

    ev = result.evidence
    rec = ev.nodes["localhost"]
    assert rec.page_cache_dropped and rec.fio_page_cache_dropped is None and rec.pool_device == "/dev/vda"
    assert rec.fio_device_read_bytes == (457664082 - 456351058) * 512
    # what the layout cost the drive: counted (nothing, on the captured device), and SMART said not exposed
    assert rec.layout_device_write_bytes == 0 and ev.endurance["device_write_bytes"] == 0
    assert ev.endurance["stored_kv_bytes"] == rec.layout.kv_bytes and ev.endurance["write_amplification"] == 0
    assert ev.endurance["smart"]["exposed"] is False and "no NVMe namespace" in ev.endurance["smart"]["note"]
    assert ev.parallel_read["odirect_effective"] is False  # the profile asks for it; LMCache 0.5.6 ignores it
    assert ev.kv_bytes_per_token == 131072 and ev.chunk_bytes == 32 * 2 ** 20
    assert result.metrics["fio_read_gb_s"] == pytest.approx(0.547827461)
    for raw in ("layout.json", "read.json", "fio.json", "spec.json", "lmcache.yaml", "kv-fio.job"):
        assert (ctx.gate_dir / "localhost" / raw).is_file(), raw
    assert evaluate(gate, result, "GB/s").outcome is Outcome.PASS


def g1c_import_once(tmp_path, drop_caches: bool = True, **params):
    g = yaml.safe_load((ROOT / "gates" / "g1-connector.yaml").read_text())
    g["gates"][0]["params"].update(import_once=True, drop_caches=drop_caches, **params)
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(g, sort_keys=False))
    cfg = load_config(ROOT / "inventory" / "localhost.yaml", tmp_path / "g.yaml", WORKLOADS)
    return cfg, cfg.suite.gates[0]


def layout_read_node(drop_doc: str | None, read_json: str = "read-fs-2streams.json",
                     layout_json: str | None = None, read_doc: str | None = None) -> ScriptedTransport:
    """reader_node's localhost, whose reader answers ``layout-read`` with the three documents in one stdout (the
    read document: ``read_doc``, else the ``read_json`` fixture)."""
    inner = reader_node(read_json)

    def handler(call):
        if len(call.argv) > 2 and call.argv[1].endswith("/kv_reader.py"):
            assert call.argv[2] == "layout-read", call.argv
            return Reply(stdout=(layout_json or fixture("layout-fs-2streams.json")) + (drop_doc or "")
                         + (read_doc or fixture(read_json)))
        return inner.handler(call)
    return ScriptedTransport(handler, name="localhost")


@pytest.mark.parametrize("drop_caches", [True, False])
def test_import_once_runs_layout_drop_and_read_as_one_planned_step_and_files_each_phase(tmp_path, drop_caches):
    cfg, gate = g1c_import_once(tmp_path, drop_caches)
    node = layout_read_node('{"schema":"kvgate-kv-read/1","type":"drop-caches","dropped":true,"error":null}\n'
                            if drop_caches else None)
    ctx = GateContext(gate=gate, params=cfg.params[gate.id], nodes={n.name: n for n in cfg.gate_nodes(gate)},
                      transports={"localhost": node}, steps=StepLog(tmp_path / "run"), gate_dir=tmp_path / "gate")
    ctx.gate_dir.mkdir()
    result = WORKLOADS["kv-read"]().run(ctx)
    assert result.error is None and result.invalid_reason is None, (result.error, result.invalid_reason)
    assert node.commands == [s.argv for s in gate_plan(cfg, gate) if s.argv and not s.optional]
    readers = [c for c in node.commands if len(c) > 2 and c[1].endswith("kv_reader.py")]
    assert [c[2:3] + c[5:] for c in readers] == [("layout-read", "--drop-caches") if drop_caches else ("layout-read",)]
    # the drop before the read is the reader interpreter's own, and none runs before fio (O_DIRECT): the controller
    # sends no drop step at all (before, its drop before fio dropped the import's cache and fio read in its wake)
    assert DROP_CACHES_ARGV not in node.commands
    rec = result.evidence.nodes["localhost"]
    assert rec.page_cache_dropped is (True if drop_caches else None) and rec.layout.chunks == 16
    # each phase's document in its own raw file, as the per-phase steps leave them (re-evaluation reads read.json)
    nd = ctx.gate_dir / "localhost"
    assert parse_layout((nd / "layout.json").read_text()).chunks == 16
    assert len(parse_read((nd / "read.json").read_text()).streams) == 2
    assert evaluate(gate, result, "GB/s").outcome is Outcome.PASS


@pytest.mark.parametrize("drop_doc,error", [
    ('{"schema":"kvgate-kv-read/1","type":"drop-caches","dropped":false,"error":"PermissionError: denied"}\n',
     "PermissionError: denied"),
    ("", "printed no drop-caches document")])
def test_import_once_whose_drop_was_refused_or_silent_records_it(tmp_path, drop_doc, error):
    cfg, gate = g1c_import_once(tmp_path)
    node = layout_read_node(drop_doc, "read-fs-warm-cache.json")
    ctx = GateContext(gate=gate, params=cfg.params[gate.id], nodes={n.name: n for n in cfg.gate_nodes(gate)},
                      transports={"localhost": node}, steps=StepLog(tmp_path / "run"), gate_dir=tmp_path / "gate")
    ctx.gate_dir.mkdir()
    result = WORKLOADS["kv-read"]().run(ctx)
    rec = result.evidence.nodes["localhost"]
    assert rec.page_cache_dropped is False and error in rec.drop_caches_error
    assert evaluate(gate, result, "GB/s").outcome is Outcome.INVALID


def test_import_once_whose_layout_failed_reads_nothing_and_is_an_error(tmp_path):
    cfg, gate = g1c_import_once(tmp_path)
    bad = ('{"schema":"kvgate-kv-read/1","type":"layout","error":"RuntimeError: no space"}\n'
           '{"schema":"kvgate-kv-read/1","type":"read","error":"not read: the layout failed (RuntimeError: no space)"}\n')
    node = ScriptedTransport(lambda call: Reply(rc=3, stdout=bad) if len(call.argv) > 2 and call.argv[1].endswith(
        "kv_reader.py") else reader_node("read-fs-2streams.json").handler(call), name="localhost")
    ctx = GateContext(gate=gate, params=cfg.params[gate.id], nodes={n.name: n for n in cfg.gate_nodes(gate)},
                      transports={"localhost": node}, steps=StepLog(tmp_path / "run"), gate_dir=tmp_path / "gate")
    ctx.gate_dir.mkdir()
    result = WORKLOADS["kv-read"]().run(ctx)
    assert result.error == "node localhost: layout failed: RuntimeError: no space"
    assert not any(c[0] == "fio" for c in node.commands)
    assert evaluate(gate, result, "GB/s").outcome is Outcome.ERROR


def test_readers_without_a_read_timeout_start_within_the_readers_own_bound():
    assert barrier_timeout_s({}) == barrier_timeout_s({"read_timeout_s": None}) == BARRIER_TIMEOUT_S
    assert barrier_timeout_s({"read_timeout_s": 1200}) == 1200.0


def test_run_with_a_corrupted_chunk_is_fail_and_keeps_the_measurement(tmp_path):
    ctx = g1c_context(tmp_path, reader_node("read-fs-mismatch.json"))
    result = WORKLOADS["kv-read"]().run(ctx)
    v = evaluate(ctx.gate, result, "GB/s")
    assert v.outcome is Outcome.FAIL and KEY in v.reason
    assert result.evidence.nodes["localhost"].mismatches[0]["stream"] == "stream1"
    assert json.loads((ctx.gate_dir / "kv-read.json").read_text())["failed_check"] == result.failed_check


def test_run_whose_page_cache_drop_is_refused_records_it_and_lets_the_device_bytes_decide(tmp_path):
    ctx = g1c_context(tmp_path, reader_node("read-fs-warm-cache.json", drop_rc=1))
    result = WORKLOADS["kv-read"]().run(ctx)
    rec = result.evidence.nodes["localhost"]
    assert rec.page_cache_dropped is False and "Permission denied" in rec.drop_caches_error
    assert evaluate(ctx.gate, result, "GB/s").outcome is Outcome.INVALID


def test_run_whose_layout_fails_is_an_error_with_the_readers_words(tmp_path):
    def handler(call):
        if len(call.argv) > 2 and call.argv[1].endswith("/kv_reader.py"):
            return Reply(rc=3, stdout='{"schema":"kvgate-kv-read/1","type":"layout","error":"RuntimeError: '
                                      '/pool has 10 bytes free, the layout needs 536936448"}\n')
        return Reply(stdout="kvgate-pool-device 254:0 /dev/vda\n" + fixture("blockstat-around-fio.txt").splitlines()[0]
                     if "kvgate-pool-blockstat" in call.argv else "")
    node = ScriptedTransport(handler, name="localhost")
    ctx = g1c_context(tmp_path, node)
    result = WORKLOADS["kv-read"]().run(ctx)
    assert result.error == "node localhost: layout failed: RuntimeError: /pool has 10 bytes free, the layout needs " \
                           "536936448"
    assert not any(c[0] == "fio" or (len(c) > 2 and c[2] == "read") for c in node.commands)
    assert evaluate(ctx.gate, result, "GB/s").outcome is Outcome.ERROR


def test_reevaluation_from_the_raw_files_gives_the_same_result():
    ev = evidence("read-fs-mismatch.json")
    first = evaluate_kv_read(ev)
    again = reevaluate_kv_read(first.evidence.as_dict(), {"localhost": (fixture("read-fs-mismatch.json"),
                                                                        fixture("fio-2streams.json"))})
    assert again.metrics == first.metrics and again.failed_check == first.failed_check
    # a raw file that no longer says what the evidence says is what re-evaluation reports
    clean = reevaluate_kv_read(first.evidence.as_dict(), {"localhost": (fixture("read-fs-2streams.json"),
                                                                        fixture("fio-2streams.json"))})
    assert clean.failed_check is None and clean.metrics != first.metrics
    # a bundle of an older kvgate recorded validity as a mapping: it re-evaluates, and says validity again
    older = {**first.evidence.as_dict(), "validity": {"cold": {"proven": True, "detail": "older shape"}}}
    again = reevaluate_kv_read(older, {"localhost": (fixture("read-fs-mismatch.json"), fixture("fio-2streams.json"))})
    assert again.failed_check == first.failed_check and again.evidence.validity == first.evidence.validity


# -------------------------------------------------------------------------------------------------- report


def test_the_report_draws_fio_and_connector_bars_side_by_side_with_the_reference():
    result = evaluate_kv_read(evidence("read-fs-2streams.json"))
    _, gate = g1c_gate()
    verdict = evaluate(gate, result, "GB/s").to_dict()
    verdict["reference"] = {"value": "0.5 GB/s"}  # on the scale of the bars, so it is drawn
    caption, svg = gate_charts(verdict)["streams"]
    for gid in ("bar-fio-stream0", "bar-stream0", "bar-fio-stream1", "bar-stream1", "reference-line", "pass-line"):
        assert f'id="{gid}"' in svg, gid
    assert caption.startswith("fio (grey) and the KV connector (blue) reading the same bytes")


def test_on_an_nvme_namespace_the_layout_reports_smart_data_units_beside_the_block_counters(tmp_path):
    """The pool on /dev/nvme0n1: nvme smart-log read before the layout and after it (the captured loopback's
    readings: 19 data units written), beside the block counters' bytes over the same window (the captured stat
    lines: 80 sectors), which do not agree here, and the evidence says so rather than picking one."""
    smart = iter([(ROOT / "tests/fixtures/nvme/smart-log/null_blk-before.json").read_text(),
                  (ROOT / "tests/fixtures/nvme/smart-log/null_blk-after-9MiB-written.json").read_text()])
    lines = fixture("blockstat-around-fio.txt").splitlines(keepends=True)
    stats = ["kvgate-pool-device 259:0 /dev/nvme0n1\n" + line for line in (lines[0], lines[1], lines[0], lines[1])]
    inner = reader_node("read-fs-2streams.json")

    def handler(call):
        if call.argv[:2] == ("nvme", "smart-log"):
            assert call.argv[2] == "/dev/nvme0n1", call.argv
            return Reply(stdout=next(smart))
        if call.argv[:2] == ("sh", "-c") and "kvgate-pool-blockstat" in call.argv:
            return Reply(stdout=stats.pop(0))
        return inner.handler(call)
    node = ScriptedTransport(handler, name="localhost")
    result = WORKLOADS["kv-read"]().run(g1c_context(tmp_path, node))
    assert result.error is None, result.error
    cfg, gate = g1c_gate()
    assert plan_mismatch([s for s in gate_plan(cfg, gate)], node.commands) is None
    assert [c for c in node.commands if c[0] == "nvme"] == [("nvme", "smart-log", "/dev/nvme0n1", "-o", "json")] * 2
    e = result.evidence.endurance
    assert e["device_write_bytes"] == 80 * 512
    assert e["smart"]["exposed"] and e["smart"]["data_units_written"] == 19 and e["smart"]["written_bytes"] == 9_728_000
    assert e["smart"]["block_write_bytes"] == 40960 and e["smart"]["reconciled"] is False


def test_the_import_once_preload_runs_without_the_cyclic_collector_and_leaves_it_on_with_the_imports_frozen(
        monkeypatch, tmp_path):
    """kv_reader's preload (layout-read) imports with the garbage collector off (each full collection walks the
    whole heap of ~5,000 modules again), then collects once and freezes what is left, so the forked layout and
    readers never walk nor copy it; the collector is on again afterwards, also when an import fails."""
    import gc
    import sys

    from harness.node import kv_reader

    (tmp_path / "kvgate_preload_probe.py").write_text("import gc\nCOLLECTOR_ON = gc.isenabled()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "kvgate_preload_probe", raising=False)
    monkeypatch.setattr(kv_reader, "PRELOAD", ("kvgate_preload_probe",))
    monkeypatch.setattr(kv_reader, "PRELOAD_IF_PRESENT", ("kvgate_no_such_module",))
    assert gc.isenabled()
    try:
        assert kv_reader.preload() >= 0
        assert sys.modules["kvgate_preload_probe"].COLLECTOR_ON is False
        assert gc.isenabled() and gc.get_freeze_count() > 0
        gc.unfreeze()
        monkeypatch.setattr(kv_reader, "PRELOAD", ("kvgate_no_such_module",))
        with pytest.raises(ModuleNotFoundError):
            kv_reader.preload()
        assert gc.isenabled()
    finally:
        gc.unfreeze()
        gc.enable()


# --------------------------------------------------------------------------------- import_vllm: vLLM blocked


def _layout_with(**fields) -> str:
    """The captured layout document with the reader's hash-seed fields added (as kv_reader.py reports them)."""
    return json.dumps({**json.loads(fixture("layout-fs-2streams.json")), **fields}) + "\n"


def run_layout_read(tmp_path, cfg, gate, node):
    """kv-read of ``gate`` (import_once) on the scripted ``node``: its result, without error, and the reader's spec."""
    ctx = GateContext(gate=gate, params=cfg.params[gate.id], nodes={n.name: n for n in cfg.gate_nodes(gate)},
                      transports={"localhost": node}, steps=StepLog(tmp_path / "run"), gate_dir=tmp_path / "gate")
    ctx.gate_dir.mkdir()
    result = WORKLOADS["kv-read"]().run(ctx)
    assert result.error is None, result.error
    return result, json.loads(node.files["/var/tmp/kvgate-work/kvgate-kvread-G1C-localhost/spec.json"])


@pytest.mark.parametrize("import_vllm,none_hash", [(True, 5313149338359954478), (False, 0)])
def test_import_vllm_reaches_the_readers_spec_its_layouts_identity_and_the_evidence(tmp_path, import_vllm, none_hash):
    cfg, gate = g1c_import_once(tmp_path, import_vllm=import_vllm)
    node = layout_read_node('{"schema":"kvgate-kv-read/1","type":"drop-caches","dropped":true,"error":null}\n',
                            layout_json=_layout_with(vllm_imported=import_vllm, none_hash=none_hash))
    result, spec = run_layout_read(tmp_path, cfg, gate, node)
    assert spec["import_vllm"] is import_vllm
    # another NONE_HASH makes other chunk keys: a pool laid out with vLLM is not reused without it (the default's
    # identity is the one it always was, so its pools stay reusable)
    plain = g1c_context(tmp_path / "plain", node)  # g1-connector.yaml as shipped: import_vllm left out
    default_id = WORKLOADS["kv-read"]()._setup(plain, next(iter(plain.nodes.values()))).layout_id
    assert (spec["layout_id"] == default_id) is import_vllm
    rec = result.evidence.nodes["localhost"]
    assert rec.vllm_imported is import_vllm and rec.none_hash == none_hash
    data = next(c for c in result.evidence.validity if c.name == "data")
    assert ("NONE_HASH 0" in data.how) is not import_vllm, data.how


def test_only_the_loopback_gate_blocks_vllm():
    for name in ("loopback-kv-read.yaml", "g1-connector.yaml", "gpu-node.yaml"):
        gates = yaml.safe_load((ROOT / "gates" / name).read_text())["gates"]
        kv = [g["params"] for g in gates if g["workload"] == "kv-read"]
        assert kv and all(p.get("import_vllm", True) is (name != "loopback-kv-read.yaml") for p in kv), name


def test_a_layout_says_whether_vllm_seeded_its_keys_and_an_older_one_says_nothing():
    lay = parse_layout(_layout_with(vllm_imported=False, none_hash=0))
    assert lay.vllm_imported is False and lay.none_hash == 0
    lay = parse_layout(fixture("layout-fs-2streams.json"))
    assert lay.vllm_imported is None and lay.none_hash is None


def _spec_file(tmp_path, **fields) -> Path:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({**json.loads(fixture("spec-fs-2streams.json")), **fields}))
    return path


# run by the engine's interpreter as kv_reader.py is on a node, with its layout replaced by a probe that tries vLLM
PROBE = """
import importlib.util, sys
sys.path.insert(0, sys.argv[1])
import kv_reader

def probe(spec):
    if sys.modules.get("vllm", 0) is None:
        try:
            import vllm  # noqa: F401
            said = "imported"
        except ImportError as exc:
            said = f"ImportError: {exc}"
    else:
        said = "importable" if importlib.util.find_spec("vllm") is not None else "not installed"
    return {"schema": kv_reader.SCHEMA, "type": "layout", "vllm": said}

kv_reader.layout = probe
sys.exit(kv_reader.main(["layout", "--spec", sys.argv[2]]))
"""


@pytest.mark.parametrize("import_vllm", [False, True])
def test_the_reader_blocks_vllm_before_its_command_when_the_spec_says_so(tmp_path, import_vllm):
    import importlib.util
    import subprocess
    import sys
    if import_vllm and importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed in this interpreter: nothing to leave importable")
    spec = _spec_file(tmp_path, import_vllm=import_vllm)
    r = subprocess.run([sys.executable, "-c", PROBE, str(ROOT / "harness" / "node"), str(spec)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    said = json.loads(r.stdout.strip().splitlines()[-1])["vllm"]
    assert said == ("importable" if import_vllm else "ImportError: import of vllm halted; None in sys.modules")


def test_a_spec_whose_import_vllm_is_not_a_boolean_is_a_bad_spec(tmp_path):
    from harness.node.kv_reader import SpecError, load_spec
    assert load_spec(str(_spec_file(tmp_path)))["layout_id"]  # absent: vLLM as installed
    with pytest.raises(SpecError, match="import_vllm 'no'"):
        load_spec(str(_spec_file(tmp_path, import_vllm="no")))


# ------------------------------------------------------------- defer_imports: a module imported at its first use

# run in a fresh interpreter: kv_reader's stand-in for a package whose __init__ counts its runs, used as LMCache uses
# transformers (a name bound by `from ... import` at a module's top), then as other code might
DEFER_PROBE = """
import importlib.util, inspect, json, sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
import kv_reader as K
spec = {"defer_imports": ["kvg_probe", "kvg_not_installed"]}
out = {"installed": K.defer_imports(spec)}
from kvg_probe import Thing, make
out["bound"] = [repr(Thing), repr(make)]
out["runs_after_from"] = getattr(sys, "kvg_probe_runs", 0)
inspect.getmodule(K.layout)  # walks sys.modules asking each for __file__ (torch does this while it imports)
out["found"] = importlib.util.find_spec("kvg_probe").origin
try:
    import kvg_probe.sub
    out["sub"] = "imported"
except ImportError as exc:
    out["sub"] = str(exc)
out["before_use"] = K.deferred_record(spec)
class Mine(Thing):
    pass
out["subclass_of_real"] = Mine.__mro__[1] is sys.modules["kvg_probe"].Thing
out["call"] = make()
out["after_use"] = K.deferred_record(spec)
import kvg_probe.sub
out["sub_after_use"] = kvg_probe.sub.WHAT
out["runs"] = sys.kvg_probe_runs
print(json.dumps(out))
"""


def test_a_deferred_module_binds_names_without_importing_and_is_the_real_one_from_its_first_use(tmp_path):
    import subprocess
    import sys
    pkg = tmp_path / "kvg_probe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import sys\nsys.kvg_probe_runs = getattr(sys, 'kvg_probe_runs', 0) + 1\n"
                                     "class Thing:\n    x = 1\n\ndef make():\n    return 42\n")
    (pkg / "sub.py").write_text("WHAT = 'sub'\n")
    r = subprocess.run([sys.executable, "-c", DEFER_PROBE, str(ROOT / "harness" / "node"), str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["installed"] == {"kvg_probe": "deferred", "kvg_not_installed": "absent"}
    assert out["bound"] == ["<deferred kvg_probe.Thing>", "<deferred kvg_probe.make>"]
    assert out["runs_after_from"] == 0 and out["found"] == str(pkg / "__init__.py")
    # a submodule cannot come from the stand-in: refused loudly, not served from a package that never ran
    assert "'kvg_probe' is not a package" in out["sub"]
    assert out["before_use"] == {"kvg_probe": "deferred", "kvg_not_installed": "absent"}
    # a bound name used (a class statement's base, a call) is the real module's, imported once
    assert out["subclass_of_real"] is True and out["call"] == 42
    assert out["after_use"] == {"kvg_probe": "imported", "kvg_not_installed": "absent"}
    assert out["sub_after_use"] == "sub" and out["runs"] == 1


def test_a_spec_whose_defer_imports_is_not_a_list_of_module_names_is_a_bad_spec(tmp_path):
    from harness.node.kv_reader import SpecError, load_spec
    assert load_spec(str(_spec_file(tmp_path, defer_imports=["transformers"])))["defer_imports"] == ["transformers"]
    for bad in ("transformers", ["transformers.models"], [3]):
        with pytest.raises(SpecError, match="defer_imports"):
            load_spec(str(_spec_file(tmp_path, defer_imports=bad)))


def test_a_gate_deferring_a_dotted_name_is_a_config_error_naming_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"g\.yaml:\d+.*defer_imports.*'transformers\.models'"):
        g1c_import_once(tmp_path, defer_imports=["transformers.models"])


@pytest.mark.parametrize("stream_state,merged,said", [
    ("deferred", "deferred", "transformers on localhost: never used by the layout or a reader"),
    ("imported", "imported", "transformers on localhost: imported at its first use by the layout or a reader")])
def test_defer_imports_reaches_the_readers_spec_and_the_evidence_says_whether_a_reader_used_it(
        tmp_path, stream_state, merged, said):
    cfg, gate = g1c_import_once(tmp_path, defer_imports=["transformers"])
    read = json.loads(fixture("read-fs-2streams.json"))
    for i, st in enumerate(read["streams"]):
        st["deferred_imports"] = {"transformers": stream_state if i == 1 else "deferred"}
    node = layout_read_node('{"schema":"kvgate-kv-read/1","type":"drop-caches","dropped":true,"error":null}\n',
                            layout_json=_layout_with(deferred_imports={"transformers": "deferred"}),
                            read_doc=json.dumps(read) + "\n")
    result, spec = run_layout_read(tmp_path, cfg, gate, node)
    assert spec["defer_imports"] == ["transformers"]
    # deferring changes no chunk key: the layout's identity is the gate's without it
    plain = g1c_context(tmp_path / "plain", node)
    assert spec["layout_id"] == WORKLOADS["kv-read"]()._setup(plain, next(iter(plain.nodes.values()))).layout_id
    assert result.evidence.nodes["localhost"].deferred_imports == {"transformers": merged}
    data = next(c for c in result.evidence.validity if c.name == "data")
    assert said in data.how and data.ok, data.how
    # re-derived from the bundle's raw read document, the same
    again = reevaluate_kv_read(result.evidence.as_dict(), {"localhost": (json.dumps(read),
                                                                         fixture("fio-2streams.json"))})
    assert again.evidence.nodes["localhost"].deferred_imports == {"transformers": merged}


def test_a_reader_document_with_a_malformed_deferred_record_is_refused():
    with pytest.raises(WorkloadError, match="deferred_imports is malformed"):
        parse_layout(_layout_with(deferred_imports={"transformers": "maybe"}))
    assert parse_layout(fixture("layout-fs-2streams.json")).deferred_imports == {}


def test_only_the_loopback_gate_defers_transformers():
    for name in ("loopback-kv-read.yaml", "g1-connector.yaml", "gpu-node.yaml"):
        gates = yaml.safe_load((ROOT / "gates" / name).read_text())["gates"]
        kv = [g["params"] for g in gates if g["workload"] == "kv-read"]
        assert all(p.get("defer_imports", []) == (["transformers"] if name == "loopback-kv-read.yaml" else [])
                   for p in kv), name


def test_the_preload_without_vllm_imports_none_of_the_modules_lmcache_takes_from_vllm(monkeypatch, tmp_path):
    import gc
    import sys

    from harness.node import kv_reader

    for name in ("kvgate_preload_base", "kvgate_preload_vllm"):
        (tmp_path / f"{name}.py").write_text("")
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(kv_reader, "PRELOAD", ("kvgate_preload_base",))
    monkeypatch.setattr(kv_reader, "PRELOAD_IF_PRESENT", ("kvgate_preload_vllm",))
    try:
        kv_reader.preload(import_vllm=False)
        assert "kvgate_preload_base" in sys.modules and "kvgate_preload_vllm" not in sys.modules
        kv_reader.preload()
        assert "kvgate_preload_vllm" in sys.modules
    finally:
        gc.unfreeze()
