"""Code that runs ON a node, shipped there as files (one tar over SSH stdin, or as a probe
argument): the soak agent (``agent.py``, with ``agent_options.py``, its options; ``records.py``,
what it writes; ``sampler.py``, NVML; ``burn.py``, the burn engine), the vLLM engine
(``vllm_engine.py``, ``vllm_log.py``) and its load generator (``loadgen.py``,
``loadgen_config.py``, ``loadgen_bench.py``, ``loadgen_http.py``, ``loadgen_windows.py``), the
torch all_reduce fallback (``torch_allreduce.py``), and the Slurm task, or SSH channel, that
runs a node's probes (``probe_runner.py`` with ``schedule.py``, the per-node schedule the SSH
fan-out shares, ``localexec.py``, process-group timeouts ``LocalNode`` shares, and
``frames.py``, its output framing; shipped through srun's stdin or the channel's, see
``preflight.collect.node_runner``).

A node has python3 and its own tools, not preflight: nothing here imports preflight. A module
imports its siblings relatively when it is imported from this package, and by plain name when
it runs from a directory holding the files (``try: from . import x`` / ``except ImportError:
import x``), so both work. Contract strings the controller also uses (CSV columns, format and
file names) are kept in step with ``preflight.contracts`` by tests/test_contracts.py, and
``preflight.soak.ship.NODE_FILES`` says what travels with the agent.
"""
