"""``kvgate cost``: the costing model, rerunnable with the customer's parameters, bound to verified reports.

    kvgate cost --params PARAMS.yaml [--bundle BUNDLE --pubkey KEY.pub]... --out DIR [--key KEY]

Writes a signed bundle DIR/<REPORT-ID>/ (and DIR/<REPORT-ID>.tar.gz) holding the tables (CSV), a Markdown and
a self-contained HTML report with charts, and the parameters as given; its predicate lists the report IDs of
the input bundles. Exit codes (harness.cli.exits, as the rest of kvgate): 0 written; 2 bad parameters or a
refused input bundle; 3 any other failure.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from ..cost import params as cost_params
from ..cost import report as cost_report
from ..errors import BundleError
from ..report.bundle import BundleInfo, write_bundle
from ..report.signing import resolve_signing_key
from .exits import EXIT_OK


def register(subparsers) -> None:
    """Add the ``cost`` subcommand."""
    p = subparsers.add_parser(
        "cost",
        help="costing model of the KV tier (signed bundle with tables, charts, report)",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--params", required=True, type=Path, help="params YAML (see workloads/cost-params.example.yaml)")
    p.add_argument("--bundle", action="append", default=[], type=Path,
                   help="a verified report bundle (dir or .tar.gz) whose G1/G2 measurements feed the model; repeatable")
    p.add_argument("--pubkey", action="append", default=[], type=Path,
                   help="public key of the matching --bundle (one per bundle, or one for all)")
    p.add_argument("--out", required=True, type=Path, help="directory that receives the output bundle")
    p.add_argument("--key", type=Path,
                   help="Ed25519 private key (from kvgate keygen); default: the development key, marked as such")
    p.set_defaults(func=handler)


def run(args) -> tuple[BundleInfo, Path | None]:
    """Resolve params and measured inputs, compute, write and sign. Returns the bundle and the development key's
    public key (None for an operator key). Raises HarnessError subclasses."""
    if args.pubkey and len(args.pubkey) not in (1, len(args.bundle)):
        raise BundleError(f"{len(args.bundle)} --bundle but {len(args.pubkey)} --pubkey (give one per bundle, or one)")
    if args.bundle and not args.pubkey:
        raise BundleError("--bundle needs --pubkey (the bundle signer's public key)")
    measured = []
    for i, b in enumerate(args.bundle):
        key = args.pubkey[i] if len(args.pubkey) > 1 else args.pubkey[0]
        measured.extend(cost_params.measured_from_bundle(b, key))
    resolved = cost_params.resolve(args.params, measured)
    signing = resolve_signing_key(args.key)
    if signing.kind == "development":
        print(f"no --key given: signing with the development key {signing.key_path} (marked as such)",
              file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".cost-staging-", dir=args.out))
    predicate = dict(cost_report.predicate(resolved), signing_key=signing.predicate_entry())
    try:
        tables = cost_report.write_staging(resolved, staging)
        info = write_bundle(staging, args.out, signing.private, predicate,
                                       render=cost_report.renderer(resolved, tables), move=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return info, signing.pub_path


def handler(args) -> int:
    """Errors propagate to kvgate's main, which maps them to exit codes (harness.cli.exits)."""
    info, pub = run(args)
    results = (info.path / "tables" / "results.csv").read_text().splitlines()
    values = dict(line.split(",")[:2] for line in results[1:])
    print(f"report {info.report_id}")
    print(f"bundle {info.path}")
    if info.tar_path:
        print(f"archive {info.tar_path}")
    if pub is not None:
        print(f"verify with: kvgate verify {info.tar_path or info.path} --pubkey {pub}")
    print(f"net_usd_per_month {values['net_usd_per_month']}  break_even_hit_rate {values['break_even_hit_rate']}  "
          f"capacity_tb {values['capacity_tb']}  throughput_gain {values['throughput_gain']}")
    return EXIT_OK
