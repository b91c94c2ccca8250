"""Code that runs ON a node, shipped there as files (one tar over SSH stdin, or as a probe
argument): the soak agent, the NVML sampler, the burn engine, the vLLM engine and its load
generator, and the torch all_reduce fallback.

A node has python3 and its own tools, not preflight: nothing here imports preflight, and
modules import their siblings by plain name when run as scripts. Contract strings the
controller also uses (CSV columns, format names) are kept in step with
``preflight.contracts`` by a test.
"""
