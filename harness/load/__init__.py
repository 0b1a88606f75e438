"""Serving load: session traces (read, synthesised, replay-ready prompts) and what a trace's reuse allows.

Pure code: no I/O but reading and writing trace files through kvgate's hardened readers.
"""
