"""``kvgate render k8s`` and ``kvgate collect``: a suite's gates as Kubernetes Jobs, and their pods' files as a run."""

from __future__ import annotations

import sys
from pathlib import Path

from ..report.signing import resolve_signing_key
from ..suite.k8s import K8S_PROVENANCE, RENDER_FILE, collect_k8s, render_k8s
from .exits import EXIT_FOR_OUTCOME, EXIT_OK
from .suite import load


def cmd_render_k8s(args) -> int:
    written = render_k8s(load(args), Path(args.out), run_id=args.run_id)
    for path in written:
        print(f"wrote {path}")
    record = Path(args.out) / RENDER_FILE
    print(f"wrote {record} (the render record: keep it; kvgate collect --render {record} checks the results "
          "against it)")
    print(f"apply with: kubectl apply -f {args.out}; then copy the results volume's run directory and "
          f"run kvgate collect on it with --render {record}")
    return EXIT_OK


def cmd_collect(args) -> int:
    signing = resolve_signing_key(args.key)
    if signing.kind == "development":
        print(f"no --key given: signing with the development key {signing.key_path} (marked as such)",
              file=sys.stderr)
    outcome = collect_k8s(args.results, Path(args.out), signing.private, args.render, key_kind=signing.kind)
    print(f"evidence: {K8S_PROVENANCE} (kvgate measured none of it; the suite matches the render record)")
    for v in outcome.verdicts:
        actual = "—" if v.actual is None else f"{v.actual:.4g} {v.unit}"
        print(f"{v.gate_id:6} {v.outcome.value:8} {v.metric} = {actual} (pass {v.pass_threshold})  {v.reason}")
    print(f"overall: {outcome.overall.value}")
    print(f"report ID: {outcome.bundle.report_id}")
    print(f"bundle: {outcome.bundle.path}" + (f" ({outcome.bundle.tar_path})" if outcome.bundle.tar_path else ""))
    return EXIT_FOR_OUTCOME[outcome.overall]


def register(sub) -> None:
    """Add ``render k8s`` and ``collect``."""
    s = sub.add_parser("render", help="write a suite's gates as manifests for a scheduler (k8s: Indexed Jobs)")
    kinds = s.add_subparsers(dest="render_kind", required=True)
    k = kinds.add_parser("k8s", help="one ConfigMap and Indexed Job per gate (G3 only); nothing is applied")
    k.add_argument("inventory", help="node inventory YAML with a `k8s:` block")
    k.add_argument("gates", help="gate suite YAML")
    k.add_argument("--out", "-o", required=True, help="directory for GATE.yaml, one per gate")
    k.add_argument("--run-id", help="the run's directory in the results volume (default: run-UTC time stamp)")
    k.set_defaults(func=cmd_render_k8s)

    s = sub.add_parser("collect", help="turn the pods' files of a rendered run into a signed bundle")
    s.add_argument("results", help="the run's directory copied from the results volume (config/, GATE/...)")
    s.add_argument("--out", "-o", default="runs", help="directory for the run directory and the bundle")
    s.add_argument("--render", help="the render record kvgate render k8s wrote (MANIFESTS/render.json); required: a "
                   "results directory whose suite or specs differ from it is refused (exit 2)")
    s.add_argument("--key", help="Ed25519 private key (from kvgate keygen); default: a development key, marked as such")
    s.set_defaults(func=cmd_collect)
