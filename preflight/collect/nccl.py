"""The nccl-all-reduce probe: all_reduce_perf repeated on a node, as one fixed script.

The probe is ``sh -c SCRIPT sh REPS MAX_BYTES SECONDS TESTS_DIR COOLDOWN FALLBACK_SOURCE
LIST_LIMIT IMPORT_LIMIT`` (``scripts/nccl_all_reduce.sh``), the run's options as positional
parameters, so no option is ever pasted into shell text. On the node it counts the GPUs
(``nvidia-smi -L``, under LIST_LIMIT: the run's ``--timeout``, as every other nvidia-smi call), finds
``all_reduce_perf`` (in TESTS_DIR, else on PATH) or else ``python3`` with torch (then it runs
``preflight/node/torch_allreduce.py``, passed as FALLBACK_SOURCE, with all_reduce_perf's
options; ``import torch`` is tried under IMPORT_LIMIT, ``IMPORT_FACTOR`` x ``--timeout``, as a
slow tool's limit is), and runs it REPS times, each under ``timeout``, with NCCL_DEBUG=WARN and stderr
merged into stdout so NCCL's warnings land beside the table. Each repetition is closed by a
marker line that ``preflight.parse.nccl_probe`` reads back.

The script exits 0 once it ran the repetitions, whatever they did (the markers say that), 127
when neither all_reduce_perf nor python3 with torch (nor nvidia-smi) is there, and 1 when
nvidia-smi lists no GPU.

The probe needs nvidia-smi and python3 besides all_reduce_perf (``calls``): on a node where
nvidia-smi already hung in this run, it is not run at all (preflight/node/schedule.py), instead of
waiting for nvidia-smi a second time.

It is the model for a parametrised probe: an options dataclass, ``arguments`` turning options
into the script's parameters and limit, and a ``Probe`` that names both.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files

from preflight.collect import scripts
from preflight.collect.probe import Probe
from preflight.node.torch_allreduce import parse_size as _size_in_bytes

PROBE_ID = "nccl-all-reduce"
KILL_AFTER_S = 10  # `timeout -k` of each repetition: SIGKILL this long after SIGTERM
SETUP_KILL_AFTER_S = 5  # `timeout -k` of the script's `nvidia-smi -L` and torch import check
SHELL_SLACK_S = 30  # the shell itself, around the setup
# `import torch` loads CUDA and NCCL libraries from disk: on a cold node it takes many times an
# nvidia-smi query, so it gets the multiple a slow tool gets (mlxfwmanager, probes.py).
IMPORT_FACTOR = 4.0
RUN_TIMEOUT_S = 30.0  # the run's --timeout when none is given (preflight run's default)

FALLBACK_SOURCE = files("preflight.node").joinpath("torch_allreduce.py").read_text()
SCRIPT = scripts.read("nccl_all_reduce.sh").replace("@KILL_AFTER@", str(KILL_AFTER_S))


@dataclass(frozen=True)
class NcclOptions:
    """The run's choices for the probe (``preflight run``'s "active tests" options)."""

    reps: int = 5
    max_bytes: int = 8 << 30
    timeout_s: float = 300.0  # per repetition
    tests_dir: str | None = None  # where all_reduce_perf lives on the nodes; None: PATH
    cooldown_s: float = 5.0  # between repetitions, so one run's heat does not slow the next
    # The run's --timeout: it bounds the script's setup (`nvidia-smi -L`, the torch import check),
    # so no inner limit of the script is fixed.
    setup_timeout_s: float = RUN_TIMEOUT_S

    def list_limit(self) -> float:
        return self.setup_timeout_s

    def import_limit(self) -> float:
        return IMPORT_FACTOR * self.setup_timeout_s

    def setup_s(self) -> float:
        """Time the script may spend before the first repetition."""
        return self.list_limit() + self.import_limit() + 2 * SETUP_KILL_AFTER_S + SHELL_SLACK_S


def parse_size(text: str) -> int:
    """``8G``, ``512M``, ``1024`` -> bytes (binary multiples, as all_reduce_perf reads them)."""
    size = _size_in_bytes(text)
    if size < 8:
        raise ValueError(f"{text!r} is below all_reduce_perf's smallest size (8 bytes)")
    return size


def probe_timeout(options: NcclOptions) -> float:
    """The whole probe's limit: every repetition may use its timeout, the SIGKILL grace and
    the cooldown, after the setup. It only backs up the per-repetition timeouts."""
    return options.reps * (options.timeout_s + KILL_AFTER_S + options.cooldown_s) + options.setup_s()


def arguments(options: NcclOptions) -> tuple[tuple[str, ...], float]:
    """The script's positional parameters for these options, and the probe's limit."""
    return ((str(options.reps), str(options.max_bytes), f"{options.timeout_s:g}", options.tests_dir or "",
             f"{options.cooldown_s:g}", FALLBACK_SOURCE, f"{options.list_limit():g}",
             f"{options.import_limit():g}"), probe_timeout(options))


PROBE = Probe(PROBE_ID, ("sh", "-c", SCRIPT, "sh"), "nccl-tests all_reduce_perf, repeated (active)",
              "all_reduce_perf", calls=("nvidia-smi", "python3"), active=True, options=NcclOptions,
              arguments=arguments)


def with_options(options: NcclOptions) -> Probe:
    """The nccl-all-reduce probe with this run's options as its arguments."""
    return PROBE.configured(options)
