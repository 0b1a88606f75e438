"""``kvgate cost``: the costing model (pure, vectorized), its parameters (strict YAML and measured inputs from
verified bundles) and its signed report."""
