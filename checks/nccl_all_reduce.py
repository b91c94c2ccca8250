"""nccl all_reduce on one node: does it finish, are its results right, is it steady, is it fast.

Input: the nccl-all-reduce probe (preflight/collect/nccl.py), all_reduce_perf (or its torch
fallback) run several times, each repetition closed by a marker with its exit code. Plain
all_reduce_perf output saved without markers is judged too, each run counting as a repetition.

How faulty is told from normal:
- Hang (``nccl-hang``, FAIL): a repetition stopped by its timeout (exit 124, or 137 when
  SIGTERM did not end it and timeout's SIGKILL did), or one the probe's own limit cut off
  (recorded as ``timed_out``). Only a limit that
  was hit makes a hang: that is what the word claims. (A plain output whose probe exited
  non-zero is the probe's failure, ERROR ``probe-failed`` naming the exit.)
- Incomplete (``nccl-incomplete``, ERROR): a repetition that ended without its results, with
  nothing recorded that says why: plain output that stops before its "Avg bus bandwidth"
  footer (after the device list, or part-way through the table) while the probe exited 0 or
  no exit was recorded, or a marked repetition that exited 0 without a table. A healthy
  all_reduce_perf always prints the footer, but a capture cut by hand or by a log excerpt looks
  the same as a run that stopped, so the evidence supports neither a pass nor a hang; the
  summary says where the output ends.
- Failure (``nccl-failed``, FAIL): a repetition that exited non-zero otherwise, or printed
  nccl-tests' "Test ... failure".
- Unreadable (ERROR, ``probe-unreadable``): a repetition that printed its "Avg bus bandwidth"
  footer, so the tool says it ran its table, but has no result row that reads. Neither a pass
  nor a hang: the output itself is mangled.
- Intermittent (``nccl-unstable``, FAIL): some repetitions hang or fail while others pass, the
  field sign of NIC firmware the driver does not expect.
- Variation (``nccl-unstable``, WARN): the coefficient of variation (sample stdev / mean) of busbw at the
  largest size over the passing repetitions above ``CV_TOLERANCE`` (5%). A chosen tolerance:
  room for boost clocks and the noise between back-to-back runs, well under the drop a link
  that retrains or a GPU that throttles causes.
- Corruption (``nccl-data-corruption``, FAIL): ``#wrong`` > 0 or "Out of bounds values" > 0 in any
  repetition, on a single GPU too.
- Bandwidth (``nccl-low-bandwidth``): busbw at the largest size (the higher of out-of-place and
  in-place: the same bytes over the same links; the torch fallback measures in-place only),
  median over the passing repetitions, against the profile's ``nccl.all_reduce_busbw_gbs``.
  Judged only when the largest size is at least 1 GiB (smaller messages do not reach the link
  rate; with NVLS even 256 MB is too small: docs/sources.md §3), the run is all_reduce on one host, and
  it had as many ranks as the profile has GPUs (its figure is for the whole board). Below 85%
  of the figure WARNs: the figures are measured peaks, and 15% absorbs NCCL versions and
  run-to-run noise, while the ring-class figure (~370 against ~480 GB/s with NVLS on 8 x
  H100/H200, docs/sources.md §3) falls below the line, as it should on a board where NVLS is the
  default. Below 50% FAILs: more than any algorithm choice explains, so a link or GPU is
  missing from the path. No figure in the profile: the figure is reported, not judged (and the
  fleet check nccl-fleet-relative holds it against the fleet's own median).
- Site baseline (a profile written by ``preflight baseline``): its figure is the median of the
  site's known-good runs and it carries its own lines (``nccl.all_reduce_busbw_warn_gbs``,
  ``..._fail_gbs``: median - margin and median - 2 x margin, preflight/knowledge/site_profile.py),
  which replace the 85 % / 50 % ratios. Its ``nccl.all_reduce_ranks``, ``nccl.all_reduce_bytes``
  and ``nccl.all_reduce_gpu_model`` say what the figure was measured on: another rank count,
  largest size or GPU model (from the run's device lines) is not judged against it, which keeps
  a baseline derived under the generic profile off the other GPUs that profile also takes.
- Single GPU (one rank): no inter-GPU traffic, busbw is 0 by definition, so bandwidth is not
  applicable (SKIP), but a hang or corruption still FAILs.
- NCCL log lines (``NCCL_SIGNATURES`` in preflight/parse/nccl_tests.py) become symptoms:
  transport errors FAIL, degraded paths and unknown WARN lines WARN, and "no IB device", which
  is expected when all ranks are on one host, is only noted.
"""

from __future__ import annotations

import re
from collections import Counter
from statistics import mean, median, stdev

from preflight.check import error, fail, host_check, ok, skip, warn
from preflight.collect.nccl import PROBE_ID
from preflight.model import Evidence
from preflight.parse.nccl_probe import NcclProbeOutput, Repetition
from preflight.parse.nccl_tests import NcclRow, NcclRun, largest_row

CV_TOLERANCE = 0.05
LOW_WARN = 0.85  # of the profile's figure
LOW_FAIL = 0.50
MIN_JUDGED_BYTES = 1 << 30
# NCCL reports these when a transfer or connection failed: the collective cannot be trusted.
FATAL_SIGNATURES = ("nccl-ib-retry-exceeded", "nccl-ib-completion-error", "nccl-ib-qp-timeout",
                    "nccl-net-unreachable", "nccl-socket-refused")
SINGLE_HOST_EXPECTED = ("nccl-no-ib-device",)
_REDUCTIONS = {"sum", "prod", "min", "max", "avg"}


@host_check("nccl-all-reduce", facts=["nccl"],
            summary="nccl all_reduce: completes, right results, steady across repetitions, busbw vs profile")
def nccl_all_reduce(host):
    if host.result(PROBE_ID) is None:
        return skip("not run: an active test (`preflight run` without --quick runs it)")
    out: NcclProbeOutput = host.nccl
    v = _Verdict()
    reps = out.repetitions
    states = [(rep, *_state(rep, out)) for rep in reps]
    passed = [rep for rep, state, _ in states if state == "passed"]
    v.data.update(tool=out.tool, repetitions=len(reps), passed=[r.number for r in passed],
                  hung=[r.number for r, state, _ in states if state == "hung"],
                  failed=[r.number for r, state, _ in states if state == "failed"])
    _judge_completion(host, out, states, v)
    _judge_corruption(host, reps, v)
    single = _judge_bandwidth(host, [r for r in passed if _main_run(r)], v)
    _judge_signatures(host, out, reps, v)

    summary = "; ".join(v.fails + v.warns + v.infos)
    unreadable = [(rep.number, why) for rep, state, why in states if state == "unreadable"]
    if unreadable and not v.fails:
        first, why = unreadable[0]
        return error(f"unreadable output: {len(unreadable)} of {len(reps)} repetitions (#{first}: {why})"
                     + (f"; {summary}" if summary else ""), symptoms=["probe-unreadable", *v.symptoms],
                     evidence=[_tail_evidence(host), *v.evidence], data=v.data)
    incomplete = [(rep.number, why) for rep, state, why in states if state == "incomplete"]
    if incomplete:
        v.data["incomplete"] = [n for n, _ in incomplete]
    if incomplete and not v.fails:
        first, why = incomplete[0]
        return error(f"incomplete evidence, not a hang: {len(incomplete)} of {len(reps)} repetitions "
                     f"ended without their results (#{first}: {why})" + (f"; {summary}" if summary else ""),
                     symptoms=["nccl-incomplete", *v.symptoms], evidence=[_tail_evidence(host), *v.evidence],
                     data=v.data)
    if not reps and not v.fails:
        return error(f"no all_reduce result in the output{'; ' + summary if summary else ''}",
                     symptoms=v.symptoms, evidence=v.evidence, data=v.data)
    if v.fails:
        return fail(summary, symptoms=v.symptoms, evidence=v.evidence, data=v.data)
    if v.warns:
        return warn(summary, symptoms=v.symptoms, evidence=v.evidence, data=v.data)
    if single:
        return skip(summary, evidence=v.evidence, data=v.data)
    return ok(summary, evidence=v.evidence, data=v.data)


class _Verdict:
    """What the judges found: phrases for the summary by severity, symptoms, evidence, data."""

    def __init__(self) -> None:
        self.fails: list[str] = []
        self.warns: list[str] = []
        self.infos: list[str] = []
        self.symptoms: list[str] = []
        self.evidence: list[Evidence | None] = []
        self.data: dict = {}

    def add(self, severity: str, phrase: str, symptom: str | None = None, *evidence: Evidence | None) -> None:
        {"fail": self.fails, "warn": self.warns, "info": self.infos}[severity].append(phrase)
        if symptom and symptom not in self.symptoms:
            self.symptoms.append(symptom)
        self.evidence.extend(evidence)


# --------------------------------------------------------------------------- repetitions


def _state(rep: Repetition, out: NcclProbeOutput) -> tuple[str, str]:
    """("passed" | "hung" | "failed" | "unreadable" | "incomplete", why) for one repetition."""
    if rep.exit_code in (0, None) and rep.complete and not rep.errors and not any(run.rows for run in rep.runs):
        # The tool printed its footer, so it says it ran its table, yet no result row reads:
        # the output is mangled, neither a pass nor a hang.
        return "unreadable", "an 'Avg bus bandwidth' footer but no result row could be read"
    bad_rows = [n for run in rep.runs for n in run.notes if "could not read table row" in n]
    if bad_rows:
        # A result row that does not read (NaN or infinity where a count belongs, a mangled line)
        # may be the very row that fails: the rest of the table is no pass of it.
        return "unreadable", f"{len(bad_rows)} result row(s) could not be read ({bad_rows[0][:160]})"
    marked = rep.state()
    if marked is not None:
        if marked[0] == "failed" and rep.exit_code == 0 and not rep.errors and not rep.complete:
            return "incomplete", f"exited 0 without a results table, {_where_it_ends(rep)}"
        return marked
    # No exit code: the probe's own timeout cut it, or the output is a plain saved capture.
    if out.cut_off and rep is out.repetitions[-1]:
        return "hung", "still running when the probe's own timeout stopped it"
    if rep.errors:
        return "failed", rep.errors[0]
    if not rep.complete:
        # A probe that exited non-zero never gets here (the nccl fact refuses it, naming the
        # exit), and one its limit stopped is cut_off above: so nothing says this one hung.
        return "incomplete", (f"{_where_it_ends(rep)}, and no timeout was recorded: "
                              "the run stopped early or the capture was cut")
    return "passed", ""


def _judge_completion(host, out: NcclProbeOutput, states: list[tuple[Repetition, str, str]],
                      v: _Verdict) -> None:
    total = len(states)
    for kind, symptom in (("hung", "nccl-hang"), ("failed", "nccl-failed")):
        these = [(rep.number, why) for rep, state, why in states if state == kind]
        if these:
            numbers = [n for n, _ in these]
            first, why = these[0]
            v.add("fail", f"{len(these)} of {total} repetitions {kind} (#{first}: {why})", symptom,
                  _marker_evidence(host, numbers) if out.marked else _tail_evidence(host))
    passed = sum(1 for _, state, _ in states if state == "passed")
    # Only repetitions that gave a verdict count: an incomplete or unreadable one says nothing.
    judged = sum(1 for _, state, _ in states if state in ("passed", "hung", "failed"))
    if 0 < passed < judged:
        v.add("fail", f"intermittent: {passed} of {judged} repetitions passed", "nccl-unstable")


def _where_it_ends(rep: Repetition) -> str:
    """Where a repetition's output stops, in words: after the device list, or after N rows."""
    rows = [row for run in rep.runs for row in run.rows]
    if rows:
        return (f"ended after {len(rows)} result rows (up to {rows[-1].size_bytes} B) "
                "without its 'Avg bus bandwidth' footer")
    ranks = max((len(run.devices) for run in rep.runs), default=0)
    if ranks:
        return f"ended after the device list ({ranks} rank{'s' if ranks != 1 else ''}), before any result row"
    return "ended before any result row"


def _marker_evidence(host, numbers: list[int]) -> Evidence | None:
    wanted = "|".join(str(n) for n in numbers)
    return host.excerpt(PROBE_ID, rf"^# preflight: repetition (?:{wanted}) exit=", context=1)


def _tail_evidence(host) -> Evidence:
    lines = [line.strip() for line in host.result(PROBE_ID).text.splitlines() if line.strip()]
    return Evidence(PROBE_ID, "\n".join(lines[-3:]))


def _judge_corruption(host, reps: tuple[Repetition, ...], v: _Verdict) -> None:
    wrong_rows = [(rep.number, row) for rep in reps for run in rep.runs for row in run.rows if _wrong(row)]
    out_of_bounds = sum(run.out_of_bounds or 0 for rep in reps for run in rep.runs)
    wrong = sum(_wrong(row) for _, row in wrong_rows)
    v.data["wrong"] = wrong
    v.data["out_of_bounds"] = out_of_bounds
    if not wrong and not out_of_bounds:
        return
    where = sorted({n for n, _ in wrong_rows})
    sizes = sorted({row.size_bytes for _, row in wrong_rows})
    phrase = (f"wrong results: {wrong} wrong values at {', '.join(_size(s) for s in sizes[:4])}"
              f" in repetition(s) {', '.join(map(str, where))}" if wrong
              else f"wrong results: {out_of_bounds} out-of-bounds values")
    size_rx = "|".join(str(s) for s in sizes[:4]) or "x^"
    v.add("fail", phrase, "nccl-data-corruption",
          host.excerpt(PROBE_ID, rf"^\s*(?:{size_rx})\s+\d+\s+\S", limit=4),
          host.excerpt(PROBE_ID, r"Out of bounds values\s*:\s*[1-9]", limit=2))


def _wrong(row: NcclRow) -> int:
    halves = [row.in_place] + ([row.out_of_place] if row.out_of_place else [])
    return sum(h.wrong or 0 for h in halves)


# --------------------------------------------------------------------------- bandwidth


def _main_run(rep: Repetition) -> NcclRun | None:
    """The repetition's run with results (the last, when a capture holds several)."""
    with_rows = [run for run in rep.runs if run.rows]
    return with_rows[-1] if with_rows else None


def _busbw(row: NcclRow) -> float:
    return max(row.in_place.busbw, row.out_of_place.busbw if row.out_of_place else 0.0)


def _judge_bandwidth(host, passed: list[Repetition], v: _Verdict) -> bool:
    """Judge busbw over the passing repetitions; True when the run was on a single GPU."""
    if not passed:
        return False
    runs = [_main_run(r) for r in passed]
    nranks = Counter(run.nranks for run in runs).most_common(1)[0][0]
    v.data["nranks"] = nranks
    if nranks == 1:
        done = f"{len(passed)} of {v.data['repetitions']} repetitions completed"
        expected = host.profile.gpu_count
        if isinstance(expected, int) and expected > 1:
            # A board of several GPUs (the profile chosen) is not a single-GPU node: say the run
            # was, and leave the count to gpu-inventory (issue 33).
            v.add("info", f"the run used 1 GPU where a {host.profile.name} has {expected} (gpu-inventory judges "
                          f"the count): bandwidth not judged ({done})")
        else:
            v.add("info", f"single GPU: bandwidth not applicable ({done})")
        return True
    largest = max(largest_row(run).size_bytes for run in runs)
    figures = [(rep.number, _busbw(largest_row(run))) for rep, run in zip(passed, runs, strict=True)
               if largest_row(run).size_bytes == largest]
    values = [b for _, b in figures]
    middle = median(values)
    cv = stdev(values) / mean(values) if len(values) > 1 and mean(values) > 0 else None
    v.data.update(largest_bytes=largest, busbw_gbs=dict(figures), busbw_median_gbs=middle, cv=cv)
    on = f" on {nranks} GPUs" if nranks else ""
    measured = (f"busbw {middle:.1f} GB/s at {_size(largest)}{on}"
                + (f" (median of {len(values)}, CV {cv:.1%})" if cv is not None else ""))
    rows = host.excerpt(PROBE_ID, rf"^\s*{largest}\s+\d+\s+\S+", limit=3)
    if cv is not None and cv > CV_TOLERANCE:
        spread = ", ".join(f"#{n} {b:.1f}" for n, b in figures)
        v.add("warn", f"busbw varies between repetitions: CV {cv:.1%} > {CV_TOLERANCE:.0%} ({spread} GB/s)",
              "nccl-unstable", rows)

    reason = _why_no_threshold(host, runs, nranks, largest)
    if reason:
        v.add("info", f"{measured}; {reason}", None, rows)
        return False
    expected = float(host.profile.get("nccl.all_reduce_busbw_gbs"))
    site_warn = host.profile.get("nccl.all_reduce_busbw_warn_gbs")
    site_fail = host.profile.get("nccl.all_reduce_busbw_fail_gbs")
    ratio = middle / expected
    if site_warn is not None and site_fail is not None:
        v.data.update(expected_busbw_gbs=expected, threshold_gbs=site_warn, fail_threshold_gbs=site_fail)
        versus = (f"{measured}, {ratio:.1%} of the site baseline's median {expected:g} GB/s ({host.profile.id}; "
                  f"warn below {site_warn:g}, fail below {site_fail:g} GB/s)")
        severity = "fail" if middle < site_fail else "warn" if middle < site_warn else "info"
        v.add(severity, f"low bandwidth: {versus}" if severity != "info" else versus,
              "nccl-low-bandwidth" if severity != "info" else None, rows)
        return False
    v.data.update(expected_busbw_gbs=expected, threshold_gbs=expected * LOW_WARN)
    versus = (f"{measured}, {ratio:.1%} of the {expected:g} GB/s {host.profile.id} expects"
              f" (warn below {LOW_WARN:.0%}, fail below {LOW_FAIL:.0%})")
    if ratio < LOW_FAIL:
        v.add("fail", f"low bandwidth: {versus}", "nccl-low-bandwidth", rows)
    elif ratio < LOW_WARN:
        v.add("warn", f"low bandwidth: {versus}", "nccl-low-bandwidth", rows)
    else:
        v.add("info", versus, None, rows)
    return False


def _why_no_threshold(host, runs: list[NcclRun], nranks: int | None, largest: int) -> str | None:
    """Why this measurement cannot be held against the profile's figure; None when it can."""
    collective = _collective(runs[0])
    hosts = {d.host for run in runs for d in run.devices}
    expected = host.profile.get("nccl.all_reduce_busbw_gbs")
    gpus = host.profile.get("nccl.all_reduce_ranks") or host.profile.gpu_count
    site_bytes = host.profile.get("nccl.all_reduce_bytes")
    site_model = host.profile.get("nccl.all_reduce_gpu_model")
    models = {d.name for run in runs for d in run.devices if d.name}
    if collective != "all_reduce":
        return f"a {collective} run, not all_reduce: no threshold"
    if largest < MIN_JUDGED_BYTES:
        return f"largest size below {_size(MIN_JUDGED_BYTES)}: a connectivity run, no bandwidth threshold"
    if len(hosts) > 1:
        return f"ranks on {len(hosts)} hosts: the single-node figure does not apply"
    if expected is None:
        return f"profile {host.profile.id} has no all_reduce figure: reported, not judged"
    if nranks is None:
        return "rank count not in the output: not judged against the profile"
    if gpus is not None and nranks != gpus:
        return f"{nranks} ranks, but the {expected:g} GB/s of {host.profile.id} is for {gpus} GPUs: not judged"
    if site_model is not None and models != {site_model}:
        return (f"GPU model {', '.join(sorted(models)) or 'not in the output'}, but the {expected:g} GB/s of "
                f"{host.profile.id} is for {site_model}: not judged")
    if site_bytes is not None and largest != site_bytes:
        return (f"largest size {_size(largest)}, but the {expected:g} GB/s of {host.profile.id} was measured at "
                f"{_size(site_bytes)}: not judged")
    return None


def _collective(run: NcclRun) -> str:
    if run.collective:
        return run.collective
    redops = {row.redop for row in run.rows}
    # all_reduce_perf without its header: reductions carry an operator; gathers print "none".
    if redops & _REDUCTIONS:
        return "all_reduce"
    return f"non-reduction (redop {'/'.join(sorted(redops)) or 'empty'})"


# --------------------------------------------------------------------------- NCCL log lines


def _judge_signatures(host, out: NcclProbeOutput, reps: tuple[Repetition, ...], v: _Verdict) -> None:
    hosts = {d.host for rep in reps for run in rep.runs for d in run.devices}
    seen: dict[str, list] = {}
    for sig in out.signatures:
        seen.setdefault(sig.symptom, []).append(sig)
    noted = []
    for symptom, sigs in seen.items():
        if symptom in SINGLE_HOST_EXPECTED and len(hosts) <= 1:
            noted.append(symptom)
            continue
        severity = "fail" if symptom in FATAL_SIGNATURES else "warn"
        count = f" ({len(sigs)} lines)" if len(sigs) > 1 else ""
        # The unknown WARN is best described by itself; the others by their meaning's lead.
        what = (sigs[0].line.split("NCCL WARN", 1)[-1].strip()[:120] if symptom == "nccl-warn"
                else re.split(r"[:;]|, so | \(", sigs[0].meaning)[0])
        v.add(severity, f"NCCL: {what}{count}", symptom, Evidence(PROBE_ID, sigs[0].line[:300]))
    v.data["signatures"] = list(seen)
    if noted:
        v.data["noted_signatures"] = noted


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):g} {unit}"
    return f"{n} B"
