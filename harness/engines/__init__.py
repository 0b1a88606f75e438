"""Engine profiles (data in workloads/engines/*.yaml) and the pure helpers G2 needs around them."""
