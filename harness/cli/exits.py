"""The one map from what happened to kvgate's exit status, for every subcommand.

    0    success: every gate PASS (or INFO); a bundle verified; a command did what it was asked
    1    a negative answer: some gate FAIL, INVALID or SKIPPED; verification failed (a bundle that does not
         verify is not cosigned either); re-evaluated verdicts differ; a library site that does not match its
         bundles; a status that is not up
    2    bad input: a configuration file, the command line, a bundle that cannot be read or is refused
    3    the infrastructure failed: a node unreachable, a transport, the guest, the rig, a loopback that could
         not be provisioned, a gate ERROR
    4    a stop-loss was hit (STOP: later gates SKIPPED)
    128+N  stopped by signal N, after Ctrl-C's cleanup (partial results kept, no bundle): 130 SIGINT (Ctrl-C),
         143 SIGTERM (CI, Slurm, Kubernetes cancel), 129 SIGHUP; the shell's convention for a signal

Subcommands return one of these constants; errors they raise are mapped by :func:`exit_for_error` in
``harness.cli.main``. Nothing below the CLI exits.
"""

from __future__ import annotations

import signal

from ..errors import BundleError, ConfigError, HarnessError, VerificationError
from ..gates.verdict import Outcome
from ..safeio import InputFileError

EXIT_OK = 0
EXIT_NO = 1
EXIT_INPUT = 2
EXIT_INFRA = 3
EXIT_STOP = 4
EXIT_SIGNAL_BASE = 128  # + the signal's number, as a shell reports a command a signal ended
EXIT_INTERRUPTED = EXIT_SIGNAL_BASE + signal.SIGINT  # 130
EXIT_HANGUP = EXIT_SIGNAL_BASE + signal.SIGHUP  # 129
EXIT_TERMINATED = EXIT_SIGNAL_BASE + signal.SIGTERM  # 143

EXIT_FOR_OUTCOME = {
    Outcome.PASS: EXIT_OK, Outcome.INFO: EXIT_OK, Outcome.FAIL: EXIT_NO, Outcome.INVALID: EXIT_NO,
    Outcome.SKIPPED: EXIT_NO, Outcome.ERROR: EXIT_INFRA, Outcome.STOP: EXIT_STOP,
}

# Most specific first: a VerificationError is a BundleError; a ConfigError, a BundleError and an
# InputFileError are HarnessErrors too.
EXIT_FOR_ERROR: tuple[tuple[type[BaseException], int], ...] = (
    (VerificationError, EXIT_NO),
    (ConfigError, EXIT_INPUT),
    (BundleError, EXIT_INPUT),
    (InputFileError, EXIT_INPUT),
    (HarnessError, EXIT_INFRA),
    (KeyboardInterrupt, EXIT_INTERRUPTED),
)


def exit_for_interrupt(exc: KeyboardInterrupt) -> int:
    """128 + the number of the signal that stopped kvgate: ``exc.signum`` (the CLI's stop handlers set it), else
    SIGINT (Ctrl-C)."""
    return EXIT_SIGNAL_BASE + int(getattr(exc, "signum", signal.SIGINT))


def exit_for_error(exc: BaseException) -> int:
    """The exit status of an error a subcommand raised (one of :data:`EXIT_FOR_ERROR`; a stop signal's 128 + N)."""
    if isinstance(exc, KeyboardInterrupt):
        return exit_for_interrupt(exc)
    for kind, code in EXIT_FOR_ERROR:
        if isinstance(exc, kind):
            return code
    raise exc
