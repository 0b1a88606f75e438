"""kvgate's stop signals: SIGTERM and SIGHUP raise a KeyboardInterrupt subclass (Ctrl-C's cleanup runs) and map to
128 + the signal's number in the one exit-code map; a signal the caller set to be ignored stays ignored (nohup)."""

import signal

import pytest

from harness.cli.exits import EXIT_HANGUP, EXIT_INTERRUPTED, EXIT_TERMINATED, exit_for_error
from harness.cli.main import Stopped, install_stop_handlers, restore_handlers


@pytest.fixture
def handlers():
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def test_exit_codes_of_stop_signals_are_128_plus_the_signal():
    assert (EXIT_INTERRUPTED, EXIT_HANGUP, EXIT_TERMINATED) == (130, 129, 143)
    assert exit_for_error(KeyboardInterrupt()) == 130
    assert exit_for_error(Stopped(signal.SIGTERM)) == 143 and exit_for_error(Stopped(signal.SIGHUP)) == 129
    assert isinstance(Stopped(signal.SIGTERM), KeyboardInterrupt) and str(Stopped(signal.SIGTERM)) == "SIGTERM"


def test_sigterm_raises_stopped_once_and_the_handlers_are_put_back(handlers, capsys):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    previous = install_stop_handlers()
    try:
        with pytest.raises(Stopped) as e:
            signal.raise_signal(signal.SIGTERM)
        assert e.value.signum == signal.SIGTERM
        signal.raise_signal(signal.SIGTERM)  # a second one while stopping: noted, not raised into the cleanup
        assert "SIGTERM received again: already stopping" in capsys.readouterr().err
    finally:
        restore_handlers(previous)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_signal_the_caller_ignores_stays_ignored(handlers):
    """``nohup kvgate run``: SIGHUP was set to be ignored; kvgate keeps it so (and still stops on SIGTERM)."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    previous = install_stop_handlers()
    try:
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_IGN, signal.SIG_DFL)
        signal.raise_signal(signal.SIGHUP)  # ignored: nothing raised
    finally:
        restore_handlers(previous)
