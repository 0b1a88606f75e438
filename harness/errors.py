"""One exception root for kvgate, with config, transport, workload and bundle branches.

The CLI maps each branch to one exit code (harness.cli.exits.EXIT_FOR_ERROR); nothing below the CLI exits."""

from __future__ import annotations

from dataclasses import dataclass


class HarnessError(Exception):
    """Root of every error kvgate raises on purpose."""


@dataclass(frozen=True)
class ConfigIssue:
    """One problem in one configuration file, pinned to a line and a field path."""

    file: str
    line: int | None
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else f"{self.file}"
        return f"{where}: {self.path or '<root>'}: {self.message}"


class ConfigError(HarnessError):
    """Every issue found in the given configuration files, not only the first."""

    def __init__(self, issues: list[ConfigIssue] | ConfigIssue):
        self.issues = [issues] if isinstance(issues, ConfigIssue) else list(issues)
        super().__init__("\n".join(str(i) for i in self.issues))


class TransportError(HarnessError):
    """A node could not be reached or a transfer failed (not a command's non-zero exit)."""


class HostKeyError(TransportError):
    """An SSH host key is unknown or changed; the message says how to trust it."""


class WorkloadError(HarnessError):
    """A workload could not run (its evidence is still on disk)."""


class BundleError(HarnessError):
    """A bundle could not be written or read."""


class VerificationError(BundleError):
    """A bundle was read but does not verify (a file, a signature or a signing record does not match), so
    the command refused to act on it: a negative answer, not bad input."""
