"""The README's default suite run exactly as its table gives it: `kvgate run -i inventory/localhost.yaml -g
gates/local.yaml`, the shipped files unchanged (tests/kvgate_cli.py's readme_run: a private /var/tmp is the one
difference), ending PASS or FAIL on this machine's disk with a verified bundle, never an error."""

import json

import pytest

from kvgate_cli import kvgate, readme_run

pytestmark = pytest.mark.integration


def test_local_suite_runs_as_shipped_and_its_bundle_verifies(tmp_path):
    r, bundle, work = readme_run("local.yaml", "localhost.yaml", tmp_path, timeout=600)
    assert r.returncode in (0, 1, 4), r.stdout[-2000:] + r.stderr[-2000:]
    verdicts = json.loads((bundle / "verdicts.json").read_text())["verdicts"]
    assert verdicts and all(v["outcome"] in ("PASS", "FAIL", "STOP") for v in verdicts), verdicts
    assert (work / "kvgate-g1-target.bin").stat().st_size == 1 << 30   # the inventory's target, in the test's /var/tmp
    v = kvgate("verify", bundle, "--pubkey", tmp_path / "home" / "dev-signing.pub", home=tmp_path / "home")
    assert v.returncode == 0 and v.stdout.startswith("OK "), v.stdout + v.stderr
