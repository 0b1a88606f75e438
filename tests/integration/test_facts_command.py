"""The one facts command on real nodes (this machine, and through a real sshd): each fact's section holds
exactly what that fact's command prints when run alone, a fact past its own limit is stopped while the
others still run, and stopping the facts command stops whatever fact is running."""

import subprocess
import uuid

import pytest
from polling import wait_no_process

from harness.execute.facts import FACTS, Fact, collect_node_facts, facts_argv, section_result
from harness.parsers.facts import parse_fact_sections
from harness.transport import LocalTransport, SSHTransport
from harness.transport.steps import StepLog

pytestmark = pytest.mark.integration

VOLATILE = {"meminfo"}  # free memory changes between two reads


@pytest.fixture(params=["local", "ssh"])
def transport(request, sshd):
    if request.param == "local":
        t = LocalTransport("n1")
    else:
        t = SSHTransport("127.0.0.1", sshd.port, sshd.user, str(sshd.client_key),
                         known_hosts_path=str(sshd.known_hosts), name="n1")
    yield t
    t.close()


def test_every_section_is_what_its_command_prints_alone(transport, tmp_path):
    whole = transport.run(facts_argv(FACTS), timeout_s=120)
    assert whole.ok, whole.summary()
    sections = parse_fact_sections(whole.stdout, whole.stderr)
    assert list(sections) == [f.key for f in FACTS]
    for fact in FACTS:
        alone = transport.run(fact.argv, timeout_s=60)
        s = sections[fact.key]
        assert s.complete, fact.key
        if alone.rc is None:  # the local backend could not spawn a missing tool; the shell says 127
            assert s.rc == 127, fact.key
            continue
        assert s.rc == alone.rc, fact.key
        if fact.key not in VOLATILE:
            assert s.stdout == alone.stdout, fact.key
    facts = collect_node_facts(transport, StepLog(tmp_path))
    assert facts["snapshot"]["errors"] == {} and facts["snapshot"]["kernel"].startswith("Linux")
    assert facts["snapshot"]["mem_total_bytes"] > 0 and facts["provenance"]["versions"]["python"]


def test_a_fact_past_its_own_limit_is_stopped_and_the_next_ones_still_run(transport):
    slow = Fact("slow", ("sleep", "30"), "snapshot", lambda t: {}, "a hung tool", timeout_s=1)
    facts = (slow, FACTS[0])
    whole = transport.run(facts_argv(facts), timeout_s=60)
    assert whole.ok and whole.duration_s < 20, whole.summary()
    s = parse_fact_sections(whole.stdout, whole.stderr)
    r = section_result(slow, s["slow"], whole)
    assert r.timed_out and r.rc == 124
    assert section_result(FACTS[0], s["uname"], whole).stdout.startswith("Linux")


def test_stopping_the_facts_command_stops_the_running_fact(transport):
    tag = f"kvgate-facts-{uuid.uuid4().hex[:8]}"
    hung = Fact("hung", ("bash", "-c", f"exec -a {tag} sleep 300"), "snapshot", lambda t: {}, "hung", timeout_s=600)
    r = transport.run(facts_argv((FACTS[0], hung)), timeout_s=2)
    assert r.timed_out
    s = parse_fact_sections(r.stdout, r.stderr)
    assert s["uname"].complete and not s["hung"].complete  # what finished before the stop is kept
    wait_no_process(tag, timeout_s=30)
    assert subprocess.run(["pgrep", "-f", tag], capture_output=True).returncode == 1


def test_versions_are_what_importlib_metadata_reports(tmp_path):
    """The versions fact reads dist-info / egg-info itself (importing importlib.metadata costs every node
    ~35 ms of CPU); it must report what importlib.metadata.version() does, shadowing and all."""
    import json
    import sys

    from harness.execute.facts import VERSION_PACKAGES, VERSIONS_ARGV

    first, second = tmp_path / "first", tmp_path / "second"
    for d, name, meta, text in [
            (first, "vLLM-0.33.0.dist-info", "METADATA", "Metadata-Version: 2.1\nName: vLLM\nVersion: 0.33.0\n\nbody\n"),
            (second, "vllm-0.1.dist-info", "METADATA", "Name: vllm\nVersion: 0.1\n"),  # shadowed by first/
            (second, "LMCache-0.5.6.dist-info", "METADATA", "Name: LMCache\nVersion: 0.5.6\n"),
            (first, "torch.egg-info", "PKG-INFO", "Metadata-Version: 1.0\nName: torch\nVersion: 2.13.0+cpu\n")]:
        (d / name).mkdir(parents=True)
        (d / name / meta).write_text(text)
    env = {"PYTHONPATH": f"{first}:{second}", "PATH": "/usr/bin:/bin"}
    ours = subprocess.run([sys.executable, *VERSIONS_ARGV[1:]], env=env, capture_output=True, text=True, check=True)
    probe = ("import importlib.metadata as m, json, platform\nout = {'python': platform.python_version()}\n"
             f"for p in {list(VERSION_PACKAGES)!r}:\n"
             "    try:\n        out[p] = m.version(p)\n    except m.PackageNotFoundError:\n        out[p] = None\n"
             "print(json.dumps(out))")
    theirs = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    got = json.loads(ours.stdout)
    assert got == json.loads(theirs.stdout)
    assert (got["vllm"], got["lmcache"], got["torch"]) == ("0.33.0", "0.5.6", "2.13.0+cpu")


def test_nics_fact_reports_what_sysfs_holds():
    """The NICs fact reads sysfs with the shell's `read` (no process per value): each line must carry what
    the files hold, '-' where a value cannot be read (a link that is down has no speed)."""
    import os

    from harness.execute.facts import NICS_ARGV

    def value(path):
        try:
            with open(path) as f:
                return f.read().strip() or "-"
        except OSError:
            return "-"

    want = []
    for name in sorted(os.listdir("/sys/class/net")):
        i = f"/sys/class/net/{name}"
        drv = os.path.basename(os.readlink(f"{i}/device/driver")) if os.path.exists(f"{i}/device/driver") else ""
        want.append(f"{name} {value(i + '/speed')} {value(i + '/mtu')} {value(i + '/operstate')} {drv}")
    got = subprocess.run(list(NICS_ARGV), capture_output=True, text=True, check=True).stdout.splitlines()
    assert sorted(got) == sorted(want)
