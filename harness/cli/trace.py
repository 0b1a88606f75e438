"""``kvgate trace``: session traces for load replay.

    kvgate trace synth --out FILE [--shape sessions|multi-turn|session-recovery|fan-out] [--FIELD VALUE]...
                       (sessions: --sessions N --turns T --system-prompts K --system-prompt-tokens S
                       --user-tokens U --output-tokens O --rate-rps R --burstiness B --think-time-s X
                       --block-tokens 512 --seed 0; the other shapes' fields: --help)
    kvgate trace stats FILE [--format auto|mooncake|bailian] [--capacity-tokens N]... [--engine-block-tokens E]
                       [--max-requests N] [--json]

``synth`` writes a Mooncake-format JSONL trace of the declared shape (harness/load/synth.py: the same pure
function a gate's ``load: {<shape>: ...}`` replays, so the file and the gate's trace are one); ``stats`` prints a
trace's reuse and, per cache capacity, the hit rate an LRU cache and the offline ideal would reach
(harness/load/reuse.py): the bound a measured hit rate is compared with. Exit codes as the rest of kvgate: 0
done, 2 bad input (a trace line that is wrong is named by file:line: field).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import tempfile
from pathlib import Path

from ..errors import ConfigError, ConfigIssue
from ..load.reuse import reuse_stats
from ..load.synth import SHAPES, shape_trace
from ..load.traces import cut, read_trace, trace_lines
from ..paths import given_or_shipped
from .exits import EXIT_OK


def register(subparsers) -> None:
    """Add the ``trace`` subcommands."""
    p = subparsers.add_parser("trace", help="session traces: synthesise one, or print a trace's reuse",
                              description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="trace_command", required=True)
    s = sub.add_parser("synth", help="write a synthetic session trace (Mooncake JSONL)")
    s.add_argument("--out", required=True, type=Path, help="the trace file to write (refused if it exists)")
    s.add_argument("--shape", choices=sorted(SHAPES), default="sessions",
                   help="the trace's shape (default sessions); as a gate's load: {<shape with _>: ...}")
    for name, kind in _shape_options().items():
        takes = ", ".join(f"{shape} (default {default})" for shape, default in kind[1])
        s.add_argument("--" + name.replace("_", "-"), type=kind[0], default=None, help=takes)
    s.set_defaults(func=cmd_synth)
    st = sub.add_parser("stats", help="a trace's reuse and the ideal hit rate for given cache capacities")
    st.add_argument("trace", type=Path, help="a trace file, or the name of one kvgate ships in traces/")
    st.add_argument("--format", choices=["auto", "mooncake", "bailian"], default="auto")
    st.add_argument("--block-tokens", type=int, help="tokens per hash id (default: the format's, 512 or 16)")
    st.add_argument("--capacity-tokens", action="append", default=[],
                    help="a cache capacity in tokens (1M, 250k, 65536); repeatable")
    st.add_argument("--engine-block-tokens", type=int, help="the engine's block or chunk size (default: the trace's)")
    st.add_argument("--max-requests", type=int, help="its first N requests only (as a gate's load: max_requests)")
    st.add_argument("--json", action="store_true", help="print the figures as JSON")
    st.set_defaults(func=cmd_stats)


def _shape_options() -> dict[str, tuple[type, list[tuple[str, object]]]]:
    """Every field of every shape: its type and which shapes take it, with their defaults."""
    out: dict[str, tuple[type, list[tuple[str, object]]]] = {}
    for shape, (cls, _) in SHAPES.items():
        for f in dataclasses.fields(cls):
            out.setdefault(f.name, (type(f.default), []))[1].append((shape, f.default))
    return out


def cmd_synth(args) -> int:
    cls = SHAPES[args.shape][0]
    fields = {f.name for f in dataclasses.fields(cls)}
    given = {name: getattr(args, name) for name in _shape_options() if getattr(args, name) is not None}
    alien = sorted(set(given) - fields)
    if alien:
        raise ConfigError([ConfigIssue("<command line>", None, "--" + a.replace("_", "-"),
                                       f"not a field of shape {args.shape} (its fields: "
                                       f"{', '.join('--' + f.replace('_', '-') for f in sorted(fields))})")
                           for a in alien])
    shape = cls(**given)
    bad = shape.check()
    if bad:
        raise ConfigError([ConfigIssue("<command line>", None, "--" + b.split(":")[0].replace("_", "-"),
                                       b.split(": ", 1)[1]) for b in bad])
    out = Path(args.out)
    if out.exists() or out.is_symlink():
        raise ConfigError([ConfigIssue("<command line>", None, "--out", f"{out} exists; refusing to overwrite it")])
    trace = shape_trace(args.shape, shape)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent or ".")
    try:
        with os.fdopen(fd, "w") as f:
            for line in trace_lines(trace):
                f.write(line + "\n")
        os.link(tmp, out)  # never over a file that appeared meanwhile
    finally:
        os.unlink(tmp)
    st = reuse_stats(trace)
    print(f"{out}: {args.shape} shape, {st.requests} requests"
          + (f" in {st.sessions} sessions" if st.sessions else "") + f" over {st.duration_s:.1f} s, "
          f"{st.prompt_tokens} prompt tokens, working set {st.working_set_tokens} tokens, "
          f"unbounded-cache hit rate {st.unbounded_hit_rate:.3f}")
    return EXIT_OK


_SUFFIX = {"": 1, "k": 10 ** 3, "K": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9, "Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30}


def _tokens(text: str) -> int:
    """A token count: 65536, 250k, 1.5M, 64Ki."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(k|K|M|G|Ki|Mi|Gi)?\s*", text)
    value = float(m.group(1)) * _SUFFIX[m.group(2) or ""] if m else 0.0
    if value < 1 or value != int(value):
        raise ConfigError([ConfigIssue("<command line>", None, "--capacity-tokens",
                                       f"{text!r}: expected a whole number of tokens (65536, 250k, 1M, 64Ki)")])
    return int(value)


def cmd_stats(args) -> int:
    caps = [_tokens(c) for c in args.capacity_tokens]
    if args.max_requests is not None and args.max_requests < 1:
        raise ConfigError([ConfigIssue("<command line>", None, "--max-requests", "must be >= 1")])
    trace = cut(read_trace(given_or_shipped(args.trace, "traces"), args.format, args.block_tokens), args.max_requests)
    st = reuse_stats(trace, caps, args.engine_block_tokens)
    if args.json:
        print(json.dumps(dataclasses.asdict(st), indent=1))
        return EXIT_OK
    print(f"{args.trace}: {trace.format} trace, {st.requests} requests"
          + (f" in {st.sessions} sessions" if st.sessions else "") + f" over {st.duration_s:.1f} s")
    print(f"  prompt tokens {st.prompt_tokens}, output tokens {st.output_tokens}; blocks of {st.block_tokens} "
          f"tokens, {st.distinct_blocks} distinct: working set {st.working_set_tokens} tokens")
    print(f"  hit rate with an unbounded cache: {st.unbounded_hit_rate:.3f} (engine blocks of "
          f"{st.engine_block_tokens} tokens)")
    for c in st.capacities:
        print(f"  capacity {c.capacity_tokens} tokens: LRU {c.lru_hit_rate:.3f}, ideal {c.ideal_hit_rate:.3f}")
    return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run as: kvgate trace ...")
