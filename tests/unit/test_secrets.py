"""Secrets stay out of what kvgate writes: step records (argv, env, stdout, stderr, status), engine spawn
records, error summaries, plans; the command itself still gets the value. Secret names come from the default
patterns, a profile's and the inventory's ``secret_env``; values also from command-line options, auth headers
and URL userinfo. Private keys that others can read are refused, as ssh refuses them.

Each test plants a random canary and greps every byte kvgate wrote for it, as someone reading the run
directory or the bundle would."""

import json
import os
import secrets
import shlex
from pathlib import Path

import pytest
import yaml

from harness.cli.main import main
from harness.config import load_config
from harness.engines import load_profile
from harness.errors import BundleError, ConfigError, TransportError
from harness.report.bundle import generate_keypair, load_private_key
from harness.transport.doubles import Reply, ScriptedTransport
from harness.transport.steps import StepLog
from harness.workloads import WORKLOADS
from harness.workloads.kit.base import GateContext
from harness.workloads.kit.engine import EngineProcess

ROOT = Path(__file__).resolve().parents[2]


def canary() -> str:
    return "kvcanary" + secrets.token_hex(12)


def files_with(root: Path, *values: str) -> list[str]:
    """Every file under ``root`` holding any of ``values`` (raw bytes), as 'path: value'."""
    hits = []
    for p in sorted(Path(root).rglob("*")):
        if p.is_file() and not p.is_symlink():
            data = p.read_bytes()
            hits += [f"{p.relative_to(root)}: {v}" for v in values if v.encode() in data]
    return hits


def echo_node(name="n1"):
    """A scripted node that prints back, on stdout and stderr, every environment value it was given."""
    calls = []

    def handler(call):
        calls.append(call)
        echoed = " ".join(f"{k}={v}" for k, v in call.env.items())
        return Reply(stdout=f"the command sees {echoed}\n", stderr=f"warning: {echoed}\n")
    return ScriptedTransport(handler, name=name), calls


# ------------------------------------------------------------------------------------------ step records


def test_a_secret_variable_reaches_the_command_but_no_step_file(tmp_path):
    token, plain = canary(), "kv-visible-value"
    node, calls = echo_node()
    steps = StepLog(tmp_path)
    r = steps.run(node, "with-env", ["engine", "--serve"], env={"HF_TOKEN": token, "KV_PLAIN": plain})
    assert r.ok and calls[0].env["HF_TOKEN"] == token  # the command got the real value
    assert files_with(tmp_path, token) == []
    rec = json.loads(next(tmp_path.glob("steps/*-with-env/argv.json")).read_text())
    assert rec["env"]["KV_PLAIN"] == plain and rec["env"]["HF_TOKEN"] not in (token, "")
    assert plain in next(tmp_path.glob("steps/*-with-env/stdout")).read_text()  # only secrets are hidden


@pytest.mark.parametrize("name", ["HF_TOKEN", "OPENAI_API_KEY", "PGPASSWORD", "AWS_SECRET_ACCESS_KEY",
                                  "db_password", "GOOGLE_APPLICATION_CREDENTIALS", "X_AUTH"])
def test_default_secret_names(tmp_path, name):
    value = canary()
    node, _ = echo_node()
    StepLog(tmp_path).run(node, "n", ["true"], env={name: value})
    assert files_with(tmp_path, value) == []


def test_secret_options_headers_and_url_userinfo_in_argv_are_redacted(tmp_path):
    k1, k2, k3, k4, k5 = (canary() for _ in range(5))
    argv = ["client", "--api-key", k1, f"--hf-token={k2}", "-H", f"Authorization: Bearer {k3}",
            f"https://bob:{k4}@example.com/v1", "sh", "-c", f"HF_TOKEN={k5} run-engine --max-tokens 16"]
    node = ScriptedTransport(lambda call: Reply(stdout=" ".join(call.argv), stderr=k1), name="n1")
    steps = StepLog(tmp_path)
    r = steps.run(node, "opts", argv, timeout_s=5)
    assert r.argv == tuple(argv)  # the node got the command as given
    assert files_with(tmp_path, k1, k2, k3, k4, k5) == []
    rec = json.loads(next(tmp_path.glob("steps/*-opts/argv.json")).read_text())["argv"]
    # what is not secret is kept as it was: the option names, the host, the non-secret options
    assert rec[0:2] == ["client", "--api-key"] and rec[4] == "-H" and "example.com/v1" in rec[6]
    assert rec[-1].endswith(" run-engine --max-tokens 16") and rec[-1].startswith("HF_TOKEN=")


def test_kvgates_own_commands_are_recorded_unchanged(tmp_path):
    """Redaction must not eat evidence: every command the shipped suites plan is recorded exactly."""
    from harness.redact import redact_argv
    from harness.suite.plan import facts_plan, gate_plan
    for inv, gates in [("localhost.yaml", "local.yaml"), ("localhost.yaml", "g2-cpu-reference.yaml"),
                       ("loopback-kv-read.yaml", "loopback-kv-read.yaml"), ("loopback.yaml", "loopback.yaml"),
                       ("localhost.yaml", "g2-vllm-cpu.yaml")]:
        cfg = load_config(ROOT / "inventory" / inv, ROOT / "gates" / gates, WORKLOADS)
        argvs = [s.argv for s in facts_plan(cfg.inventory.nodes)]
        argvs += [s.argv for g in cfg.suite.gates for s in gate_plan(cfg, g)]
        for argv in argvs:
            assert redact_argv(argv) == [str(a) for a in argv], (gates, argv)


def test_a_failed_command_summary_names_no_secret():
    key = canary()
    node = ScriptedTransport(lambda call: Reply(rc=1, stderr=f"bad key {key}\n"), name="n1")
    r = node.run(["client", "--api-key", key], env={"API_KEY": key})
    assert key not in r.summary() and "client --api-key" in r.summary()


def test_the_engine_spawn_record_redacts_the_profile_env_and_the_log_copy(tmp_path):
    token, lic = canary(), canary()
    prof_path = tmp_path / "prof.yaml"
    prof = yaml.safe_load((ROOT / "workloads" / "engines" / "cpu-reference.yaml").read_text())
    prof["env"].update(HF_TOKEN=token, VENDOR_LICENSE=lic)
    prof["secret_env"] = ["VENDOR_LICENSE"]
    prof_path.write_text(yaml.safe_dump(prof))
    profile = load_profile(prof_path)
    env = profile.render_env({"run_dir": "/w/run", "lmcache_config": "/w/run/lmcache.yaml"})
    spawned = []

    def handler(call):
        spawned.append(call)  # the engine prints its secrets into its log, as engines do at debug level
        return Reply(stdout=f"starting with token {call.env['HF_TOKEN']} license {call.env['VENDOR_LICENSE']}\n")
    node = ScriptedTransport(handler, name="n1")
    run = tmp_path / "run"
    gate_dir = run / "gates" / "G2"
    gate_dir.mkdir(parents=True)
    ctx = GateContext(gate=None, params=None, nodes={}, transports={"n1": node}, steps=StepLog(run),
                      gate_dir=gate_dir)
    eng = EngineProcess(ctx, node, profile, ["python", "engine.py"], env, "http://127.0.0.1:1", "/w/run/engine.log",
                        gate_dir / "engine.log")
    eng.start()
    eng.stop()
    assert spawned[0].env["HF_TOKEN"] == token and spawned[0].env["VENDOR_LICENSE"] == lic
    assert "starting with token" in (gate_dir / "engine.log").read_text()  # the log was fetched
    assert files_with(run, token, lic) == []


# ------------------------------------------------------------------------------------ secret_env config


def write_inventory(tmp_path, extra: str) -> Path:
    """The shipped localhost inventory (what gates/local.yaml needs) with ``extra`` appended at line 4 on."""
    nodes = yaml.safe_load((ROOT / "inventory" / "localhost.yaml").read_text())["nodes"]
    p = tmp_path / "i.yaml"
    p.write_text(f"# inventory\n\n\n{extra}nodes: {json.dumps(nodes)}\n")
    return p


def test_inventory_secret_env_marks_names_secret_for_every_command(tmp_path):
    lic = canary()
    inv = write_inventory(tmp_path, "secret_env: [KVTEST_VENDOR_LICENCE_A]\n")
    load_config(inv, ROOT / "gates" / "local.yaml", WORKLOADS)
    node, calls = echo_node()
    StepLog(tmp_path / "run").run(node, "n", ["true"], env={"KVTEST_VENDOR_LICENCE_A": lic})
    assert calls[0].env["KVTEST_VENDOR_LICENCE_A"] == lic
    assert files_with(tmp_path / "run", lic) == []


@pytest.mark.parametrize("extra,msg", [
    ("secret_env: ['1BAD']\n", "i.yaml:4: secret_env: invalid environment variable name(s) '1BAD'"),
    ("secret_env: [A, A]\n", "i.yaml:4: secret_env: listed twice: A"),
])
def test_inventory_secret_env_errors_name_file_and_line(tmp_path, extra, msg):
    with pytest.raises(ConfigError) as e:
        load_config(write_inventory(tmp_path, extra), ROOT / "gates" / "local.yaml", WORKLOADS)
    assert msg in str(e.value), str(e.value)


def test_profile_secret_env_must_name_a_variable_of_its_env(tmp_path):
    p = tmp_path / "prof.yaml"
    p.write_text("name: x\ndescription: d\nengine: openai\nenv:\n  A: '1'\nsecret_env: [HF_TOKN]\n")
    with pytest.raises(ConfigError) as e:
        load_profile(p)
    assert f"{p}:6: secret_env: HF_TOKN not in env (env has: A)" in str(e.value), str(e.value)


# ----------------------------------------------------------------------------------------------- plans


def test_plan_shows_no_profile_secret_and_no_attach_password(tmp_path, capsys):
    token, password = canary(), canary()
    prof = yaml.safe_load((ROOT / "workloads" / "engines" / "cpu-reference.yaml").read_text())
    prof["env"]["HF_TOKEN"] = token
    (tmp_path / "prof.yaml").write_text(yaml.safe_dump(prof))
    suite = yaml.safe_load((ROOT / "gates" / "g2-cpu-reference.yaml").read_text())
    suite["gates"] = suite["gates"][:1]
    suite["gates"][0]["params"]["engine"] = str(tmp_path / "prof.yaml")
    attach = {"id": "G2a", "title": "t", "workload": "g2-ttft", "metric": "readback_speedup_p50",
              "pass": ">= 1.5 x", "params": {
                  "engine": "vllm-attach", "served_model_name": "m", "prompt_tokens": [64], "pool_node": "localhost",
                  "pool_path": "/mnt/kvpool", "model_config_inline": suite["gates"][0]["params"]["model_config_inline"],
                  "attach": {"url": f"http://admin:{password}@10.9.9.9:8000",
                             "restart": [{"node": "localhost", "run": "systemctl restart vllm"}]}}}
    suite["gates"].append(attach)
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(suite))
    assert main(["plan", "-i", str(ROOT / "inventory" / "localhost.yaml"), "-g", str(tmp_path / "g.yaml")]) == 0
    out = capsys.readouterr().out
    assert "cpu_reference.py" in out and "10.9.9.9:8000" in out  # the plan is there
    assert token not in out and password not in out


# ------------------------------------------------------------------------------------------ SSH wrapper


def test_the_ssh_command_line_carries_no_environment_value():
    """What sshd runs (and ps shows to every user of the node) has the names' reader, not the values."""
    from harness.transport.ssh import env_block, remote_command
    token = canary()
    cmd = remote_command(["engine", "--serve"], {"HF_TOKEN": token, "A": "b c"}, "/w/engine.log")
    assert token not in cmd and "engine --serve" in cmd
    assert env_block({"HF_TOKEN": token, "A": "b c"}) == f"HF_TOKEN={token}\nA=b c\n\n".encode()
    with pytest.raises(TransportError, match="newline"):
        env_block({"A": "two\nlines"})


# ------------------------------------------------------------------------------------------ private keys


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_signing_key_others_can_read_is_refused_with_the_chmod_to_run(tmp_path, mode):
    key, _ = generate_keypair(tmp_path / "op")
    os.chmod(key, mode)
    with pytest.raises(BundleError) as e:
        load_private_key(key)
    msg = str(e.value)
    assert str(key) in msg and f"chmod 600 {shlex.quote(str(key))}" in msg and "\n" not in msg
    os.chmod(key, 0o600)
    assert load_private_key(key) is not None
    os.chmod(key, 0o400)
    assert load_private_key(key) is not None


def test_kvgate_run_with_an_open_key_exits_2_with_one_line(tmp_path, capsys):
    key, _ = generate_keypair(tmp_path / "op")
    os.chmod(key, 0o644)
    rc = main(["run", "-i", str(ROOT / "inventory" / "localhost.yaml"), "-g", str(ROOT / "gates" / "local.yaml"),
               "--out", str(tmp_path / "out"), "--key", str(key)])
    err = capsys.readouterr().err
    assert rc == 2 and f"chmod 600 {key}" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_the_development_key_is_created_private(tmp_path, monkeypatch):
    monkeypatch.setenv("KVGATE_HOME", str(tmp_path / "home"))
    from harness.report.signing import resolve_signing_key
    k = resolve_signing_key(None)
    assert os.stat(k.key_path).st_mode & 0o077 == 0


def test_an_ssh_identity_file_others_can_read_is_refused_before_connecting(tmp_path):
    from harness.transport.ssh import SSHTransport
    ident = tmp_path / "id_ed25519"
    ident.write_text("not even a key: the mode is checked first\n")
    os.chmod(ident, 0o644)
    with pytest.raises(TransportError) as e:
        SSHTransport("127.0.0.1", 1, "u", str(ident), known_hosts_path=str(tmp_path / "kh"), connect_timeout_s=1)
    assert f"chmod 600 {ident}" in str(e.value) and "cannot connect" not in str(e.value)


# ---------------------------------------------------------------------------------- the redaction itself


def test_a_known_value_is_found_in_its_json_and_url_encoded_forms(tmp_path):
    from harness.redact import add_secret_value, scrub_tree
    value = 'kv"pa\\ss wörd/' + secrets.token_hex(6)
    add_secret_value(value)
    run = tmp_path / "run"
    run.mkdir()
    from urllib.parse import quote
    (run / "a.json").write_text(json.dumps({"msg": f"x {value} y"}))
    (run / "b.json").write_text(json.dumps({"msg": f"x {value} y"}, ensure_ascii=False))
    (run / "c.log").write_text(f"GET /v1?key={quote(value, safe='')}\n")
    (run / "d.bin").write_bytes(b"\x00\xff" + value.encode() + b"\x00")
    outside = tmp_path / "outside.txt"
    outside.write_text(value)
    (run / "link").symlink_to(outside)  # a link is not followed: what it points at is not kvgate's
    changed = scrub_tree(run)
    assert sorted(changed) == ["a.json", "b.json", "c.log", "d.bin"]
    assert json.loads((run / "a.json").read_text()) == {"msg": "x REDACTED y"}  # still valid JSON
    assert json.loads((run / "b.json").read_text()) == {"msg": "x REDACTED y"}
    assert files_with(run, value, quote(value, safe="")) == [] and outside.read_text() == value


@pytest.mark.parametrize("move", [True, False])
def test_the_bundle_signs_its_files_as_scrubbed_in_the_pass_that_hashes_them(tmp_path, move):
    """A value learnt after the files holding it were written (an engine's log, a late error): the bundle writer's
    one pass redacts each file, in the run directory too, and signs the redacted bytes, which verify."""
    import hashlib
    from harness.redact import add_secret_value, scrub_read
    from harness.report.bundle import verify_content, write_bundle
    value = canary()
    run = tmp_path / "run"
    (run / "steps" / "001-n1-x").mkdir(parents=True)
    (run / "steps" / "001-n1-x" / "stdout").write_text(f"token {value} end\n")
    (run / "steps" / "001-n1-x" / "rc").write_text("0\n")
    (run / "log.jsonl").write_text(json.dumps({"msg": value}) + "\n")
    (run / "steps" / "001-n1-x" / "stdout").chmod(0o640)
    add_secret_value(value)
    key, _ = generate_keypair(tmp_path / "k")
    info = write_bundle(run, tmp_path / "out", load_private_key(key), {"suite": {"name": "t"}}, make_tar=False,
                        move=move, scrub=scrub_read)
    assert files_with(tmp_path, value) == []  # the bundle and, when copied, the run directory left behind
    out = info.path / "steps" / "001-n1-x" / "stdout"
    assert out.read_text() == "token REDACTED end\n"
    in_place = out if move else run / "steps" / "001-n1-x" / "stdout"  # redacted where it lay: its mode kept
    assert in_place.read_text() == "token REDACTED end\n" and (in_place.stat().st_mode & 0o777) == 0o640
    assert (info.path / "steps" / "001-n1-x" / "rc").read_text() == "0\n"  # a file without a secret: as it was
    checked = verify_content(info.path)
    assert checked.ok, checked.error
    signed = {s["name"]: s["digest"]["sha256"] for s in checked.statement["subject"]}
    assert signed["steps/001-n1-x/stdout"] == hashlib.sha256(out.read_bytes()).hexdigest()


def test_redaction_keeps_measurements_and_is_idempotent():
    from harness.redact import MARK, add_secret_value, redact_text
    add_secret_value("12345678")  # digits only: would match byte counts
    add_secret_value("short")     # under 8 characters: would match words
    text = "read 123456789 bytes in short time from http://u:p4ss@h:80/x"
    once = redact_text(text)
    assert once == f"read 123456789 bytes in short time from http://{MARK}@h:80/x"
    assert redact_text(once) == once
