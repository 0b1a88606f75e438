"""Answer kvgate's one facts command on a scripted node as a real node's shell would: every fact's argv
(one ``_f KEY LIMIT ARGV...`` line of the script) is answered by the test's own handler and framed the way
the script frames it (harness.parsers.facts), so the run goes through the real split-back and parsers."""

from __future__ import annotations

import shlex
from typing import Callable

from harness.parsers.facts import SECTION_MARK
from harness.transport.doubles import Call, Reply


def fact_lines(script: str) -> list[tuple[str, tuple[str, ...]]]:
    """(key, argv) of every fact the facts script runs, in order."""
    out = []
    body = script.split("\n}\n", 1)[1]
    for chunk in ("\n" + body).split("\n_f ")[1:]:
        words = shlex.split(chunk)
        out.append((words[0], tuple(words[2:])))
    return out


def is_facts_call(call: Call) -> bool:
    return call.argv[:2] == ("sh", "-c") and len(call.argv) == 3 and SECTION_MARK in call.argv[2]


def answer_facts(call: Call, per_fact: Callable[[tuple[str, ...]], Reply], t0: float = 1000.0) -> Reply:
    """The facts command's reply when each fact's argv gets ``per_fact(argv)``; a Reply with ``error`` (not
    installed) becomes the shell's exit 127."""
    out, err = [], []
    t = t0
    for key, argv in fact_lines(call.argv[2]):
        r = per_fact(argv)
        rc, stdout, stderr = (127, "", f"sh: 1: {argv[0]}: not found\n") if r.error else (r.rc, r.stdout, r.stderr)
        out.append(f"{SECTION_MARK} begin {key} t={t:.6f}\n{stdout}\n")
        err.append(f"{SECTION_MARK} begin {key}\n{stderr}\n")
        t += 0.01
        out.append(f"{SECTION_MARK} end {key} rc={rc} t={t:.6f}\n")
        err.append(f"{SECTION_MARK} end {key}\n")
    return Reply(rc=0, stdout="".join(out), stderr="".join(err))
