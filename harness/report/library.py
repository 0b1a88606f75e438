"""The evidence library: a static site indexing every bundle found, each verified when the site is built.

``build_library(DIR..., SITE, trusted)`` writes, under a hidden temporary name beside SITE renamed into
place only when complete:

  SITE/index.html            one page, no server and no remote assets (works from file://): a row per bundle
                             (report ID, suite, date, signers, overall outcome, every gate's figure,
                             verification), filters by suite, gate, outcome, signer and date (inline vanilla
                             JS), per-suite SVG trend charts of each gate's metric, cost bundles linked to the
                             report IDs they cite and back. Bundles that fail verification are listed, with
                             the reason, and counted in a banner at the top.
  SITE/library.json          the index as data; ``check_library`` re-derives it
  SITE/keyring.yaml          the keys the site was verified with (public keys inline)
  SITE/bundles/<ID>.tar.gz   every bundle, as found (or packed from its directory): downloaded, never shown
  SITE/reports/<ID>/         kvgate's own render (report.html, report.md, tables, charts) of each verified
                             acceptance bundle, from its verified files and signed predicate: what the
                             index links. A signed report.html is never published as a page of the site
                             (it could show PASS over FAIL evidence, or carry script); the row says when the
                             signed renders differ from kvgate's. Cost bundles are not re-rendered here (their
                             renderer lives above this layer): their signed report.html is shown escaped in a
                             sandboxed frame of a page of kvgate's (no script, nothing fetched).

The page is a pure function of library.json, the keyring and kvgate's templates, so ``check_library``
re-verifies every bundle, re-renders every report and the page, and compares them byte for byte.

Bad input is a BundleError (one line) before anything is written: a ``KVG-…`` directory without an
envelope, an archive that is not a bundle, two bundles with the same ID and different content, a DIR with
no bundle. Every file read from a bundle or a site goes through the hardened reader (harness.safeio:
regular files only, size caps, strict JSON); a file in a bundle that is not a regular file is never opened
(its bundle then fails verification, listed as such).
"""

from __future__ import annotations

import csv
import hashlib
import html
import html.parser
import io
import json
import os
import re
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import jinja2

from ..errors import BundleError
from ..paths import data_path
from ..safeio import MAX_JSON_BYTES, InputFileError, decode_utf8, load_json, parse_json, read_bytes, read_text
from ..units import format_quantity
from .bundle import (ENVELOPE, OLD_RID_RE, RID_RE, entry_kind, extract_archive, read_envelope, sha256_file, tar_bundle,
                     walk_tree)
from .cosign import TAR_SUFFIX, SignersResult, verify_signers
from .keyring import KeyEntry, Keyring, load_keyring
from .library_charts import trend_charts
from .predicate import check_predicate
from .render import signed_render_differences

FORMAT = "kvgate-library/v1"
LIBRARY_JSON = "library.json"
INDEX = "index.html"
KEYRING = "keyring.yaml"
BUNDLES = "bundles"
REPORTS = "reports"
COST_KIND = "kvgate-cost/v1"
COST_FIGURES = ("net_usd_per_month", "break_even_hit_rate", "capacity_tb", "throughput_gain")
OUTCOMES = ("PASS", "FAIL", "STOP", "ERROR", "INVALID", "INFO", "SKIPPED")
UNVERIFIED = "NOT VERIFIED"


def _named_like_a_bundle(name: str) -> bool:
    """A report ID of this kvgate, or of the older format (found, then listed as failing verification)."""
    return bool(RID_RE.match(name) or OLD_RID_RE.match(name))


# --------------------------------------------------------------------------- finding bundles


@dataclass
class Copy:
    """One copy of a bundle found on disk (a directory, or an archive extracted into ``dir``)."""

    report_id: str
    source: Path            # as found
    dir: Path               # a directory holding its files
    archive: Path | None    # the .tar.gz, when the copy is (or has) one
    content_sha256: str = ""


def _tree(d: Path) -> dict[str, str]:
    """Bundle-relative path -> what it is: ``F <sha256>`` for a regular file (hashed in chunks), ``D`` for a
    directory, ``L <target>`` for a symlink (to a file or a directory: never followed), ``S <kind>`` for
    anything else (a FIFO or device is never opened). The walk is harness.report.bundle's, the one every
    reader of a bundle shares."""
    out: dict[str, str] = {}
    for rel, mode in walk_tree(d):
        p = d / rel
        if stat.S_ISLNK(mode):
            out[rel] = f"L {os.readlink(p)}"
        elif stat.S_ISREG(mode):
            out[rel] = f"F {sha256_file(p)}"
        elif stat.S_ISDIR(mode):
            out[rel] = "D "
        else:
            out[rel] = f"S {entry_kind(mode)}"
    return out


def tree_digest(d: Path) -> str:
    """sha256 over every file's path and sha256 (symlinks by their target): equal trees, equal digest."""
    h = hashlib.sha256()
    for rel, what in sorted(_tree(d).items()):
        h.update(f"{what[0]} {rel} {what[2:]}\n".encode())
    return h.hexdigest()


def _first_difference(a: Path, b: Path) -> str:
    fa, fb = _tree(a), _tree(b)
    for rel in sorted(set(fa) | set(fb)):
        if fa.get(rel) != fb.get(rel):
            return rel
    return "nothing (equal trees)"


def _is_site(d: Path) -> bool:
    return (d / LIBRARY_JSON).is_file() and (d / BUNDLES).is_dir()


def _bundles_below(top: Path, skip_r: set[Path]) -> Iterator[tuple[str, Path]]:
    """The bundles under the directory ``top``, found lazily in walk order: ("dir", a directory holding the
    envelope) or ("archive", a ``KVG-….tar.gz``); hidden entries, ``skip_r`` (resolved), library sites and
    symbolic links are not entered, and a directory named like a bundle without an envelope is refused."""
    for dirpath, dirnames, filenames in os.walk(top):
        here = Path(dirpath)
        keep = []
        for dn in sorted(dirnames):
            sub = here / dn
            if dn.startswith(".") or sub.resolve() in skip_r or _is_site(sub) or sub.is_symlink():
                continue
            if (sub / ENVELOPE).is_file():
                yield "dir", sub
            elif _named_like_a_bundle(dn):
                raise BundleError(f"{sub}: not a bundle: no {ENVELOPE}")
            else:
                keep.append(dn)
        dirnames[:] = keep
        for fn in sorted(filenames):
            if fn.endswith(TAR_SUFFIX) and _named_like_a_bundle(fn[: -len(TAR_SUFFIX)]) and not fn.startswith("."):
                yield "archive", here / fn


def find_copies(paths: list[Path], work: Path, skip: list[Path] = ()) -> list[Copy]:
    """Every bundle under ``paths`` (directories holding attestation.dsse.json, ``KVG-….tar.gz`` archives,
    extracted into ``work``). Library sites (a library.json beside bundles/) and hidden entries are skipped."""
    skip_r = {p.resolve() for p in skip}
    copies: list[Copy] = []
    n = 0

    def add_archive(tar: Path) -> None:
        nonlocal n
        n += 1
        into = work / f"a{n}"
        into.mkdir(parents=True)
        d = extract_archive(tar, into)
        name = tar.name[: -len(TAR_SUFFIX)]
        if d.name != name:
            raise BundleError(f"{tar}: not a bundle archive: it holds {d.name}/, not {name}/")
        copies.append(Copy(name, tar, d, tar))

    def add_dir(d: Path) -> None:
        rid = d.name if _named_like_a_bundle(d.name) else _statement_id(d)
        if rid is None:
            raise BundleError(f"{d}: not a bundle: no report ID (neither the directory name nor its statement)")
        copies.append(Copy(rid, d, d, None))

    for top in paths:
        top = Path(top)
        if top.is_file() and top.name.endswith(TAR_SUFFIX):
            add_archive(top)
            continue
        if not top.is_dir():
            raise BundleError(f"{top}: no such directory or bundle archive")
        if _is_site(top) or top.resolve() in skip_r:
            raise BundleError(f"{top}: is a kvgate library site, not a directory of bundles (give {top}/{BUNDLES} "
                              "to rebuild from its bundles)")
        before = len(copies)
        if (top / ENVELOPE).is_file():
            add_dir(top)
        elif _named_like_a_bundle(top.name):
            raise BundleError(f"{top}: not a bundle: no {ENVELOPE}")
        else:
            for kind, found in _bundles_below(top, skip_r):
                (add_archive if kind == "archive" else add_dir)(found)
        if len(copies) == before:
            raise BundleError(f"{top}: no bundle found (expected KVG-… directories or KVG-….tar.gz archives)")
    for c in copies:
        c.content_sha256 = tree_digest(c.dir)
    return copies


def _statement_id(d: Path) -> str | None:
    """The report ID a bundle directory's statement claims (read with the hardened reader, not verified)."""
    name = f"{ENVELOPE} payload"
    try:
        st = parse_json(decode_utf8(read_envelope(d / ENVELOPE)[1], name), name)
    except InputFileError:
        return None
    pred = st.get("predicate") if isinstance(st, dict) else None
    rid = pred.get("report_id") if isinstance(pred, dict) else None
    return rid if isinstance(rid, str) and _named_like_a_bundle(rid) else None


def unique_copies(copies: list[Copy]) -> dict[str, list[Copy]]:
    """Report ID -> its copies, which must be identical (a directory and its archive twin are one bundle)."""
    by_id: dict[str, list[Copy]] = {}
    for c in copies:
        by_id.setdefault(c.report_id, []).append(c)
    for rid, cs in by_id.items():
        for other in cs[1:]:
            if other.content_sha256 != cs[0].content_sha256:
                raise BundleError(f"{rid}: two bundles with the same ID and different content: {cs[0].source} and "
                                  f"{other.source} ({_first_difference(cs[0].dir, other.dir)} differs)")
    return dict(sorted(by_id.items()))


# --------------------------------------------------------------------------- entries


def _cost_figures(d: Path) -> dict[str, float]:
    """The headline figures of a verified cost bundle's results table (hardened reader; none if unreadable)."""
    p = d / "tables" / "results.csv"
    out: dict[str, float] = {}
    try:
        text = read_text(p, max_bytes=MAX_JSON_BYTES, what="results table", follow_symlinks=False)
        for row in csv.DictReader(io.StringIO(text)):
            if row.get("output") in COST_FIGURES:
                out[row["output"]] = float(row["value"])
    except (InputFileError, ValueError, KeyError, TypeError, csv.Error):
        pass
    return out


_SANDBOX_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; img-src data:">
<title>{rid}: the signed cost report, sandboxed</title>
<style>body{{font-family:sans-serif;margin:1em}}iframe{{width:100%;height:85vh;border:1px solid #999}}</style>
</head>
<body>
<p id="sandbox-note"><strong>{rid}</strong>: the bundle's signed <code>report.html</code> as its signer wrote it,
shown in a sandbox (no script, nothing fetched, no access to this site). kvgate did not render it: the figures on
the index come from the bundle's signed <code>tables/results.csv</code>, and the archive holds every signed
file.</p>
<iframe sandbox="" title="signed report of {rid}" srcdoc="{doc}"></iframe>
</body>
</html>
"""


def publish_report(rid: str, d: Path, res: SignersResult, into: Path) -> tuple[str | None, list[str] | None]:
    """Write the report page the index links for a verified bundle into ``into``; (how it was made, the signed
    rendered files that differ from kvgate's render). An acceptance bundle: kvgate's own render from its
    verified files and signed predicate (``"kvgate render"``). A cost bundle (its renderer lives above this
    layer): its signed report.html embedded, escaped, in a sandboxed frame of a page of kvgate's
    (``"signed render, sandboxed"``), never a page of the site by itself. A bundle that failed verification:
    nothing, (None, None)."""
    if not res.ok:
        return None, None
    if res.statement["predicate"].get("kind") == COST_KIND:
        try:
            signed = read_bytes(d / "report.html", max_bytes=MAX_JSON_BYTES, what="signed report",
                                follow_symlinks=False).decode("utf-8", errors="replace")
        except InputFileError:
            return None, None
        into.mkdir(parents=True)
        (into / "report.html").write_text(_SANDBOX_PAGE.format(rid=html.escape(rid),
                                                               doc=html.escape(signed, quote=True)))
        return "signed render, sandboxed", None
    return "kvgate render", signed_render_differences(rid, d, res.statement["predicate"], into)[1]


def readable(res: SignersResult) -> SignersResult:
    """A verified bundle whose predicate is of a shape this kvgate cannot read is a failed one, with why."""
    if res.ok:
        try:
            check_predicate(res.statement["predicate"], f"{ENVELOPE} payload")
        except InputFileError as exc:
            return SignersResult(False, res.report_id, res.statement, str(exc), res.signatures)
    return res


def entry_for(rid: str, d: Path, res: SignersResult, content_sha256: str,
              published: tuple[str | None, list[str] | None] = (None, None)) -> dict[str, Any]:
    """The index row of one bundle (JSON data). Nothing from a bundle that failed verification but its ID
    and the reason: unverified figures are not shown. ``published``: what :func:`publish_report` wrote (the
    row links it; never a signed page of the bundle itself)."""
    shown, render_differs = published
    base = {"report_id": rid, "content_sha256": content_sha256, "archive": f"{BUNDLES}/{rid}{TAR_SUFFIX}"}
    res = readable(res)
    if not res.ok:
        return base | {"status": "failed", "reason": res.error, "signers": [c.as_dict() for c in res.signatures]}
    pred = res.statement["predicate"]
    entry = base | {
        "status": "verified", "reason": None, "created_utc": pred.get("created_utc"),
        "report_html": f"{REPORTS}/{rid}/report.html" if shown else None,
        "report_shown": shown,
        "signed_render_differs": render_differs,
        "signers": [c.as_dict() for c in res.signatures],
    }
    if pred.get("kind") == COST_KIND:
        cites = pred.get("input_report_ids")
        return entry | {"kind": "cost", "suite": None, "overall": None, "gates": [],
                        "cites": sorted(c for c in cites if isinstance(c, str)) if isinstance(cites, list) else [],
                        "cost": _cost_figures(d), "model": pred.get("model")}
    # The predicate is signed, but what it holds beyond the checked shape is data, never trusted to have the
    # types this kvgate writes.
    suite = pred.get("suite") if isinstance(pred.get("suite"), dict) else {"name": str(pred.get("suite") or "")}
    verdicts = pred.get("verdicts") if isinstance(pred.get("verdicts"), list) else []
    gates = [{"gate_id": v.get("gate_id"), "title": v.get("title"), "metric": v.get("metric"),
              "actual": v.get("actual"), "unit": v.get("unit"), "outcome": v.get("outcome"),
              "pass": v.get("pass_threshold"), "stop_loss": v.get("stop_loss_threshold")}
             for v in verdicts if isinstance(v, dict)]
    return entry | {"kind": "acceptance", "suite": {"name": suite.get("name"), "version": suite.get("version")},
                    "overall": pred.get("overall"), "gates": gates, "cites": []}


def link_citations(entries: list[dict[str, Any]]) -> None:
    """Fill ``cited_by`` (cost bundles citing each report) in place."""
    ids = {e["report_id"] for e in entries}
    for e in entries:
        e["cited_by"] = []
    by_id = {e["report_id"]: e for e in entries}
    for e in entries:
        for rid in e.get("cites") or []:
            if rid in ids:
                by_id[rid]["cited_by"].append(e["report_id"])
    for e in entries:
        e["cited_by"].sort()


# --------------------------------------------------------------------------- rendering


def _fmt_actual(g: dict[str, Any]) -> str:
    a = g.get("actual")
    if a is not None and (isinstance(a, bool) or not isinstance(a, (int, float))):
        return repr(a)
    return format_quantity(a, g.get("unit") if isinstance(g.get("unit"), str) else None)


def _view(entries: list[dict[str, Any]], trusted: list[KeyEntry], built_utc: str) -> dict[str, Any]:
    rows = []
    for e in entries:
        accepted = [s for s in e.get("signers", []) if s["status"] == "accepted"]
        names = sorted({s["name"] for s in accepted if s.get("name")})
        gates = {g["gate_id"]: g["outcome"] for g in e.get("gates", [])}
        rows.append(e | {
            "date": (e.get("created_utc") or "")[:10],
            "signer_names": names,
            "data_gates": json.dumps(gates, sort_keys=True),
            "data_signers": json.dumps(names),
            "data_outcome": UNVERIFIED if e["status"] == "failed" else (e.get("overall") or ""),
            "data_suite": (e.get("suite") or {}).get("name") or ("cost" if e.get("kind") == "cost" else ""),
            "gate_texts": [f"{g['gate_id']} {g['outcome']} {_fmt_actual(g)}" for g in e.get("gates", [])],
        })
    ids = {e["report_id"] for e in entries}
    verified = [e for e in entries if e["status"] == "verified"]
    suites = sorted({r["data_suite"] for r in rows if r["data_suite"]})
    gate_ids = sorted({g for e in verified for g in (x["gate_id"] for x in e.get("gates", []))})
    outcomes = [o for o in OUTCOMES if any(e.get("overall") == o or o in (g["outcome"] for g in e.get("gates", []))
                                          for e in verified)]
    signers = sorted({n for r in rows for n in r["signer_names"]})
    return {
        "rows": rows, "ids": ids, "built_utc": built_utc, "suites": suites, "gate_ids": gate_ids,
        "outcomes": outcomes + ([UNVERIFIED] if any(e["status"] == "failed" for e in entries) else []),
        "signers": signers, "failed": [e for e in entries if e["status"] == "failed"],
        "n_verified": len(verified), "trusted": [{"name": k.name, "role": k.role, "fingerprint": k.fingerprint,
                                                   "revoked": k.revoked} for k in trusted],
        "trends": trend_charts(verified),
    }


def render_index(entries: list[dict[str, Any]], trusted: list[KeyEntry], built_utc: str) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(data_path("reports"))), autoescape=True,
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True,
                             lstrip_blocks=True)
    view = _view(entries, trusted, built_utc)
    view["trends"] = [t | {"svg": jinja2.utils.markupsafe.Markup(t["svg"])} for t in view["trends"]]
    return env.get_template("library.html.j2").render(**view)


# --------------------------------------------------------------------------- build and check


@dataclass
class BuildResult:
    site: Path
    entries: list[dict[str, Any]]
    sources: dict[str, list[str]] = field(default_factory=dict)

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [e for e in self.entries if e["status"] == "failed"]


def _publish(stage: Path, site: Path) -> None:
    """Rename the complete ``stage`` to ``site``, replacing an older library there."""
    if not site.exists():
        os.rename(stage, site)
        return
    old = Path(tempfile.mkdtemp(prefix=".old-library-", dir=site.parent))
    os.rename(site, old / "site")
    try:
        os.rename(stage, site)
    except BaseException:
        os.rename(old / "site", site)
        raise
    shutil.rmtree(old, ignore_errors=True)


def build_library(dirs: list[str | Path], site: str | Path, trusted: list[KeyEntry],
                  built_utc: str | None = None) -> BuildResult:
    """Find, verify and publish every bundle under ``dirs`` as a static site at ``site`` (module docstring)."""
    site = Path(site)
    if site.exists() and not (site.is_dir() and (not any(site.iterdir()) or _is_site(site))):
        raise BundleError(f"{site}: exists and is not a kvgate library; refusing to replace it")
    if not trusted:
        raise BundleError("no keys to verify with: give --keyring KEYRING.yaml or --pubkey SIGNER.pub")
    site.parent.mkdir(parents=True, exist_ok=True)
    built_utc = built_utc or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    stage = Path(tempfile.mkdtemp(prefix=f".incomplete-{site.name}-", dir=site.parent))
    try:
        work = Path(tempfile.mkdtemp(prefix=".found-", dir=stage))
        copies = unique_copies(find_copies([Path(d) for d in dirs], work, skip=[site, stage]))
        out = stage / BUNDLES
        out.mkdir()
        (stage / REPORTS).mkdir()
        entries, sources = [], {}
        for rid, cs in copies.items():
            first = next((c for c in cs if c.archive is None), cs[0])
            try:  # one bundle that cannot be read or rendered is listed as failed; the build goes on
                res = readable(verify_signers(first.dir, trusted=trusted))
                entry = entry_for(rid, first.dir, res, first.content_sha256,
                                  publish_report(rid, first.dir, res, stage / REPORTS / rid))
            except (BundleError, InputFileError, OSError) as exc:
                shutil.rmtree(stage / REPORTS / rid, ignore_errors=True)
                entry = entry_for(rid, first.dir, SignersResult(False, None, None, " ".join(str(exc).split())),
                                  first.content_sha256)
            entries.append(entry)
            sources[rid] = [str(c.source) for c in cs]
            archive = next((c.archive for c in cs if c.archive is not None), None)
            if archive is None:
                tree = first.dir if first.dir.name == rid else _renamed_copy(first.dir, work, rid)
                tar_bundle(tree, out / f"{rid}{TAR_SUFFIX}")
            else:
                shutil.copyfile(archive, out / f"{rid}{TAR_SUFFIX}")
        shutil.rmtree(work)
        link_citations(entries)
        entries = order_entries(entries)
        _write_site(stage, entries, trusted, built_utc)
        os.chmod(stage, 0o755)
        _publish(stage, site)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return BuildResult(site, entries, sources)


def _renamed_copy(d: Path, work: Path, rid: str) -> Path:
    dst = Path(tempfile.mkdtemp(prefix=".named-", dir=work)) / rid
    shutil.copytree(d, dst, symlinks=True)
    return dst


def order_entries(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Failed bundles first (so they are seen), then newest first, ties by report ID."""
    failed = sorted((e for e in entries if e["status"] == "failed"), key=lambda e: e["report_id"])
    ok = sorted((e for e in entries if e["status"] != "failed"),
                key=lambda e: (e.get("created_utc") or "", e["report_id"]), reverse=True)
    return failed + ok


def _keyring_text(trusted: list[KeyEntry]) -> str:
    return Keyring("", tuple(trusted)).to_yaml()


def _write_site(stage: Path, entries: list[dict[str, Any]], trusted: list[KeyEntry], built_utc: str) -> None:
    (stage / KEYRING).write_text(_keyring_text(trusted))
    (stage / LIBRARY_JSON).write_text(json.dumps({"format": FORMAT, "built_utc": built_utc, "keyring": KEYRING,
                                                  "bundles": entries}, indent=1, sort_keys=True) + "\n")
    (stage / INDEX).write_text(render_index(entries, trusted, built_utc))


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[tuple[str, str, str]] = []   # (tag, attribute, value)

    def handle_starttag(self, tag, attrs):
        for k, v in attrs:
            if k in ("href", "src", "action", "poster", "data") and v is not None:
                self.refs.append((tag, k, v))


def link_problems(site: Path, page: str) -> list[str]:
    """Remote references and local links that do not resolve, in one page of the site."""
    p = _Links()
    p.feed(page)
    out = []
    for tag, attr, ref in p.refs:
        if re.match(r"^[a-z][a-z0-9+.-]*:|^//", ref, re.I):
            out.append(f"{INDEX}: <{tag} {attr}={ref!r}>: a remote or non-file reference")
            continue
        path = ref.split("#", 1)[0]
        if path and not (site / path).exists():
            out.append(f"{INDEX}: <{tag} {attr}={ref!r}>: does not resolve")
    ids = set(re.findall(r'\bid="([^"]+)"', page))
    for tag, attr, ref in p.refs:
        if ref.startswith("#") and len(ref) > 1 and ref[1:] not in ids:
            out.append(f"{INDEX}: <{tag} {attr}={ref!r}>: no such anchor")
    return out


def _difference(rec: dict[str, Any], now: dict[str, Any]) -> str | None:
    """How a recorded row differs from the re-derived one, in one line; None when equal."""
    if rec.get("status") != now.get("status"):
        return (f"recorded {rec.get('status')}, now {now.get('status')}"
                + (f": {now['reason']}" if now.get("reason") else ""))
    keys = sorted(k for k in set(rec) | set(now) if rec.get(k) != now.get(k))
    if not keys:
        return None
    short = lambda v: repr(v) if len(repr(v)) <= 80 else repr(v)[:77] + "..."  # noqa: E731
    return "; ".join(f"{k}: recorded {short(rec.get(k))}, now {short(now.get(k))}" for k in keys)


@dataclass
class CheckResult:
    ok: bool
    problems: list[str]
    n_bundles: int
    n_failed_as_recorded: int


def _read_library(site: Path) -> tuple[list[dict[str, Any]], str]:
    """(the recorded rows, built_utc) of the site's library.json; BundleError when it is not a kvgate library's."""
    try:
        lib = load_json(site / LIBRARY_JSON, what="library index", display_name=str(site / LIBRARY_JSON))
    except InputFileError as exc:
        raise BundleError(f"{site}: not a kvgate library: {exc}") from None
    recorded = lib.get("bundles") if isinstance(lib, dict) else None
    built_utc = lib.get("built_utc") if isinstance(lib, dict) else None
    if (not isinstance(lib, dict) or lib.get("format") != FORMAT or not isinstance(recorded, list)
            or not all(isinstance(e, dict) for e in recorded) or not isinstance(built_utc, str)):
        raise BundleError(f"{site}: not a kvgate library ({LIBRARY_JSON}: expected format {FORMAT!r} with "
                          "built_utc and a list of bundles)")
    return recorded, built_utc


def _archive_problems(site: Path, rids: list[str]) -> list[str]:
    """The site's stray and missing bundle archives, against the report IDs ``rids`` its library.json lists."""
    expected = {f"{r}{TAR_SUFFIX}" for r in rids}
    present = {p.name for p in (site / BUNDLES).iterdir()} if (site / BUNDLES).is_dir() else set()
    return ([f"{BUNDLES}/{name}: not in {LIBRARY_JSON}" for name in sorted(present - expected)]
            + [f"{BUNDLES}/{name}: missing" for name in sorted(expected - present)])


def _index_problems(site: Path, entries: list[dict[str, Any]], trusted: list[KeyEntry], built_utc: str) -> list[str]:
    """The site's index.html against the page re-rendered from the re-derived ``entries``, and its links."""
    problems = []
    try:
        page = read_text(site / INDEX, max_bytes=MAX_JSON_BYTES, what="page", follow_symlinks=False,
                         display_name=INDEX)
    except InputFileError as exc:
        problems.append(str(exc))
        page = ""
    if page and page != render_index(order_entries(entries), trusted, built_utc):
        problems.append(f"{INDEX}: differs from the page re-rendered from the re-verified bundles")
    return problems + link_problems(site, page)


def check_library(site: str | Path, trusted: list[KeyEntry] | None = None) -> CheckResult:
    """Re-verify a published site: every bundle against the keys (default: the site's keyring.yaml), every
    row of library.json re-derived, every published report re-rendered from its verified archive and
    compared byte for byte, index.html re-rendered byte for byte, no stray or missing bundle or report,
    every link resolving and nothing remote."""
    site = Path(site)
    recorded, built_utc = _read_library(site)
    if trusted is None:
        trusted = list(load_keyring(site / KEYRING).entries)
    rids = [e.get("report_id") for e in recorded]
    if any(not isinstance(r, str) or not _named_like_a_bundle(r) for r in rids) or len(set(rids)) != len(rids):
        raise BundleError(f"{site}: {LIBRARY_JSON}: bad or duplicate report IDs")
    problems = _archive_problems(site, rids)
    rendered = {p.name for p in (site / REPORTS).iterdir()} if (site / REPORTS).is_dir() else set()
    entries = []
    with tempfile.TemporaryDirectory(prefix="kvgate-library-check-") as td:
        for i, rec in enumerate(recorded):
            rid = rec["report_id"]
            tar = site / BUNDLES / f"{rid}{TAR_SUFFIX}"
            if not tar.is_file():
                entries.append(rec)
                continue
            try:
                d = extract_archive(tar, Path(td) / f"b{i}")
            except BundleError as exc:
                problems.append(str(exc))
                entries.append(rec)
                continue
            res = readable(verify_signers(d, trusted=trusted))
            mine = Path(td) / f"r{i}"
            try:
                entry = entry_for(rid, d, res, tree_digest(d), publish_report(rid, d, res, mine))
            except (BundleError, InputFileError, OSError) as exc:
                entry = entry_for(rid, d, SignersResult(False, None, None, " ".join(str(exc).split())), tree_digest(d))
            published = site / REPORTS / rid
            if entry.get("report_html") is not None:
                rendered.discard(rid)
                if not published.is_dir() or published.is_symlink():
                    problems.append(f"{REPORTS}/{rid}/: missing")
                elif tree_digest(published) != tree_digest(mine):
                    problems.append(f"{REPORTS}/{rid}/: differs from what kvgate makes of {BUNDLES}/{rid}{TAR_SUFFIX} "
                                    f"({_first_difference(published, mine)})")
            entries.append(entry)
    for name in sorted(rendered):
        problems.append(f"{REPORTS}/{name}: not a render of a verified bundle in {LIBRARY_JSON}")
    link_citations(entries)
    for rec, now in zip(recorded, entries):
        if (what := _difference(rec, now)) is not None:
            problems.append(f"{rec['report_id']}: {what}")
    problems += _index_problems(site, entries, trusted, built_utc)
    failed = sum(1 for e in entries if e["status"] == "failed")
    return CheckResult(not problems, problems, len(entries), failed)
