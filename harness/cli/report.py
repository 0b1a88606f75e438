"""Bundles on the command line: ``kvgate keygen``, ``verify``, ``report BUNDLE`` (verify, re-evaluate from raw
data, re-render offline) and ``compare BUNDLE_A BUNDLE_B`` (delta table and chart of the metrics two runs share).

``verify``: 0 every file matches and every named key signed (with ``--keyring``: every signature judged, none
refused, each ``--require-role`` present); 1 it does not; 2 usage, an unreadable key, a bad keyring (FILE:LINE).
``report``: prints "N of M gates re-derived from raw files" beside its answer (a gate whose workload has no
re-deriver is taken from result.json, and named); 0 verified, the re-evaluated verdicts equal the signed ones and every signed rendered file (report.html,
report.md, tables, charts, junit.xml) is byte for byte kvgate's render of the verified files; 1 verification failed
(nothing is re-rendered), the verdicts differ (the report says what differs) or a signed render differs (named);
2 usage / bundle error.
``compare``: 0 written; 1 a bundle failed verification; 2 usage / bundle error (harness.cli.exits).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..errors import BundleError
from ..gates.reevaluate import Reevaluation, reevaluate_bundle
from ..paths import state_dir
from ..report.bundle import (ENVELOPE, check_statement, generate_keypair, key_fingerprint, load_public_key,
                             open_bundle, read_envelope, verify_bundle)
from ..report.charts import compare_svg
from ..report.compare import compare_predicates, outcome_changes, render_html, render_markdown
from ..report.cosign import SignersResult, signer_view, verify_signers
from ..report.keyring import ROLES, keyring_from_pubkeys, load_keyring
from ..report.predicate import check_predicate
from ..report.render import (confined, provenance_notes, render_predicate, signed_render_differences, to_csv_bytes,
                             write_reports)
from ..safeio import InputFileError, decode_utf8, parse_json
from .exits import EXIT_NO, EXIT_OK


def cmd_keygen(args) -> int:
    key, pub = generate_keypair(args.out)
    print(f"wrote {key} (private, mode 0600) and {pub}; fingerprint {key_fingerprint(load_public_key(pub))}")
    return EXIT_OK


def cmd_verify(args) -> int:
    if not args.pubkey and not args.keyring:
        raise BundleError("give --pubkey SIGNER.pub (repeatable) or --keyring KEYRING.yaml")
    if args.require_role and not args.keyring:
        raise BundleError("--require-role needs --keyring (roles come from a keyring)")
    named = keyring_from_pubkeys(args.pubkey or [])
    ring = list(load_keyring(args.keyring).entries) if args.keyring else []
    # a key in both: the keyring's entry (with its validity and revocation) is the one that judges
    res = verify_signers(args.bundle, trusted=named + ring, require_keys=named, require_roles=args.require_role or [])
    if not res.ok:
        print(f"FAILED: {res.error}")
        for c in res.signatures:
            print(f"  signature: {c.line()}")
        return EXIT_NO
    pred = res.statement["predicate"]
    # The predicate is signed, but what it holds beyond the checked shape is printed as data, never trusted
    # to have the types this kvgate writes.
    key = pred.get("signing_key")
    original = key if isinstance(key, dict) else {}
    by = ", ".join((f"{c.name} ({c.role}) " if c.role else (f"{c.name} " if args.keyring else "")) + c.keyid
                   + (f" ({original.get('kind', '?')} key)" if c.keyid == original.get("fingerprint") else "")
                   for c in res.accepted)
    print(f"OK {res.report_id}: signed by {by}, created {pred.get('created_utc')}, overall {pred.get('overall')}, "
          f"{len(res.statement['subject'])} files")
    if args.keyring or len(res.signatures) > 1:
        for c in res.signatures:
            print(f"  signature: {c.line()}")
    verdicts = pred.get("verdicts")
    for v in verdicts if isinstance(verdicts, list) else []:
        if not isinstance(v, dict):
            continue
        a = v.get("actual")
        actual = ("—" if a is None else f"{a:.4g} {v.get('unit', '')}".strip()
                  if isinstance(a, (int, float)) and not isinstance(a, bool) else repr(a))
        print(f"  {v.get('gate_id')}: {v.get('outcome')} {v.get('metric')} = {actual}")
    inputs = pred.get("input_report_ids")
    for rid in inputs if args.verbose and isinstance(inputs, list) else []:
        print(f"  input report: {rid}")
    return EXIT_OK


def _envelope_keyid(d: Path) -> str | None:
    try:
        return read_envelope(d / ENVELOPE)[2][0].get("keyid")
    except (InputFileError, IndexError):
        return None


def resolve_pubkey(d: Path, pubkey: str | None) -> tuple[Path | None, str]:
    """The key to verify with: --pubkey, else the local development key when the bundle names it."""
    if pubkey:
        return Path(pubkey), "given"
    dev = state_dir() / "dev-signing.pub"
    if dev.is_file() and key_fingerprint(load_public_key(dev)) == _envelope_keyid(d):
        return dev, "development key of this machine"
    return None, f"no --pubkey given and the bundle's signer {_envelope_keyid(d)} is not this machine's development key"


def _signers(d: Path, pubkey: str | None, keyring: str | None) -> tuple[SignersResult, str]:
    """Every signature of the envelope judged with the keyring and the verifying key (harness.report.cosign)."""
    key = resolve_pubkey(d, pubkey)[0] if pubkey or not keyring else None
    named = keyring_from_pubkeys([key]) if key is not None else []
    ring = list(load_keyring(keyring).entries) if keyring else []
    what = " and ".join(x for x in (f"the keyring {keyring}" if keyring else "",
                                     f"the key {key.name}" if key is not None else "") if x)
    return verify_signers(d, trusted=named + ring, require_keys=named), what


def _verify(d: Path, pubkey: str | None):
    key, how = resolve_pubkey(d, pubkey)
    if key is None:
        raise BundleError(how + "; give --pubkey SIGNER.pub or --keyring KEYRING.yaml")
    return verify_bundle(d, key), how


def _rerender_predicate(pred: dict[str, Any], re: Reevaluation, signers: SignersResult, keyring: str | None,
                        checked_with: str) -> dict[str, Any]:
    """The predicate the re-rendered reports print: the re-evaluated verdicts, the judged signatures (where there
    is more than one, or a keyring judged them) and, where the verdicts differ from the signed ones, a notice."""
    render_pred = render_predicate(pred)
    render_pred["verdicts"] = re.verdicts_for_render()
    if len(signers.signatures) > 1 or keyring:  # else the signed copy's text already says it all
        render_pred["rerender_signers"] = {"signatures": signer_view(signers.signatures),
                                           "checked_with": checked_with}
    if not re.same:
        render_pred["overall"] = re.overall_reevaluated or pred.get("overall")
        render_pred["rerender_notice"] = ("Re-rendered by kvgate report: the verdicts re-evaluated from the raw "
                                          "data differ from the signed ones: " + "; ".join(re.differences))
    return render_pred


def _reevaluation_record(rid: str, re: Reevaluation) -> dict[str, Any]:
    """reevaluation.json of a re-rendered report: the signed and re-evaluated outcome of every gate, and how."""
    return {
        "report_id": rid, "same": re.same, "differences": re.differences,
        "overall_signed": re.overall_signed, "overall_reevaluated": re.overall_reevaluated,
        "rederived": re.rederived_text,
        "gates": [{"gate_id": c.gate_id, "source": c.source, "rederived": c.rederived,
                   "signed": (c.signed or {}).get("outcome"),
                   "reevaluated": (c.reevaluated or {}).get("outcome"), "differences": c.differences}
                  for c in re.checks]}


def cmd_report(args) -> int:
    with open_bundle(args.bundle) as d:
        res, how = (None, f"keyring {args.keyring}") if args.keyring and not args.pubkey else _verify(d, args.pubkey)
        if res is not None and not res.ok:
            print(f"FAILED verification: {res.error}")
            print("nothing was re-rendered: the bundle does not match its signature")
            return EXIT_NO
        signers, checked_with = _signers(d, args.pubkey if res is not None else None, args.keyring)
        if not signers.ok:
            print(f"FAILED verification: {signers.error}")
            print("nothing was re-rendered: the bundle's signatures do not stand")
            return EXIT_NO
        pred = signers.statement["predicate"]
        check_predicate(pred, f"{args.bundle}: {ENVELOPE} payload")  # the shape the readers below take (exit 2)
        rid = signers.report_id
        who = f"key {res.signer}" if res is not None else ", ".join(c.who for c in signers.accepted)
        print(f"OK {rid}: signature and every file verified ({who}, {how})")
        for note in provenance_notes([v for v in pred.get("verdicts") or [] if isinstance(v, dict)]):
            print(f"  {note} (kvgate did not measure this itself)")
        for c in signers.signatures if len(signers.signatures) > 1 or args.keyring else []:
            print(f"  signature: {c.line()}")
        re = reevaluate_bundle(d, pred)
        for c in re.checks:
            s = (c.signed or {}).get("outcome", "—")
            n = (c.reevaluated or {}).get("outcome", "—")
            print(f"  {c.gate_id}: signed {s}, re-evaluated {n} ({c.source})" + ("" if c.same else "  DIFFERS"))
        render_pred = _rerender_predicate(pred, re, signers, args.keyring, checked_with)
        with tempfile.TemporaryDirectory(prefix="kvgate-rerender-") as td:
            mine, differ = signed_render_differences(rid, d, pred, Path(td))
        held = sum(1 for f in mine if (d / f).is_file())
        out = Path(args.out) if args.out else Path(f"{rid}-report")
        out.mkdir(parents=True, exist_ok=True)
        files = write_reports(rid, d, render_pred, out)
        confined(out, "reevaluation.json").write_text(json.dumps(_reevaluation_record(rid, re), indent=1) + "\n")
        print(f"re-rendered {len(files)} files into {out}")
        if differ:
            print(f"signed reports: DIFFER from kvgate's render of the verified files: {', '.join(differ[:8])}"
                  + (f" and {len(differ) - 8} more" if len(differ) > 8 else "")
                  + " (the signed copies are not evidence; read the re-rendered ones)")
        else:
            print(f"signed reports: IDENTICAL to kvgate's render of the verified files ({held} compared)")
        if re.same:
            print(f"verdicts: SAME as signed (overall {re.overall_signed}); {re.rederived_text}")
            return EXIT_NO if differ else EXIT_OK
        print(f"verdicts: DIFFER from the signed ones ({re.rederived_text}):")
        for line in re.differences:
            print(f"  {line}")
        return EXIT_NO


def _predicate(d: Path, pubkey: str | None) -> tuple[dict, str, str | None]:
    """(predicate, report id, note) of a bundle; verified where a key is known, else read and marked."""
    key, how = resolve_pubkey(d, pubkey)
    if key is not None:
        res = verify_bundle(d, key)
        if not res.ok:
            raise _VerifyFailed(f"{d.name}: FAILED verification: {res.error}")
        return res.statement["predicate"], res.report_id, None
    try:
        payload = read_envelope(d / ENVELOPE)[1]
        st = parse_json(decode_utf8(payload, f"{ENVELOPE} payload"), f"{ENVELOPE} payload")
        check_statement(st, f"{ENVELOPE} payload")
    except InputFileError as exc:
        raise BundleError(f"{d}: not a kvgate bundle: {exc}") from None
    rid = st["predicate"].get("report_id", d.name)
    return st["predicate"], rid, f"{rid} is NOT verified ({how})"


class _VerifyFailed(Exception):
    pass


def cmd_compare(args) -> int:
    try:
        with open_bundle(args.bundle_a) as da, open_bundle(args.bundle_b) as db:
            pa, ida, na = _predicate(da, args.pubkey)
            pb, idb, nb = _predicate(db, args.pubkey_b or args.pubkey)
    except _VerifyFailed as exc:
        print(str(exc))
        return EXIT_NO
    notes = [n for n in (na, nb) if n]
    frame = compare_predicates(pa, pb, (f"{args.bundle_a}: {ENVELOPE} payload", f"{args.bundle_b}: {ENVELOPE} payload"))
    changes = outcome_changes(pa, pb)
    for n in notes:
        print(f"WARNING: {n}", file=sys.stderr)
    print(f"A = {ida} (overall {pa.get('overall')}), B = {idb} (overall {pb.get('overall')})")
    for g, oa, ob in changes:
        print(f"  {g}: {oa} -> {ob}")
    if frame.empty:
        print("the two runs share no metric")
    for r in frame.itertuples():
        mark = "*" if r.judged else " "
        print(f" {mark}{r.gate:5} {r.metric:28} A {r.a:<12.5g} B {r.b:<12.5g} delta {r.delta:+.4g} "
              f"({r.delta_pct:+.2f}%) {r.change}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        svg = None
        if not frame.empty:
            svg = compare_svg([(f"{r.gate} {r.metric}", r.delta_pct) for r in frame.itertuples()],
                              label_a=ida, label_b=idb, title=f"{ida} -> {idb}")
            (out / "compare.svg").write_text(svg)
        (out / "compare.csv").write_bytes(to_csv_bytes(frame))
        (out / "compare.md").write_text(render_markdown(ida, idb, frame, changes, notes))
        (out / "compare.html").write_text(render_html(ida, idb, frame, changes, notes, svg))
        print(f"wrote {out}/compare.md, compare.html, compare.csv" + (", compare.svg" if svg else ""))
    return EXIT_OK


def register(subparsers) -> None:
    """Add ``keygen``, ``verify``, ``report`` and ``compare`` to the kvgate command line."""
    s = subparsers.add_parser("keygen", help="write an Ed25519 key pair PREFIX.key (0600) and PREFIX.pub")
    s.add_argument("--out", required=True, metavar="PREFIX")
    s.set_defaults(func=cmd_keygen)

    s = subparsers.add_parser("verify", help="verify a bundle (directory or .tar.gz): every named key signed it; with "
                              "--keyring, who signed in which role, refusing signatures made after a key's revocation")
    s.add_argument("bundle")
    s.add_argument("--pubkey", action="append", help="a signer's public key; repeatable: every one must have signed")
    s.add_argument("--keyring", help="keyring YAML: names, roles, validity and revocation of signing keys")
    s.add_argument("--require-role", action="append", choices=list(ROLES),
                   help="with --keyring: some accepted signature must have this role; repeatable")
    s.add_argument("--verbose", "-v", action="store_true", help="also list the input report IDs a bundle cites")
    s.set_defaults(func=cmd_verify)

    s = subparsers.add_parser("report", help="verify a bundle, re-evaluate its verdicts from the raw files with "
                              "its own suite, and re-render its reports offline")
    s.add_argument("bundle", help="bundle directory or .tar.gz")
    s.add_argument("--pubkey", help="signer's public key (default: this machine's development key, if it signed)")
    s.add_argument("--keyring", help="keyring YAML: the re-rendered report names every signer and role, and "
                   "a refused signature (made after its key's revocation) fails the command")
    s.add_argument("--out", "-o", help="directory for the re-rendered reports (default: ./<report ID>-report)")
    s.set_defaults(func=cmd_report)

    s = subparsers.add_parser("compare", help="delta table and chart of the metrics two runs share")
    s.add_argument("bundle_a")
    s.add_argument("bundle_b")
    s.add_argument("--pubkey", help="public key to verify both bundles (default: the development key, if it signed)")
    s.add_argument("--pubkey-b", help="public key for BUNDLE_B when another key signed it")
    s.add_argument("--out", "-o", help="write compare.md, compare.html, compare.csv and compare.svg here")
    s.set_defaults(func=cmd_compare)
