"""The HTML report in a real headless Chromium, driven through chromedriver's W3C WebDriver HTTP API (httpx).

Why chromedriver and not `chromium --dump-dom`: --dump-dom shows the DOM but not the console, and the check
that matters is "loads with no console errors"; chromedriver returns the browser log (SEVERE entries are
console errors, failed loads and blocked requests), runs DOM queries and takes the screenshot, all over
plain HTTP with nothing to download. Debian packages: chromium, chromium-driver.
"""

import base64
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from polling import wait_until

from harness.report.render import render_bundle_reports
from report_fixture import FIXED_ID, fixed_run

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Browser:
    """One chromedriver process (own process group) and one headless Chromium session."""

    def __init__(self, user_data_dir: Path):
        if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
            pytest.fail("chromium and chromedriver are required: apt-get install chromium chromium-driver")
        self.port = _free_port()
        self.proc = subprocess.Popen([CHROMEDRIVER, f"--port={self.port}", "--allowed-ips=127.0.0.1"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=60)
        self.sid = None
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromedriver exited with {self.proc.returncode}")
            try:
                if self.http.get("/status").json()["value"]["ready"]:
                    break
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("chromedriver did not become ready in 30 s")
            time.sleep(0.1)
        caps = {"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:loggingPrefs": {"browser": "ALL"},
            "goog:chromeOptions": {"binary": CHROMIUM, "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                f"--user-data-dir={user_data_dir}", "--window-size=1280,2000"]}}}}
        r = self.http.post("/session", json=caps)
        assert r.status_code == 200, r.text
        self.sid = r.json()["value"]["sessionId"]

    def cmd(self, method: str, path: str, body=None):
        r = self.http.request(method, f"/session/{self.sid}{path}", json=body)
        assert r.status_code == 200, f"{method} {path}: {r.status_code} {r.text[:500]}"
        return r.json()["value"]

    def open(self, path: Path) -> None:
        self.cmd("POST", "/url", {"url": path.resolve().as_uri()})

    def js(self, script: str):
        return self.cmd("POST", "/execute/sync", {"script": script, "args": []})

    def log(self) -> list[dict]:
        return self.cmd("POST", "/se/log", {"type": "browser"})

    def close(self) -> None:
        try:
            if self.sid:
                self.http.delete(f"/session/{self.sid}")
        finally:
            self.http.close()
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    b = Browser(tmp_path_factory.mktemp("chromium-profile"))
    yield b
    b.close()


def severe(entries: list[dict]) -> list[dict]:
    return [e for e in entries if e.get("level") == "SEVERE"]


def test_console_errors_are_detected(browser, tmp_path):
    """The check below can fail: a page with a console error and a missing resource is caught."""
    page = tmp_path / "bad.html"
    page.write_text('<!DOCTYPE html><html><body><img src="missing.png">'
                    '<script>console.error("deliberate")</script></body></html>')
    browser.log()  # drain
    browser.open(page)
    seen: list[dict] = []

    def both_logged() -> bool:  # the missing image is reported asynchronously
        seen.extend(severe(browser.log()))
        msgs = " ".join(e["message"] for e in seen)
        return "deliberate" in msgs and "missing.png" in msgs
    wait_until(both_logged, 60, "the console error and the missing image in the browser log")


def test_report_html_loads_clean_with_table_and_charts(browser, tmp_path):
    run, pred = fixed_run(tmp_path)
    render_bundle_reports(FIXED_ID, run, pred)
    browser.log()  # drain what earlier pages logged
    browser.open(run / "report.html")
    assert browser.js("return document.readyState") == "complete"
    assert FIXED_ID in browser.js("return document.title")
    errors = severe(browser.log())
    assert errors == [], errors
    rows = browser.js("return Array.from(document.querySelectorAll('#verdict-table tbody tr'))"
                      ".map(r => Array.from(r.cells).map(c => c.innerText.trim()))")
    assert [r[0] for r in rows] == ["G1", "G2", "G3"]
    assert [r[6] for r in rows] == ["FAIL", "PASS", "PASS"]
    assert browser.js("return document.getElementById('overall').innerText") == "FAIL"
    charts = browser.js("return Array.from(document.querySelectorAll('figure.chart')).map(f => {"
                        "const s = f.querySelector('svg'); const r = s ? s.getBoundingClientRect() : null;"
                        "return [f.id, r ? Math.round(r.width) : 0, r ? Math.round(r.height) : 0]; })")
    assert [c[0] for c in charts] == ["chart-G1-streams", "chart-G2-ttft", "chart-G3-series"]
    assert all(w > 200 and h > 100 for _, w, h in charts), charts
    for gid in ("pass-line", "stop-loss-line", "ecdf-recompute", "ecdf-readback", "aggregate-line", "nic-ceiling-line"):
        assert browser.js(f"return document.getElementById('{gid}') !== null"), gid
    # the whole page, as a person sees it
    height = browser.js("return document.documentElement.scrollHeight")
    browser.cmd("POST", "/window/rect", {"width": 1280, "height": min(int(height) + 100, 8000)})
    png = base64.b64decode(browser.cmd("GET", "/screenshot"))
    shot = tmp_path / "report.png"
    shot.write_bytes(png)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 50_000
    print(f"screenshot: {shot}")
