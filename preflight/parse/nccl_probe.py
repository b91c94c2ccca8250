"""Reading back what the nccl-all-reduce probe printed (``preflight.collect.nccl`` runs it).

The probe's output is the first repetition's ``all_reduce_perf`` output and so on, each closed
by a marker line, after a header::

    # preflight: tool=/opt/nccl-tests/build/all_reduce_perf gpus=8 repetitions=5
    # nccl-tests version 2.19.6 ...            (the first repetition's output)
    ...
    # Avg bus bandwidth    : 211.3
    # preflight: repetition 1 exit=0 seconds=41
    ...
    # preflight: repetition 2 exit=124 seconds=300     (124: hung, stopped by timeout)

``parse_probe_output`` splits such output at the markers into repetitions, each parsed with
``parse_nccl_tests``. It also reads plain ``all_reduce_perf`` output saved without markers
(one repetition per run found), and output cut short by the probe's own timeout. The
multi-node stage writes its runs in the same shape.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from preflight.parse import ParseError
from preflight.parse.nccl_signatures import NcclSignature, nccl_signatures
from preflight.parse.nccl_tests import NcclRun, parse_nccl_tests

# Exit codes of `timeout` when it stopped a repetition: 124 after SIGTERM, 137 when the
# command ignored SIGTERM and the `-k` SIGKILL ended it (a process stuck in the driver).
TIMEOUT_EXITS = (124, 137)

_TOOL_LINE = re.compile(r"^# preflight: tool=(\S+) gpus=([0-9]+) repetitions=([0-9]+)\s*$")
_MARKER = re.compile(r"^# preflight: repetition ([0-9]+) exit=([0-9]+) seconds=([0-9]+)\s*$")


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
