"""Running on nodes: fan-out to every node with failures as data, the failure-share policy, a synchronized
launch, clock alignment, and the node facts every run records."""
