"""kvgate library: every bundle found is verified and listed (failures with their reason), cost bundles and
the reports they cite link both ways, the published site re-verifies, and bad input writes nothing."""

import json
import re
import shutil
import tarfile
from datetime import timedelta

import pytest

from evidence_fixture import acceptance_bundle, cost_bundle, created_of
from harness.report.bundle import generate_keypair, load_private_key
from harness.report.cosign import cosign_bundle
from harness.errors import BundleError
from harness.report.keyring import KeyEntry, load_keyring
from harness.report.library import build_library, check_library, link_problems

MISSING = "KVG-20250101-" + "deadbeef" * 8


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    """Bundles in two trees: suite fx100 at three dates (the first co-signed by the customer), a loopback
    suite run (directory only), a cost bundle citing two fx100 runs and one report not in the library,
    and a bundle tampered after signing (its only copy)."""
    tmp = tmp_path_factory.mktemp("library")
    keys = {n: generate_keypair(tmp / "keys" / n) for n in ("vendor", "customer", "stranger")}
    ring = tmp / "keyring.yaml"
    ring.write_text("keys:\n  - name: Acme QA\n    role: vendor\n    public_key_file: keys/vendor.pub\n"
                    "  - name: Example Bank\n    role: customer\n    public_key_file: keys/customer.pub\n")
    runs1, runs2 = tmp / "runs1", tmp / "runs2" / "nested"
    fx = [acceptance_bundle(tmp, runs1, keys["vendor"][0], t, suite="fx100", g1_gb_s=g)
          for t, g in (("2026-03-01T10:00:00Z", 5.5), ("2026-04-01T10:00:00Z", 4.0), ("2026-05-01T10:00:00Z", 6.0))]
    cosign_bundle(fx[0].tar_path, load_private_key(keys["customer"][0]), now=created_of(fx[0].path) + timedelta(days=1))
    lb = acceptance_bundle(tmp, runs2, keys["vendor"][0], "2026-04-15T08:00:00Z", suite="loopback", g1_gb_s=2.0,
                           make_tar=False)
    cost = cost_bundle(tmp, runs2, keys["vendor"][0], "2026-05-02T09:00:00Z",
                       [fx[0].report_id, fx[2].report_id, MISSING])
    bad = acceptance_bundle(tmp, runs2, keys["vendor"][0], "2026-06-01T00:00:00Z", suite="fx100", g1_gb_s=7.0)
    bad.tar_path.unlink()
    (bad.path / "verdicts.json").write_text('{"overall": "PASS"}\n')
    trusted = list(load_keyring(ring).entries)
    site = tmp / "site"
    res = build_library([runs1, tmp / "runs2"], site, trusted, built_utc="2026-07-01T00:00:00Z")
    return {"tmp": tmp, "keys": keys, "ring": ring, "trusted": trusted, "fx": fx, "lb": lb, "cost": cost,
            "bad": bad, "site": site, "res": res}


def entries(site):
    return {e["report_id"]: e for e in json.loads((site / "library.json").read_text())["bundles"]}


def test_every_bundle_is_listed_and_verified(lib):
    fx, lb, cost, bad, site = lib["fx"], lib["lb"], lib["cost"], lib["bad"], lib["site"]
    es = entries(site)
    assert set(es) == {b.report_id for b in fx + [lb, cost, bad]}
    assert [e["report_id"] for e in lib["res"].entries][0] == bad.report_id  # failures first
    assert es[bad.report_id]["status"] == "failed"
    assert es[bad.report_id]["reason"] == "verdicts.json: sha256 does not match the signed statement"
    assert "gates" not in es[bad.report_id] and "overall" not in es[bad.report_id]  # no unverified figures
    first = es[fx[0].report_id]
    assert first["status"] == "verified" and first["suite"] == {"name": "fx100", "version": "1"}
    assert [(s["name"], s["role"], s["status"]) for s in first["signers"]] == [
        ("Acme QA", "vendor", "accepted"), ("Example Bank", "customer", "accepted")]
    assert [(g["gate_id"], g["outcome"], g["actual"]) for g in first["gates"]][0] == ("G1", "PASS", 5.5)
    assert es[fx[1].report_id]["overall"] == "FAIL" and es[lb.report_id]["overall"] == "STOP"
    assert es[cost.report_id]["kind"] == "cost"
    assert es[cost.report_id]["cites"] == sorted([fx[0].report_id, fx[2].report_id, MISSING])
    assert es[cost.report_id]["cost"]["net_usd_per_month"] == 1234.5
    assert es[fx[0].report_id]["cited_by"] == [cost.report_id] == es[fx[2].report_id]["cited_by"]
    assert es[fx[1].report_id]["cited_by"] == []
    # files: every bundle as an archive; verified ones unpacked too; the twin (dir + tar) is one bundle
    for rid, e in es.items():
        assert (site / "bundles" / f"{rid}.tar.gz").is_file()
        # only kvgate's own render of a verified acceptance bundle is published; no signed tree is unpacked
        assert not (site / "bundles" / rid).exists()
        assert (site / "reports" / rid / "report.html").is_file() == (e["status"] == "verified")
    assert sorted(lib["res"].sources[fx[0].report_id]) == sorted([str(fx[0].path), str(fx[0].tar_path)])
    assert not [p for p in site.parent.iterdir() if p.name.startswith(".")]


def test_the_index_page(lib):
    fx, cost, bad, site = lib["fx"], lib["cost"], lib["bad"], lib["site"]
    page = (site / "index.html").read_text()
    assert link_problems(site, page) == []
    # nothing fetched from elsewhere (SVG namespace URIs are names, never fetched)
    assert re.findall(r'(?:src|href|action)\s*=\s*["\']?(?:[a-z]+:)?//', page, re.I) == []
    assert re.findall(r"url\((?!#)", page) == [] and "@import" not in page
    assert f'id="row-{bad.report_id}"' in page and "FAILED: verdicts.json: sha256 does not match" in page
    assert 'id="failed-banner"' in page
    assert f'href="reports/{fx[0].report_id}/report.html"' in page
    assert f'/{bad.report_id}/report.html"' not in page
    assert f'class="cites-link" href="#row-{fx[0].report_id}"' in page
    assert f'class="cited-by-link" href="#row-{cost.report_id}"' in page
    assert f"{MISSING} (not here)" in page
    for t in ("trend-fx100-G1", "trend-fx100-G2", "trend-fx100-G3", "trend-loopback-G1"):
        assert f'id="{t}"' in page
    assert page.count('id="trend-point-') == 3 * 3 + 3  # fx100: 3 runs x 3 gates; loopback: 1 run x 3 gates


def test_check_passes_on_the_published_site(lib):
    res = check_library(lib["site"], lib["trusted"])
    assert res.ok, res.problems
    assert (res.n_bundles, res.n_failed_as_recorded) == (6, 1)
    assert check_library(lib["site"]).ok  # the site's own keyring.yaml


@pytest.fixture
def site_copy(lib, tmp_path):
    return shutil.copytree(lib["site"], tmp_path / "site")


def test_check_finds_a_tampered_bundle_page_or_file(lib, site_copy):
    fx = lib["fx"]
    rid = fx[1].report_id
    html = site_copy / "reports" / rid / "report.html"
    html.write_text(html.read_text().replace("FAIL", "PASS"))
    (site_copy / "bundles" / "stray.txt").write_text("x")
    (site_copy / "bundles" / f"{fx[2].report_id}.tar.gz").unlink()
    page = site_copy / "index.html"
    page.write_text(page.read_text().replace("Example Bank", "Example Bank Ltd", 1))
    res = check_library(site_copy, lib["trusted"])
    text = "\n".join(res.problems)
    assert not res.ok
    assert f"reports/{rid}/: differs from what kvgate makes of bundles/{rid}.tar.gz (report.html)" in text
    assert "bundles/stray.txt: not in library.json" in text
    assert f"bundles/{fx[2].report_id}.tar.gz: missing" in text
    assert "index.html: differs from the page re-rendered" in text


def test_check_against_another_keyring_reports_what_changed(lib, site_copy, tmp_path):
    created = created_of(lib["fx"][0].path)
    ring = tmp_path / "ring.yaml"
    ring.write_text(lib["ring"].read_text().replace("keys/", str(lib["tmp"] / "keys") + "/")
                    + f"    revoked: {created.date().isoformat()}\n")
    res = check_library(site_copy, list(load_keyring(ring).entries))
    assert not res.ok
    assert f"{lib['fx'][0].report_id}: recorded verified, now failed: signature by Example Bank (customer) " \
        in "\n".join(res.problems)


def test_rebuild_replaces_the_site(lib, tmp_path):
    site = tmp_path / "site"
    build_library([lib["fx"][1].path], site, lib["trusted"], built_utc="2026-07-01T00:00:00Z")
    assert set(entries(site)) == {lib["fx"][1].report_id}
    build_library([lib["fx"][2].tar_path], site, lib["trusted"], built_utc="2026-07-02T00:00:00Z")
    assert set(entries(site)) == {lib["fx"][2].report_id}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site"]


def no_site(parent, site):
    assert not site.exists()
    assert not [p for p in parent.iterdir() if p.name.startswith(".")]


def test_a_kvg_directory_that_is_not_a_bundle(lib, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(lib["fx"][1].path, src / lib["fx"][1].path.name)
    (src / "KVG-20260101-00000000").mkdir()
    (src / "KVG-20260101-00000000" / "report.md").write_text("hi")
    site = tmp_path / "out" / "site"
    with pytest.raises(BundleError, match=r"KVG-20260101-00000000: not a bundle: no attestation.dsse.json$"):
        build_library([src], site, lib["trusted"])
    no_site(site.parent, site)


def test_an_archive_that_is_not_a_bundle(lib, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "junk.txt").write_text("x")
    with tarfile.open(src / "KVG-20260101-00000001.tar.gz", "w:gz") as tf:
        tf.add(src / "junk.txt", arcname="junk.txt")
    site = tmp_path / "site"
    with pytest.raises(BundleError, match="KVG-20260101-00000001.tar.gz: archive must hold exactly one bundle"):
        build_library([src], site, lib["trusted"])
    no_site(tmp_path, site)


def test_two_bundles_with_the_same_id_and_different_content(lib, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(lib["fx"][1].path, a / lib["fx"][1].path.name)
    shutil.copytree(lib["fx"][1].path, b / lib["fx"][1].path.name)
    (b / lib["fx"][1].path.name / "report.md").write_text("changed\n")
    site = tmp_path / "site"
    with pytest.raises(BundleError, match=rf"^{lib['fx'][1].report_id}: two bundles with the same ID and different "
                                          r"content: .* \(report.md differs\)$"):
        build_library([a, b], site, lib["trusted"])
    no_site(tmp_path, site)


def test_a_directory_without_bundles_and_a_foreign_site(lib, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(BundleError, match="empty: no bundle found"):
        build_library([tmp_path / "empty"], tmp_path / "site", lib["trusted"])
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "index.html").write_text("mine")
    with pytest.raises(BundleError, match="exists and is not a kvgate library; refusing to replace it"):
        build_library([lib["fx"][1].path], foreign, lib["trusted"])
    assert (foreign / "index.html").read_text() == "mine"


def test_a_site_is_not_a_bundle_directory_but_its_bundles_are(lib, tmp_path):
    with pytest.raises(BundleError, match="is a kvgate library site, not a directory of bundles"):
        build_library([lib["site"]], tmp_path / "site", lib["trusted"])
    res = build_library([lib["site"] / "bundles"], tmp_path / "site", lib["trusted"],
                        built_utc="2026-07-01T00:00:00Z")
    assert (tmp_path / "site" / "library.json").read_bytes() == (lib["site"] / "library.json").read_bytes()
    assert len(res.entries) == 6


def test_a_bundle_signed_by_a_stranger_is_listed_as_failed(lib, tmp_path):
    other = acceptance_bundle(tmp_path, tmp_path / "runs", lib["keys"]["stranger"][0], "2026-02-01T00:00:00Z")
    res = build_library([other.path], tmp_path / "site", lib["trusted"])
    (e,) = res.entries
    assert e["status"] == "failed" and e["reason"] == "no signature by a key you trust"
    assert [s["status"] for s in e["signers"]] == ["untrusted"]  # valid, its key known from its signing record


def test_pubkeys_without_roles_are_trusted_too(lib, tmp_path):
    v = KeyEntry(name="vendor.pub", public_key=lib["keys"]["vendor"][1].read_text())
    res = build_library([lib["fx"][0].path], tmp_path / "site", [v])
    assert [(s["name"], s["role"], s["status"]) for s in res.entries[0]["signers"]] == [
        ("vendor.pub", None, "accepted"), (None, None, "untrusted")]
    assert check_library(tmp_path / "site").ok
