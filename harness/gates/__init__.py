"""Gates: outcomes as data (:class:`~harness.gates.verdict.Verdict`), the pure evaluation of a workload's
metrics against a gate's thresholds, and the offline re-evaluation of a bundle from its raw files."""
