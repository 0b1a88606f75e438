"""``kvgate gpu-node``: the parts of ``scripts/gpu-check.sh`` that read what the script's steps left on disk.

    kvgate gpu-node check RUN_DIR
    kvgate gpu-node inventory RUN_DIR --work-dir DIR --engine-python PY --out FILE [--target-size SIZE]
    kvgate gpu-node summary RUN_DIR --bundle DIR

The script runs each probe as a logged step (``RUN_DIR/steps/NAME/{argv,stdout,stderr,rc}``); these commands
parse them with harness/parsers/gpu.py. ``check`` says whether the node's driver, torch and LMCache's CUDA ops
pair (``pairing.json``; exit 3 with every problem and what the node needs when not), ``inventory`` writes the
node's inventory from its GPUs and their NUMA nodes, ``summary`` prints the figures of a verified bundle and the
H2D probe (``summary.json``).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import yaml

from ..parsers.gpu import (NVIDIA_SMI_Q, PCI_NUMA, SmiReport, TorchProbe, check_pairing, parse_h2d,
                           parse_torch_probe)
from ..rigs.gpunode import figures_text, gate_notes, gpu_figures, gpu_inventory
from ..safeio import InputFileError
from .exits import EXIT_INFRA, EXIT_OK

PROBE_STEP = "gpu-probe"
H2D_STEP = "h2d"


def register(subparsers) -> None:
    """Add ``gpu-node check|inventory|summary``."""
    p = subparsers.add_parser("gpu-node", help="read a GPU node check's steps (scripts/gpu-check.sh)",
                              description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="gpu_node_command", required=True)
    c = sub.add_parser("check", help="does this node's driver, torch and LMCache pair? (exit 3 with the reasons if not)")
    c.add_argument("run_dir", type=Path)
    c.set_defaults(func=cmd_check)
    i = sub.add_parser("inventory", help="write the node's inventory from its probes")
    i.add_argument("run_dir", type=Path)
    i.add_argument("--work-dir", required=True, help="the node's work directory, on the local disk under test")
    i.add_argument("--engine-python", required=True, help="the interpreter with torch, LMCache and vLLM")
    i.add_argument("--target-size", default="8 GiB", help="the file target's size (default 8 GiB)")
    i.add_argument("--out", required=True, type=Path)
    i.set_defaults(func=cmd_inventory)
    s = sub.add_parser("summary", help="print the figures of the verified bundle and the H2D probe")
    s.add_argument("run_dir", type=Path)
    s.add_argument("--bundle", required=True, type=Path, help="the bundle directory kvgate run wrote")
    s.set_defaults(func=cmd_summary)


def _step(run_dir: Path, name: str) -> tuple[int | None, str, str]:
    """(rc, stdout, stderr) of a logged step; rc None when the step left no rc (not run, or killed)."""
    d = run_dir / "steps" / name
    if not d.is_dir():
        raise InputFileError(str(d), None, "no such step directory (was the step run?)")

    def read(f: str) -> str:
        p = d / f
        return p.read_text(errors="replace") if p.is_file() else ""
    rc = read("rc").strip()
    return (int(rc) if rc.lstrip("-").isdigit() else None), read("stdout"), read("stderr")


def _why(rc: int | None, out: str, err: str, what: str) -> str:
    if rc == 127:
        return f"{what} not found (rc 127)"
    last = next((line.strip() for line in reversed((err + "\n" + out).splitlines()) if line.strip()), "")
    return f"rc {rc}" + (f": {last}" if last else "")


def _smi(run_dir: Path) -> tuple[SmiReport | None, str | None]:
    rc, out, err = _step(run_dir, NVIDIA_SMI_Q.step)
    if rc != 0:
        return None, _why(rc, out, err, "nvidia-smi")
    try:
        return NVIDIA_SMI_Q.parse(out), None
    except ValueError as exc:
        return None, f"{exc}"


def _probe(run_dir: Path) -> tuple[TorchProbe | None, str | None]:
    rc, out, err = _step(run_dir, PROBE_STEP)
    try:
        return parse_torch_probe(out), None
    except ValueError as exc:
        return None, f"{_why(rc, out, err, 'the engine interpreter')} ({exc})"


def cmd_check(args) -> int:
    smi, smi_error = _smi(args.run_dir)
    probe, probe_error = _probe(args.run_dir)
    pairing = check_pairing(smi, smi_error, probe, probe_error)
    doc = dataclasses.asdict(pairing)
    (args.run_dir / "pairing.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    if not pairing.ok:
        print("refused: this node cannot run kvgate's GPU gates:", file=sys.stderr)
        for p in pairing.problems:
            print(f"  - {p}", file=sys.stderr)
        if pairing.needs:
            print("the node needs:", file=sys.stderr)
            for n in pairing.needs:
                print(f"  - {n}", file=sys.stderr)
        return EXIT_INFRA
    assert smi is not None and probe is not None
    print(f"pairing OK: driver {smi.driver_version} (CUDA {smi.cuda_version}), {len(smi.gpus)} GPU(s) "
          f"({smi.gpus[0].name}), torch {probe.torch_version} (CUDA {probe.torch_cuda}), LMCache "
          f"{probe.lmcache_version} ({probe.ops_module} loads)")
    if probe.vllm_error:
        print(f"note: vLLM does not import in {probe.python} ({probe.vllm_error}): gate G2 will be ERROR",
              file=sys.stderr)
    return EXIT_OK


def cmd_inventory(args) -> int:
    smi, smi_error = _smi(args.run_dir)
    if smi is None:
        raise InputFileError(str(args.run_dir / "steps" / NVIDIA_SMI_Q.step / "stdout"), None,
                             f"no GPU report: {smi_error}")
    rc, out, _ = _step(args.run_dir, PCI_NUMA.step)
    numa = PCI_NUMA.parse(out) if rc == 0 else {}
    inv = gpu_inventory(smi, numa, work_dir=args.work_dir, engine_python=args.engine_python,
                        target_size=args.target_size)
    head = (f"# Written by scripts/gpu-check.sh (kvgate gpu-node inventory) from {args.run_dir}'s probes:\n"
            f"# nvidia-smi -q ({smi.driver_version}, CUDA {smi.cuda_version}) and each GPU's NUMA node.\n")
    args.out.write_text(head + yaml.safe_dump(inv, sort_keys=False))
    print(f"inventory: {args.out} ({len(smi.gpus)} GPU(s))")
    return EXIT_OK


def cmd_summary(args) -> int:
    verdicts_path = args.bundle / "verdicts.json"
    try:
        verdicts = json.loads(verdicts_path.read_text())
    except (OSError, ValueError) as exc:
        raise InputFileError(str(verdicts_path), None, f"cannot read the bundle's verdicts: {exc}") from exc
    smi, _ = _smi(args.run_dir)
    try:
        _, out, _ = _step(args.run_dir, H2D_STEP)
        h2d, h2d_error = parse_h2d(out)
    except (InputFileError, ValueError) as exc:
        h2d, h2d_error = (), str(exc)
    figures = gpu_figures(verdicts, h2d, smi)
    print(figures_text(figures), end="")
    for note in gate_notes(verdicts):
        print(note)
    if h2d_error:
        print(f"h2d: {h2d_error}", file=sys.stderr)
    print(f"overall: {verdicts.get('overall')}")
    (args.run_dir / "summary.json").write_text(json.dumps(
        {"overall": verdicts.get("overall"), "h2d_error": h2d_error, "gate_notes": gate_notes(verdicts),
         "figures": [dataclasses.asdict(f) for f in figures]}, indent=2, sort_keys=True) + "\n")
    return EXIT_OK
