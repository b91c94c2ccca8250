"""Shell scripts the probes run on nodes, read with importlib.resources, never imported."""
