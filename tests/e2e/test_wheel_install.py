"""kvgate as a user installs it: a wheel (not an editable checkout) in a fresh venv, run from another
directory. The wheel must carry its data (suites, inventories, engine profiles, report templates) and its
node programs; the engine runs from an interpreter that has torch and LMCache, given as the gate's
``python`` param, as a user with kvgate in one venv and the engine stack in another would do."""

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
# The engine's interpreter: the one running the tests has the cpu-engine extra (scripts/setup.sh --test).
ENGINE_PYTHON = os.environ.get("KVGATE_ENGINE_PYTHON", sys.executable)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A plain venv (no system site packages) with the kvgate wheel and its dependencies from the index."""
    tmp = tmp_path_factory.mktemp("wheel")
    # Built from a copy of the source tree (what git tracks), so the build leaves nothing in the checkout.
    src = tmp / "src"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for rel in filter(None, tracked.decode().split("\0")):
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(src), "-w", str(tmp / "dist")],
                   check=True, capture_output=True, text=True, timeout=600)
    wheel = next((tmp / "dist").glob("kvgate-*.whl"))
    # pip installs into the venv from outside it (--python): the venv gets exactly what `venv/bin/pip install`
    # would put there, without the seconds ensurepip takes to seed a pip kvgate never uses; nor are .pyc files
    # compiled ahead (the interpreter compiles what it imports)
    venv.EnvBuilder(with_pip=False, system_site_packages=False).create(tmp / "venv")
    py = tmp / "venv" / "bin" / "python"
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-compile",
                        str(wheel)], capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["KVGATE_HOME"] = str(tmp / "home")
    return tmp, tmp / "venv" / "bin" / "kvgate", py, elsewhere, env


def kvgate(installed, *args, timeout=1800):
    _, exe, _, cwd, env = installed
    return subprocess.run([str(exe), *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_the_wheel_is_kvgate_with_its_own_data_not_the_checkout(installed):
    _, _, py, cwd, env = installed
    r = subprocess.run([str(py), "-c", "import harness, harness.paths as p; print(harness.__file__); "
                        "print(p.data_root()); print(p.data_path('gates', 'local.yaml').is_file())"],
                       cwd=cwd, env=env, capture_output=True, text=True, check=True)
    module, data_root, found = r.stdout.split()
    assert str(ROOT) not in module and "site-packages" in module
    assert data_root.endswith("harness/_data") and found == "True"
    # the real traces it ships, found by name from any directory (gates name them as traces/<file>)
    r = kvgate(installed, "trace", "stats", "traces/mooncake-conversation-3000.jsonl")
    assert r.returncode == 0 and "mooncake trace, 3000 requests" in r.stdout, r.stdout + r.stderr
    # torch and LMCache are not needed by kvgate itself
    r = subprocess.run([str(py), "-c", "import torch"], cwd=cwd, env=env, capture_output=True, text=True)
    assert r.returncode != 0


def test_default_suite_runs_from_the_wheel(installed):
    tmp = installed[0]
    r = kvgate(installed, "run", "--out", tmp / "out-default")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "no suite given: running the default gates/local.yaml" in r.stderr
    report_id = next(line.split(": ")[1] for line in r.stdout.splitlines() if line.startswith("report ID: "))
    pub = tmp / "home" / "dev-signing.pub"
    v = kvgate(installed, "verify", tmp / "out-default" / report_id, "--pubkey", pub)
    assert v.returncode == 0 and v.stdout.startswith(f"OK {report_id}"), v.stdout
    assert (tmp / "out-default" / report_id / "report.html").read_text().count(report_id) >= 1


def test_g2_cpu_reference_suite_runs_from_the_wheel_with_the_engine_in_another_interpreter(installed):
    tmp, _, py, cwd, env = installed
    shipped = subprocess.run([str(py), "-c", "from harness.paths import data_path; "
                              "print(data_path('gates', 'g2-cpu-reference.yaml'))"],
                             cwd=cwd, env=env, capture_output=True, text=True, check=True).stdout.strip()
    suite = yaml.safe_load(Path(shipped).read_text())
    for gate in suite["gates"]:
        gate["params"]["python"] = ENGINE_PYTHON
    # What the gates prove is test_g2_cpu_reference.py's and test_g2_multiturn_gain.py's; here the shipped suite
    # runs from the wheel with less load: one prompt for G2, and 3 sessions (still more than the engine's KV
    # memory holds) of 2 turns for G2-multiturn
    g2, multiturn = suite["gates"]
    g2["params"]["prompts_per_length"] = 1
    multiturn["params"]["load"]["multi_turn"].update(sessions=3, turns=2)
    gates = cwd / "g2.yaml"
    gates.write_text(yaml.safe_dump(suite, sort_keys=False))
    inv = cwd / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"nodes": [{"name": "localhost", "transport": "local",
                                              "work_dir": str(tmp / "work")}]}))
    r = kvgate(installed, "run", "-i", inv.name, "-g", gates.name, "--out", tmp / "out-g2")
    # G2 must PASS; the informational multi-turn gate never decides the run
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    report_id = next(line.split(": ")[1] for line in r.stdout.splitlines() if line.startswith("report ID: "))
    verdicts = json.loads((tmp / "out-g2" / report_id / "verdicts.json").read_text())["verdicts"]
    assert [(v["gate_id"], v["outcome"]) for v in verdicts] == [("G2", "PASS"), ("G2-multiturn", "INFO")]
    # the engine ran the program kvgate put on the node, with the interpreter the gate named
    spawn = json.loads(next((tmp / "out-g2" / report_id / "steps").glob("*-spawn-cpu-reference/argv.json"))
                       .read_text())
    assert spawn["argv"][0] == ENGINE_PYTHON and spawn["argv"][1].endswith("/cpu_reference.py")
