"""The kvgate command line (``kvgate = harness.cli.main:main``)."""
