"""kvgate cosign / verify --pubkey ... --keyring / report --keyring / library build|check as a user runs
them, on bundles of real local G1 runs (real fio) and a real kvgate cost bundle that cites one of them.

The runs are ``python -m harness run``; every other command is a process forked from a server that imported
kvgate once (tests/kvgate_fork.py, checked against ``python -m`` in tests/e2e/test_bad_inputs.py)."""

import base64
import json
import shutil
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import yaml

from kvgate_cli import kvgate as kvgate_python_m
from kvgate_fork import WITH_CHARTS, ForkServer

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def payload(bundle_dir: Path) -> bytes:
    return base64.b64decode(json.loads((bundle_dir / "attestation.dsse.json").read_text())["payload"])


def keyring(path: Path, keys: Path, customer_extra: str = "") -> Path:
    path.write_text(f"""keys:
  - name: Acme QA
    role: vendor
    public_key_file: {keys}/vendor.pub
  - name: Example Bank
    role: customer
    public_key_file: {keys}/customer.pub
{customer_extra}""")
    return path


@pytest.fixture(scope="module")
def kvgate():
    """``kvgate ARGS`` (home=, env=) as tests/kvgate_cli.py runs it, each command forked from one server."""
    with ForkServer(WITH_CHARTS) as server:
        yield server.kvgate


@pytest.fixture(scope="module")
def world(tmp_path_factory, kvgate):
    """Two real G1 runs signed by the vendor key; the first co-signed by the customer; a cost bundle citing it."""
    tmp = tmp_path_factory.mktemp("evidence-cli")
    home = tmp / "home"
    keys = tmp / "keys"
    for who in ("vendor", "customer"):
        r = kvgate("keygen", "--out", keys / who, home=home)
        assert r.returncode == 0, r.stderr
    inv = tmp / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"nodes": [{
        "name": "localhost", "transport": "local", "work_dir": str(tmp / "work"), "read_streams": 2,
        "targets": [{"name": "scratch", "kind": "file", "path": "t.bin", "size": "64 MiB"}]}]}))
    gates = tmp / "gates.yaml"
    gates.write_text(yaml.safe_dump({"suite": {"name": "evidence-e2e", "version": 1}, "gates": [{
        "id": "G1", "title": "cold read", "workload": "fio-read",
        "params": {"target": "scratch", "bs": "256 KiB", "iodepth": 4, "runtime_s": 1, "ramp_s": 0},
        "metric": "per_gpu_read_gb_s", "pass": ">= 1 MB/s", "stop_loss": "< 0.01 MB/s"}]}, sort_keys=False))
    bundles = []
    for i in range(2):
        r = kvgate_python_m("run", "-i", inv, "-g", gates, "--out", tmp / "runs" / f"out{i}",
                            "--key", keys / "vendor.key", home=home)
        assert r.returncode == 0, r.stdout + r.stderr
        rid = next(l.split(": ")[1] for l in r.stdout.splitlines() if l.startswith("report ID: "))
        bundles.append(tmp / "runs" / f"out{i}" / rid)
    before = payload(bundles[0])
    cosign = kvgate("cosign", f"{bundles[0]}.tar.gz", "--key", keys / "customer.key", "--pubkey",
                    keys / "vendor.pub", home=home)
    shutil.copytree(ROOT / "workloads" / "models", tmp / "models")
    params = tmp / "params.yaml"
    params.write_text("".join(ln for ln in (ROOT / "workloads" / "cost-params.example.yaml").read_text()
                              .splitlines(keepends=True)  # measured in the bundle instead
                              if not ("per_gpu_read: 5.23 GB/s" in ln and not ln.lstrip().startswith("#"))))
    r = kvgate("cost", "--params", params, "--bundle", bundles[0], "--pubkey", keys / "vendor.pub",
               "--out", tmp / "runs" / "cost", "--key", keys / "vendor.key", home=home)
    assert r.returncode == 0, r.stdout + r.stderr
    cost = next(p for p in (tmp / "runs" / "cost").iterdir() if p.is_dir() and p.name.startswith("KVG-"))
    return {"tmp": tmp, "home": home, "keys": keys, "bundles": bundles, "cost": cost, "cosign": cosign,
            "payload_before": before, "ring": keyring(tmp / "keyring.yaml", keys)}


def test_cosign_keeps_the_report_id_and_every_subject(world):
    b0 = world["bundles"][0]
    c = world["cosign"]
    assert c.returncode == 0, c.stdout + c.stderr
    assert c.stdout.startswith(f"cosigned {b0.name}: signature by SHA256:")
    assert f"updated {b0} and {b0}.tar.gz" in c.stdout
    assert payload(b0) == world["payload_before"]
    assert (b0 / "REPORT_ID").read_text().strip() == b0.name


def test_verify_passes_only_when_every_named_key_signed(world, kvgate):
    b0, b1 = world["bundles"]
    keys, home = world["keys"], world["home"]
    for b in (b0, f"{b0}.tar.gz"):
        r = kvgate("verify", b, "--pubkey", keys / "vendor.pub", "--pubkey", keys / "customer.pub", home=home)
        assert r.returncode == 0 and r.stdout.startswith(f"OK {b0.name}: signed by "), r.stdout + r.stderr
    r = kvgate("verify", b1, "--pubkey", keys / "vendor.pub", "--pubkey", keys / "customer.pub", home=home)
    assert r.returncode == 1 and r.stdout.startswith("FAILED: no accepted signature by customer.pub"), r.stdout
    r = kvgate("verify", b1, "--pubkey", keys / "vendor.pub", home=home)
    assert r.returncode == 0, r.stdout


def test_verify_with_a_keyring_names_signers_and_roles(world, kvgate):
    b0 = world["bundles"][0]
    r = kvgate("verify", f"{b0}.tar.gz", "--keyring", world["ring"], home=world["home"])
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [l for l in r.stdout.splitlines() if l.startswith("  signature: ")]
    assert len(lines) == 2
    assert lines[0].startswith("  signature: Acme QA (vendor) SHA256:") and ": ACCEPTED, signed " in lines[0]
    assert "(signing record)" in lines[0]  # the original signature is dated by its own record too
    assert lines[1].startswith("  signature: Example Bank (customer) SHA256:") and "(signing record)" in lines[1]
    r = kvgate("verify", b0, "--keyring", world["ring"], "--require-role", "lab", home=world["home"])
    assert r.returncode == 1 and "no accepted signature by a key in role lab" in r.stdout


def test_a_signature_after_the_keys_revocation_is_refused(world, kvgate):
    b0 = world["bundles"][0]
    created = datetime.strptime(json.loads(payload(b0))["predicate"]["created_utc"], "%Y-%m-%dT%H:%M:%SZ")
    revoked_before = keyring(world["tmp"] / "revoked.yaml", world["keys"],
                             f"    revoked: {created.date().isoformat()}\n    revocation_reason: key lost\n")
    r = kvgate("verify", b0, "--keyring", revoked_before, home=world["home"])
    assert r.returncode == 1, r.stdout
    assert r.stdout.startswith("FAILED: signature by Example Bank (customer) SHA256:")
    assert "after the key's revocation at" in r.stdout and "(key lost)" in r.stdout
    assert "Acme QA (vendor)" in r.stdout and ": ACCEPTED" in r.stdout
    revoked_later = keyring(world["tmp"] / "revoked-later.yaml", world["keys"],
                            f"    revoked: {(created + timedelta(days=30)).date().isoformat()}\n")
    r = kvgate("verify", b0, "--keyring", revoked_later, home=world["home"])
    assert r.returncode == 0, r.stdout


def test_report_shows_the_signers(world, kvgate):
    b0 = world["bundles"][0]
    assert "Signed when the bundle was written, by the operator key" in (b0 / "report.md").read_text()
    out = world["tmp"] / "rerendered"
    r = kvgate("report", f"{b0}.tar.gz", "--keyring", world["ring"], "--out", out, home=world["home"])
    assert r.returncode == 0, r.stdout + r.stderr
    md = (out / "report.md").read_text()
    assert "| Acme QA | vendor |" in md and "| Example Bank | customer |" in md
    html = (out / "report.html").read_text()
    assert 'id="signer-table"' in html and "Example Bank" in html


def test_library_build_and_check(world, kvgate):
    tmp, home = world["tmp"], world["home"]
    b0, b1 = world["bundles"]
    site = tmp / "site"
    r = kvgate("library", "build", tmp / "runs", "--out", site, "--keyring", world["ring"], home=home)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 bundles, 3 verified" in r.stdout
    es = {e["report_id"]: e for e in json.loads((site / "library.json").read_text())["bundles"]}
    assert set(es) == {b0.name, b1.name, world["cost"].name}
    assert es[world["cost"].name]["cites"] == [b0.name] and es[b0.name]["cited_by"] == [world["cost"].name]
    assert [s["name"] for s in es[b0.name]["signers"]] == ["Acme QA", "Example Bank"]
    assert es[b1.name]["gates"][0]["gate_id"] == "G1" and es[b1.name]["overall"] == "PASS"
    r = kvgate("library", "check", site, "--keyring", world["ring"], home=home)
    assert r.returncode == 0 and r.stdout.startswith(f"OK {site}: 3 bundles re-verified"), r.stdout + r.stderr
    (site / "reports" / b1.name / "report.md").write_text("# PASS\n")
    r = kvgate("library", "check", site, "--keyring", world["ring"], home=home)
    assert r.returncode == 1 and f"MISMATCH reports/{b1.name}/: differs from what kvgate makes of" in r.stdout


def one_line_error(r) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stdout + r.stderr
    return lines[0]


def test_bad_input_is_one_line_and_writes_nothing(world, tmp_path, kvgate):
    home, keys, b0 = world["home"], world["keys"], world["bundles"][0]
    bad_ring = tmp_path / "ring.yaml"
    bad_ring.write_text(f"keys:\n  - name: X\n    role: auditor\n    public_key_file: {keys}/vendor.pub\n")
    r = kvgate("verify", b0, "--keyring", bad_ring, home=home)
    assert r.returncode == 2
    assert r.stderr.splitlines()[0] == (f"{bad_ring}:3: keys[0].role: unknown role 'auditor' "
                                        "(expected one of: vendor, customer, lab)")
    site = tmp_path / "site"
    malformed = tmp_path / "malformed.yaml"
    malformed.write_text("keys:\n  - name: X\n    role: lab\n    public_key: |\n      not a key\n")
    r = kvgate("library", "build", world["tmp"] / "runs", "--out", site, "--keyring", malformed, home=home)
    assert r.returncode == 2 and r.stderr.splitlines()[0] == (
        f"{malformed}:4: keys[0].public_key: not a PEM public key (expected a -----BEGIN PUBLIC KEY----- block)")
    src = tmp_path / "src"
    (src / "KVG-20260101-0badc0de").mkdir(parents=True)
    r = kvgate("library", "build", src, "--out", site, "--keyring", world["ring"], home=home)
    assert one_line_error(r) == f"error: {src}/KVG-20260101-0badc0de: not a bundle: no attestation.dsse.json"
    shutil.rmtree(src / "KVG-20260101-0badc0de")
    shutil.copytree(b0, src / "a" / b0.name)
    shutil.copytree(b0, src / "b" / b0.name)
    (src / "b" / b0.name / "report.md").write_text("edited\n")
    r = kvgate("library", "build", src, "--out", site, "--keyring", world["ring"], home=home)
    assert one_line_error(r).startswith(f"error: {b0.name}: two bundles with the same ID and different content: ")
    assert not site.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    r = kvgate("cosign", b0, "--key", keys / "customer.pub", home=home)
    assert one_line_error(r).startswith(f"error: {keys}/customer.pub: not a readable unencrypted PEM private key")


def test_refusals_exit_through_the_one_exit_code_map(world, tmp_path, kvgate):
    """A bundle that does not verify is not cosigned (1, a negative answer); a usage error is 2."""
    home, keys, b1 = world["home"], world["keys"], world["bundles"][1]
    copy = Path(shutil.copytree(b1, tmp_path / b1.name))
    (copy / "verdicts.json").write_text("{}")
    r = kvgate("cosign", copy, "--key", keys / "customer.key", "--pubkey", keys / "vendor.pub", home=home)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.startswith(f"FAILED: {b1.name}: not cosigned: "), r.stdout
    assert "verdicts.json: sha256 does not match the signed statement" in r.stdout
    assert "Traceback" not in r.stderr
    assert sorted(p.name for p in (copy / "signatures").iterdir()) == sorted(p.name for p in (b1 / "signatures").iterdir())
    r = kvgate("verify", b1, "--pubkey", keys / "vendor.pub", "--require-role", "vendor", home=home)
    assert one_line_error(r) == "error: --require-role needs --keyring (roles come from a keyring)"
    r = kvgate("verify", b1, home=home)
    assert one_line_error(r) == "error: give --pubkey SIGNER.pub (repeatable) or --keyring KEYRING.yaml"
