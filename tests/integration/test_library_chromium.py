"""The evidence library's index.html in a real headless Chromium (chromedriver, as the report test drives it):
loads from file:// with no console errors and nothing fetched from elsewhere, every filter narrows the
rows as documented, every link resolves (report pages load, archives exist, anchors exist)."""

import base64
from datetime import timedelta
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from evidence_fixture import acceptance_bundle, cost_bundle, created_of
from harness.report.bundle import generate_keypair, load_private_key
from harness.report.cosign import cosign_bundle
from harness.report.keyring import load_keyring
from harness.report.library import build_library
from test_report_html_chromium import Browser, severe

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("library-chromium")
    keys = {n: generate_keypair(tmp / "keys" / n) for n in ("vendor", "customer")}
    ring = tmp / "keyring.yaml"
    ring.write_text("keys:\n  - name: Acme QA\n    role: vendor\n    public_key_file: keys/vendor.pub\n"
                    "  - name: Example Bank\n    role: customer\n    public_key_file: keys/customer.pub\n")
    runs = tmp / "runs"
    fx = [acceptance_bundle(tmp, runs, keys["vendor"][0], t, suite="fx100", g1_gb_s=g)
          for t, g in (("2026-03-01T10:00:00Z", 5.5), ("2026-04-01T10:00:00Z", 4.0), ("2026-05-01T10:00:00Z", 6.0))]
    cosign_bundle(fx[1].path, load_private_key(keys["customer"][0]), now=created_of(fx[1].path) + timedelta(days=1))
    lb = acceptance_bundle(tmp, runs, keys["vendor"][0], "2026-04-15T08:00:00Z", suite="loopback", g1_gb_s=2.0)
    cost = cost_bundle(tmp, runs, keys["vendor"][0], "2026-05-02T09:00:00Z", [fx[0].report_id, fx[1].report_id])
    bad = acceptance_bundle(tmp, runs, keys["vendor"][0], "2026-06-01T00:00:00Z", suite="fx100", g1_gb_s=7.0,
                            make_tar=False)
    (bad.path / "report.md").write_text("edited\n")
    build_library([runs], tmp / "site", list(load_keyring(ring).entries))
    return {"dir": tmp / "site", "fx": fx, "lb": lb, "cost": cost, "bad": bad}


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    b = Browser(tmp_path_factory.mktemp("chromium-profile"))
    yield b
    b.close()


def visible(browser) -> list[str]:
    return browser.js("return Array.from(document.querySelectorAll('#library-table tbody tr.bundle'))"
                      ".filter(r => !r.hidden && r.offsetParent !== null).map(r => r.dataset.reportId)")


def choose(browser, **values) -> None:
    """Set filter controls as a person would (value + change event); unnamed ones back to 'all'."""
    for fid in ("f-suite", "f-gate", "f-outcome", "f-signer", "f-from", "f-to"):
        v = values.get(fid.replace("f-", ""), "")
        browser.js(f"const e = document.getElementById('{fid}'); e.value = {v!r};"
                   "e.dispatchEvent(new Event('change', {bubbles: true}));")


def test_index_loads_clean_with_nothing_remote(browser, site):
    browser.log()
    browser.open(site["dir"] / "index.html")
    assert browser.js("return document.readyState") == "complete"
    assert severe(browser.log()) == []
    resources = browser.js("return performance.getEntriesByType('resource').map(e => e.name)")
    assert all(r.startswith("file://") for r in resources), resources
    remote = browser.js("return Array.from(document.querySelectorAll('[src],[href],link,script[src],img,iframe'))"
                        ".map(e => e.getAttribute('src') || e.getAttribute('href') || '')"
                        ".filter(u => /^([a-z]+:)?\\/\\//i.test(u))")
    assert remote == []
    assert browser.js("return document.getElementById('n-bundles').innerText") == "6"
    assert site["bad"].report_id in browser.js("return document.getElementById('failed-banner').innerText")
    row = browser.js(f"return document.getElementById('row-{site['bad'].report_id}').innerText")
    assert "FAILED: report.md: sha256 does not match the signed statement" in row
    charts = browser.js("return Array.from(document.querySelectorAll('figure.trend')).map(f => {"
                        "const r = f.querySelector('svg').getBoundingClientRect(); return [f.id, r.width, r.height]; })")
    assert [c[0] for c in charts] == ["trend-fx100-G1", "trend-fx100-G2", "trend-fx100-G3", "trend-loopback-G1",
                                      "trend-loopback-G2", "trend-loopback-G3"]
    assert all(w > 200 and h > 100 for _, w, h in charts), charts
    height = browser.js("return document.documentElement.scrollHeight")
    browser.cmd("POST", "/window/rect", {"width": 1400, "height": min(int(height) + 100, 8000)})
    png = base64.b64decode(browser.cmd("GET", "/screenshot"))
    (site["dir"].parent / "library.png").write_bytes(png)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_filters(browser, site):
    fx, lb, cost, bad = site["fx"], site["lb"], site["cost"], site["bad"]
    browser.open(site["dir"] / "index.html")
    everything = {b.report_id for b in fx + [lb, cost, bad]}
    assert set(visible(browser)) == everything
    choose(browser, suite="fx100")
    assert set(visible(browser)) == {b.report_id for b in fx}
    choose(browser, suite="loopback")
    assert visible(browser) == [lb.report_id]
    choose(browser, outcome="PASS")
    assert set(visible(browser)) == {fx[0].report_id, fx[2].report_id}
    choose(browser, outcome="NOT VERIFIED")
    assert visible(browser) == [bad.report_id]
    choose(browser, gate="G1", outcome="STOP")  # the gate's own outcome
    assert visible(browser) == [lb.report_id]
    choose(browser, gate="G2", outcome="PASS")
    assert set(visible(browser)) == {fx[0].report_id, fx[1].report_id, fx[2].report_id, lb.report_id}
    choose(browser, signer="Example Bank")
    assert visible(browser) == [fx[1].report_id]
    choose(browser, signer="Acme QA")
    assert set(visible(browser)) == everything - {bad.report_id}
    choose(browser, **{"from": "2026-04-01", "to": "2026-04-30"})
    assert set(visible(browser)) == {fx[1].report_id, lb.report_id}
    assert browser.js("return document.getElementById('shown-count').innerText") == "2"
    choose(browser)
    assert set(visible(browser)) == everything
    assert severe(browser.log()) == []


def test_every_link_resolves(browser, site):
    index = site["dir"] / "index.html"
    browser.open(index)
    links = browser.js("return Array.from(document.querySelectorAll('a[href]')).map(a => [a.className, "
                       "a.getAttribute('href'), a.href])")
    assert links
    kinds = {c for c, _, _ in links}
    assert {"report-link", "archive-link", "cites-link", "cited-by-link"} <= kinds
    for cls, raw, url in links:
        if raw.startswith("#"):
            assert browser.js(f"return document.getElementById({raw[1:]!r}) !== null"), raw
            continue
        target = Path(unquote(urlparse(url).path))
        assert target.is_file(), (cls, raw)
    reports = [(raw, url) for cls, raw, url in links if cls == "report-link"]
    assert len(reports) == 5  # every verified bundle, not the failed one
    browser.log()
    for raw, url in reports:
        rid = raw.split("/")[1]
        browser.cmd("POST", "/url", {"url": url})
        assert rid in browser.js("return document.title"), raw
        assert severe(browser.log()) == [], raw
    # following a cost bundle's citation lands on the cited report's row
    browser.open(index)
    browser.js(f"document.querySelector('#row-{site['cost'].report_id} a.cites-link').click()")
    assert browser.js("return location.hash") == f"#row-{site['fx'][0].report_id}"
