"""The workloads' kit: what every workload shares and no workload owns.

``base``: the workload contract (params, evidence, results, the registry), targets, cache drops, summaries;
``engine``: an engine process's lifecycle and handle; ``attach``: an engine someone else runs; ``phases``: the one
phase runner engine workloads share; ``pool``: the pool's own block device; ``probes``: node probes;
``targets``: where a target is; ``integrity``: the loopback's data check. The workload modules one level up
import from here and never from each other (the import contract in pyproject.toml)."""
