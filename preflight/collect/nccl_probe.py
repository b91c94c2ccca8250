"""The nccl-all-reduce probe: the script that runs all_reduce_perf on a node, and reading back
what it prints.

The probe is ``sh -c SCRIPT sh REPS MAX_BYTES SECONDS TESTS_DIR COOLDOWN FALLBACK_SOURCE``: a
fixed script, with the run's options as positional parameters, so no option is ever pasted
into shell text. On the node it counts the GPUs (``nvidia-smi -L``), finds ``all_reduce_perf``
(in TESTS_DIR, else on PATH) or else ``python3`` with torch (then it runs
preflight/node/torch_allreduce.py, passed as FALLBACK_SOURCE, with all_reduce_perf's options), and
runs it REPS times, each under ``timeout``, with NCCL_DEBUG=WARN and stderr merged into stdout
so NCCL's warnings land beside the table. Its output::

    # preflight: tool=/opt/nccl-tests/build/all_reduce_perf gpus=8 repetitions=5
    # nccl-tests version 2.19.6 ...            (the first repetition's output)
    ...
    # Avg bus bandwidth    : 211.3
    # preflight: repetition 1 exit=0 seconds=41
    ...
    # preflight: repetition 2 exit=124 seconds=300     (124: hung, stopped by timeout)

The script exits 0 once it ran the repetitions, whatever they did (the markers say that), 127
when neither all_reduce_perf nor python3 with torch (nor nvidia-smi) is there, and 1 when
nvidia-smi lists no GPU.

``parse_probe_output`` splits such output at the markers into repetitions, each parsed with
``parse_nccl_tests``. It also reads plain ``all_reduce_perf`` output saved without markers
(one repetition per run found), and output cut short by the probe's own timeout.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib.resources import files
from typing import TYPE_CHECKING

from preflight.parse import ParseError
from preflight.parse.nccl_tests import (
    NcclRun,
    NcclSignature,
    nccl_signatures,
    parse_nccl_tests,
)
from preflight.node.torch_allreduce import parse_size as _size_in_bytes

if TYPE_CHECKING:
    from preflight.collect.probes import Probe

PROBE_ID = "nccl-all-reduce"
# Exit codes of `timeout` when it stopped a repetition: 124 after SIGTERM, 137 when the
# command ignored SIGTERM and the `-k` SIGKILL ended it (a process stuck in the driver).
TIMEOUT_EXITS = (124, 137)
KILL_AFTER_S = 10  # `timeout -k`: SIGKILL this long after SIGTERM
# Time the script may spend before the first repetition: `nvidia-smi -L` and the torch import
# check each run under their own limit (60 s and 120 s), plus slack for the shell itself.
SETUP_S = 60 + 120 + 30

FALLBACK_SOURCE = files("preflight.node").joinpath("torch_allreduce.py").read_text()

SCRIPT = r"""
reps=$1 max=$2 limit=$3 dir=$4 cooldown=$5 fallback=$6
command -v nvidia-smi >/dev/null 2>&1 || { echo "nvidia-smi not found: cannot count the GPUs" >&2; exit 127; }
ngpu=$(timeout -k 5 60 nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
[ "$ngpu" -gt 0 ] || { echo "nvidia-smi -L lists no GPU" >&2; exit 1; }
if [ -n "$dir" ]; then bin=$dir/all_reduce_perf; [ -x "$bin" ] || bin=
else bin=$(command -v all_reduce_perf) || bin=
fi
if [ -n "$bin" ]; then
  tool=$bin; set -- "$bin"
elif timeout -k 5 120 python3 -c 'import torch' >/dev/null 2>&1; then
  tool=torch-fallback; set -- python3 -u -c "$fallback"
else
  echo "all_reduce_perf not found (in ${dir:-PATH}) and python3 cannot import torch" >&2; exit 127
fi
echo "# preflight: tool=$tool gpus=$ngpu repetitions=$reps"
k=1
while [ "$k" -le "$reps" ]; do
  [ "$k" -gt 1 ] && sleep "$cooldown"
  start=$(date +%s)
  NCCL_DEBUG=WARN timeout -k @KILL_AFTER@ "$limit" "$@" -b 8 -e "$max" -f 2 -g "$ngpu" -c 1 -n 20 </dev/null 2>&1
  code=$?
  echo "# preflight: repetition $k exit=$code seconds=$(($(date +%s) - start))"
  k=$((k + 1))
done
exit 0
""".strip().replace("@KILL_AFTER@", str(KILL_AFTER_S))

_TOOL_LINE = re.compile(r"^# preflight: tool=(\S+) gpus=(\d+) repetitions=(\d+)\s*$")
_MARKER = re.compile(r"^# preflight: repetition (\d+) exit=(\d+) seconds=(\d+)\s*$")


@dataclass(frozen=True)
class NcclOptions:
    """The run's choices for the probe (``preflight run``'s "active tests" options)."""

    reps: int = 5
    max_bytes: int = 8 << 30
    timeout_s: float = 300.0  # per repetition
    tests_dir: str | None = None  # where all_reduce_perf lives on the nodes; None: PATH
    cooldown_s: float = 5.0  # between repetitions, so one run's heat does not slow the next


def parse_size(text: str) -> int:
    """``8G``, ``512M``, ``1024`` -> bytes (binary multiples, as all_reduce_perf reads them)."""
    size = _size_in_bytes(text)
    if size < 8:
        raise ValueError(f"{text!r} is below all_reduce_perf's smallest size (8 bytes)")
    return size


def probe_timeout(options: NcclOptions) -> float:
    """The whole probe's limit: every repetition may use its timeout, the SIGKILL grace and
    the cooldown, after the setup. It only backs up the per-repetition timeouts."""
    return options.reps * (options.timeout_s + KILL_AFTER_S + options.cooldown_s) + SETUP_S


def with_options(base: Probe, options: NcclOptions) -> Probe:
    """The catalogue's nccl-all-reduce probe with this run's options as its arguments."""
    return base.with_args(
        str(options.reps), str(options.max_bytes), f"{options.timeout_s:g}", options.tests_dir or "",
        f"{options.cooldown_s:g}", FALLBACK_SOURCE, timeout_s=probe_timeout(options),
    )


# --------------------------------------------------------------------------- reading back


@dataclass(frozen=True)
class Repetition:
    """One run of the tool, as a marker closed it (or as far as it got)."""

    number: int  # 1-based
    exit_code: int | None  # None: no marker closed it (plain saved output, or cut off)
    seconds: int | None
    runs: tuple[NcclRun, ...]  # normally one; none when it printed no nccl-tests output
    notes: tuple[str, ...]

    @property
    def timed_out(self) -> bool:
        return self.exit_code in TIMEOUT_EXITS

    @property
    def errors(self) -> list[str]:
        return [e for run in self.runs for e in run.errors]

    @property
    def complete(self) -> bool:
        """Every run reached its "Avg bus bandwidth" footer."""
        return bool(self.runs) and all(run.complete for run in self.runs)

    def state(self, launcher: str = "") -> tuple[str, str] | None:
        """("passed" | "hung" | "failed", why) from the exit code and the output; None when no
        marker gave an exit code, which each caller reads in its own light (a cut capture, a
        controller timeout). ``launcher`` names what exited ("mpirun") in the reason."""
        if self.timed_out:
            return "hung", f"stopped by its timeout after {self.seconds} s (exit {self.exit_code})"
        if self.exit_code is None:
            return None
        errors = self.errors
        if self.exit_code != 0:
            what = f"{launcher} exit" if launcher else "exit"
            return "failed", f"{what} {self.exit_code}" + (f": {errors[0]}" if errors else "")
        if errors:
            return "failed", errors[0]
        if not self.complete:
            return "failed", "exited 0 without a complete results table"
        return "passed", ""


@dataclass(frozen=True)
class NcclProbeOutput:
    tool: str | None  # all_reduce_perf's path, or "torch-fallback"; None for plain output
    gpus: int | None  # GPUs `nvidia-smi -L` listed on the node
    repetitions: tuple[Repetition, ...]
    marked: bool  # the probe's own output (markers); False: plain all_reduce_perf output
    cut_off: bool  # the probe's overall timeout stopped it; the last repetition never closed
    signatures: tuple[NcclSignature, ...]  # NCCL log lines that point at a cause, whole output
    notes: tuple[str, ...]


def parse_probe_output(text: str, cut_off: bool = False) -> NcclProbeOutput:
    """Repetitions of the probe's output; ``cut_off`` when its overall timeout stopped it.

    Raises ParseError only when there is nothing of the probe's nor of nccl-tests' in it."""
    lines = text.split("\n")
    tool = gpus = None
    marks: list[tuple[int, re.Match]] = []
    for i, line in enumerate(lines):
        if m := _MARKER.match(line.strip()):
            marks.append((i, m))
        elif (m := _TOOL_LINE.match(line.strip())) and tool is None:
            tool, gpus = m.group(1), int(m.group(2))
    signatures = nccl_signatures(text)
    if tool is None and not marks:
        return _plain(text, cut_off, signatures)

    notes: list[str] = []
    reps: list[Repetition] = []
    begin = 0
    for i, m in marks:
        reps.append(_repetition(int(m.group(1)), int(m.group(2)), int(m.group(3)), lines[begin:i]))
        begin = i + 1
    tail = "\n".join(lines[begin:])
    if _meaningful(tail):
        reps.append(_repetition(len(reps) + 1, None, None, lines[begin:]))
        if not cut_off:
            notes.append(f"repetition {len(reps)} has output but no closing marker")
    elif cut_off:
        notes.append("the probe was stopped by its timeout between repetitions")
    return NcclProbeOutput(tool, gpus, tuple(reps), True, cut_off, signatures,
                           tuple(notes) + _rep_notes(reps))


def _plain(text: str, cut_off: bool, signatures: tuple[NcclSignature, ...]) -> NcclProbeOutput:
    output = parse_nccl_tests(text)  # ParseError: not nccl-tests output at all
    reps = tuple(Repetition(i, None, None, (run,), ()) for i, run in enumerate(output.runs, start=1))
    notes = ("no preflight markers: plain nccl-tests output, one repetition per run",) + output.notes
    return NcclProbeOutput(None, None, reps, False, cut_off, signatures, notes)


def _repetition(number: int, exit_code: int | None, seconds: int | None, lines: list[str]) -> Repetition:
    body = "\n".join(line for line in lines if not _TOOL_LINE.match(line.strip()))
    try:
        output = parse_nccl_tests(body)
    except ParseError as exc:
        return Repetition(number, exit_code, seconds, (), (f"no nccl-tests output ({exc})",))
    return Repetition(number, exit_code, seconds, output.runs, output.notes)


def _meaningful(text: str) -> bool:
    return any(line.strip() for line in text.split("\n"))


def _rep_notes(reps: list[Repetition]) -> tuple[str, ...]:
    return tuple(f"repetition {r.number}: {note}" for r in reps for note in r.notes)
