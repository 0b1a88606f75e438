"""``kvgate cosign`` (add a signature to a bundle) and ``kvgate library build|check`` (the evidence library).

    kvgate cosign BUNDLE --key KEY [--pubkey SIGNER.pub]... [--keyring KEYRING.yaml]
    kvgate library build DIR... --out SITE [--keyring KEYRING.yaml] [--pubkey KEY.pub]...
    kvgate library check SITE [--keyring KEYRING.yaml] [--pubkey KEY.pub]...

Exit codes (harness.cli.exits): 0 done / the site checks out; 1 a bundle does not verify (cosign) or the site
does not match its bundles (check); 2 bad input (keyring errors as FILE:LINE: path: message, a directory that is
not a bundle, two bundles with the same ID and different content), nothing written.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import BundleError, VerificationError
from ..report.bundle import load_private_key
from ..report.cosign import cosign_bundle, verify_signers
from ..report.dsse import public_pem
from ..report.keyring import KeyEntry, keyring_from_pubkeys, load_keyring
from ..report.library import build_library, check_library
from .exits import EXIT_NO, EXIT_OK


def _trusted(args, required: bool) -> list[KeyEntry]:
    named = keyring_from_pubkeys(args.pubkey or [])
    ring = list(load_keyring(args.keyring).entries) if args.keyring else []
    keys = named + ring
    if required and not keys:
        raise BundleError("no keys to verify with: give --keyring KEYRING.yaml or --pubkey SIGNER.pub")
    # the keyring's entry wins over a bare --pubkey of the same key (it carries validity and revocation)
    return list({k.fingerprint: k for k in keys}.values())


def cmd_cosign(args) -> int:
    key = load_private_key(args.key)
    trusted = _trusted(args, required=False)
    if not trusted:
        print("note: no --pubkey/--keyring given: the files are checked against the statement, but the "
              "existing signatures are not checked against a key you trust", file=sys.stderr)
    try:
        res = cosign_bundle(args.bundle, key, trusted=trusted)
    except VerificationError as exc:
        print(f"FAILED: {exc}")
        return EXIT_NO
    where = " and ".join(str(p) for p in (res.directory, res.archive) if p is not None)
    if res.action == "signed":
        print(f"cosigned {res.report_id}: signature by {res.keyid} added, signed {res.signed_utc} "
              f"(signing record signatures/…); updated {where}")
    else:
        print(f"{res.report_id}: already signed by {res.keyid}; nothing to add"
              + (f" (the archive was stale and has been rebuilt: {res.archive})" if res.archive_refreshed else ""))
    you = KeyEntry(name=f"{Path(args.key).name} (your --key)", public_key=public_pem(key.public_key()))
    check = verify_signers(res.directory or res.archive, trusted=[you] + trusted)
    for c in check.signatures:
        print(f"  signature: {c.line()}")
    return EXIT_OK


def cmd_library_build(args) -> int:
    res = build_library(args.dirs, args.out, _trusted(args, required=True))
    for e in res.entries:
        status = "verified" if e["status"] == "verified" else f"FAILED verification: {e['reason']}"
        if e.get("signed_render_differs"):
            status += (f" (its signed {', '.join(e['signed_render_differs'][:4])} differ from kvgate's render "
                       "of its files: the site links kvgate's)")
        print(f"  {e['report_id']}: {status}  ({', '.join(res.sources.get(e['report_id'], []))})")
    n_failed = len(res.failed)
    print(f"wrote {res.site}: {len(res.entries)} bundles, {len(res.entries) - n_failed} verified"
          + (f", {n_failed} FAILED verification (listed as such)" if n_failed else "")
          + f"; open {res.site / 'index.html'}")
    return EXIT_OK


def cmd_library_check(args) -> int:
    trusted = _trusted(args, required=False) or None
    if trusted is None:
        print(f"note: checking against the site's own keyring.yaml; give --keyring YOUR-KEYRING.yaml to check "
              "against keys you hold", file=sys.stderr)
    res = check_library(args.site, trusted)
    if not res.ok:
        for p in res.problems:
            print(f"MISMATCH {p}")
        print(f"FAILED: {args.site}: {len(res.problems)} problem(s)")
        return EXIT_NO
    print(f"OK {args.site}: {res.n_bundles} bundles re-verified ({res.n_bundles - res.n_failed_as_recorded} "
          f"verified, {res.n_failed_as_recorded} failed as recorded); index.html matches; every link resolves, "
          "nothing remote")
    return EXIT_OK


def _key_args(p, what: str) -> None:
    p.add_argument("--keyring", help=f"keyring YAML: {what}")
    p.add_argument("--pubkey", action="append", help="a trusted public key (no role or dates); repeatable")


def register(subparsers) -> None:
    """Add ``cosign`` and ``library build|check``."""
    s = subparsers.add_parser("cosign", help="add your signature to a bundle (and its .tar.gz twin) without "
                              "changing its report ID or any file it signs")
    s.add_argument("bundle", help="bundle directory or .tar.gz")
    s.add_argument("--key", required=True, help="your Ed25519 private key (from kvgate keygen)")
    _key_args(s, "existing signatures by its keys must verify before you sign")
    s.set_defaults(func=cmd_cosign)

    lib = subparsers.add_parser("library", help="a static, verifiable index of bundles (build) and its re-check")
    sub = lib.add_subparsers(dest="library_command", required=True)
    b = sub.add_parser("build", help="verify every bundle under DIR... and write a static site to SITE")
    b.add_argument("dirs", nargs="+", metavar="DIR", help="directories searched for bundles (or bundle archives)")
    b.add_argument("--out", required=True, metavar="SITE", help="the site directory (replaced when complete)")
    _key_args(b, "the keys bundles are verified with, and who signed in which role")
    b.set_defaults(func=cmd_library_build)
    c = sub.add_parser("check", help="re-verify a published site against its bundles")
    c.add_argument("site", metavar="SITE")
    _key_args(c, "the keys to re-verify with (default: the site's own keyring.yaml)")
    c.set_defaults(func=cmd_library_check)
