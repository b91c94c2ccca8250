"""DCGM diagnostics (``dcgm-diag``), DCGM's host engine (``dcgm-hostengine``) and its background
health watches (``dcgm-health``).

Input: the ``dcgm_diag`` fact, i.e. ``dcgmi diag -r LEVEL -j`` run by the ``dcgmi-diag`` probe
(active: level 1 in a plain ``preflight run``, ``--dcgm-level N`` for more, left out by
``--quick``), or a pasted text table saved as ``dcgmi-diag.txt``; and ``dcgmi discovery -l``.

Judged the way DCGM's own users asked for after being burnt (NVIDIA/DCGM issues 139, 198, 253, 284):
- Every test keeps its own word. A failed test FAILs the host, whatever its per-GPU rows say
  (DCGM 4.x prints ``GPU0: Pass`` under a pcie test that failed with an internal error).
- A skipped or not-run test that the level requires is never a pass: with nothing failed, such
  skips WARN (``dcgm-diag-incomplete``), naming the tests and DCGM's reason where it gave one; a
  diag that judged no test at all says so. The tests levels require (``REQUIRED``): the
  deployment checks, PCIe and GPU memory (level 2 on), the diagnostic, Targeted Stress and
  Targeted Power (level 3 on). A skip of any other test (EUD, a separately installed plugin that
  most nodes lack; memory bandwidth, pulse, memtest where the SKU has no entry) is a note on the
  verdict, not a warning: the level did not depend on it.
- A test that passed while it reported a warning (a memory test that "passes" after failing to
  allocate, DCGM_FR_MEMORY_ALLOC) WARNs with that warning: the pass did not measure what it says.
- An ``Error`` outside any test (a run stopped in its Deployment checks, a ``runtime_error``,
  dcgmi's ``Error:`` lines) FAILs; dcgmi unable to reach ``nv-hostengine`` is an ERROR (nothing
  was judged) with ``dcgm-hostengine-down`` and the way to start it.
- A diag stopped at its level's limit (``exit=124/137`` in the probe's closing line, or the probe's
  own limit cutting it) FAILs with ``dcgm-diag-hang``: a hang is a result (level 2 hangs on some B200).
- A failure whose code a power limit could explain (DCGM_FR_TARGET_POWER: Targeted Power did not
  reach its target) is ``dcgm-diag-failed`` with its code first; power capping is named beside it
  as a possible explanation (``power-capping-possible``, diagnosed with low confidence), never as
  the finding.
- Every warning's DCGM error code (from the JSON, or found from the message in a text table) is
  looked up in ``playbooks/dcgm_errors.yaml`` (NVIDIA's dcgm_errors.h): its name, NVIDIA's
  message, next step and severity go into the summary and ``data``, and its cause id becomes the
  symptom (row remap, ECC, PCIe, NVLink, thermal, fabric manager, or the DCGM causes of
  causes.yaml). A failure without a known code is ``dcgm-diag-failed``.
- Per-GPU results are kept in ``data.gpus`` (GPU index -> test -> status); a GPU the profile has
  but no result names is reported.
- ``dcgmi`` missing: SKIP with the reason when the level was the default, ERROR with
  ``tool-missing`` when the user asked for DCGM (``--dcgm-level``).

``dcgm-health`` reads ``dcgmi health -s a`` then ``-c -j`` (the ``dcgmi-health`` probe, static: it
loads nothing) or a pasted ``dcgmi health -c`` report. Each incident keeps its entity, subsystem
and word: a Failure FAILs, a Warning WARNs, an ``Internal error`` is an ERROR. dcgmi prints no
code, so the code is found from the incident's message in dcgm_errors.yaml, and its cause is the
symptom (``dcgm-health-incident`` when no code matches). A Healthy report PASSes with NVIDIA's
caveat in the summary: no enabled watch found an incident in the samples the host engine kept,
which right after the probe set the watches may be seconds of them. dcgmi missing and the host
engine down are handled as for the diagnostic.
"""

from __future__ import annotations

import re

from preflight.check import error, fail, host_check, ok, skip, warn
from preflight.collect.dcgm import DISCOVERY_PROBE_ID, HEALTH_PROBE_ID, PROBE_ID, asked_level
from preflight.knowledge.dcgm_errors import DcgmError, load_dcgm_errors
from preflight.model import Evidence

HOSTENGINE = re.compile(r"unable to establish a connection|Unable to connect to host engine|host engine",
                        re.IGNORECASE)
HOSTENGINE_ACTION = ("start DCGM's host engine (systemctl enable --now nvidia-dcgm, or nv-hostengine; in Kubernetes "
                     "the GPU operator's nvidia-dcgm pod), check dcgmi discovery -l lists the GPUs, then re-run")
INSTALL_ACTION = ("install DCGM on the node (the datacenter-gpu-manager-4 package matching the CUDA major version), "
                  "start nvidia-dcgm, then re-run")
# Severities of dcgmErrorSeverity_t under which a warning on a passed test still means something.
QUIET_SEVERITIES = ("none",)
# The tests DCGM's run levels are built on, by normalised name (``_test_key``): the deployment
# checks (every level), PCIe and GPU memory (level 2 on), the GEMM diagnostic, Targeted Stress and
# Targeted Power (level 3 on) (dcgmi diag reference and DCGM's suite tables, docs/sources.md §13.1).
# A level lists only the tests it runs, so any of these in the output belongs to the run and its
# skip is never a pass. Any other test a level may list is SKU- or install-dependent (EUD, a
# separately installed plugin; memory bandwidth, pulse, memtest where the SKU has no entry): its
# skip is a note on the verdict.
REQUIRED = frozenset({"software", "deployment", "pcie", "memory", "diagnostic", "targetedstress", "targetedpower"})


@host_check("dcgm-diag", facts=["dcgm_diag"],
            summary="DCGM diagnostics: each test's pass/fail/warn/skip per GPU, DCGM error codes, NVIDIA's next step")
def dcgm_diag(host):
    r = host.result(PROBE_ID)
    if r is None:
        return skip("not run: an active test (`preflight run` without --quick runs dcgmi diag -r 1; "
                    "--dcgm-level 2|3|4 for longer levels)")
    level, asked = asked_level(r.command)
    if r.tool_missing:
        said = (r.stderr.strip().splitlines() or ["dcgmi is not installed"])[-1]
        evidence = [Evidence(PROBE_ID, r.stderr.strip()[-300:] or f"exit {r.exit_code}")]
        if asked:
            return error(f"--dcgm-level {level} asked for DCGM diagnostics, but {said}", symptoms=["tool-missing"],
                         evidence=evidence, action=INSTALL_ACTION)
        return skip(f"{said}: DCGM diagnostics not run (--dcgm-level makes a missing DCGM an error)",
                    evidence=evidence)
    diag = host.dcgm_diag
    run = diag.run
    level = run.level if run and run.level else level
    v = _Verdict(load_dcgm_errors())
    v.data.update(level=level, form=diag.form, version=diag.version, driver=diag.driver,
                  exit_code=run.exit_code if run else None, seconds=run.seconds if run else None)
    where = f"dcgmi diag -r {level}" if level else "dcgmi diag"

    hung = (run is not None and run.timed_out) or r.timed_out or (run is not None and run.exit_code is None
                                                                  and r.exit_code is None)
    if hung:
        limit = run.limit_s if run and run.limit_s else r.duration_s
        v.add("fail", f"{where} did not finish within {limit:g} s: stopped, and a hang is a result"
              + (f" ({len(diag.tests)} test(s) reported before it)" if diag.tests else ""), "dcgm-diag-hang",
              host.excerpt(PROBE_ID, r"^# preflight: dcgmi-diag", limit=2))
    _judge_run_messages(host, diag, v)
    _judge_tests(host, diag, v, level)
    _judge_coverage(host, diag, v)
    if not diag.tests and not v.fails and not v.errors:
        exit_code = run.exit_code if run else r.exit_code
        v.add("error", f"{where} reported no test (exit {exit_code}): nothing was judged", "dcgm-diag-incomplete",
              Evidence(PROBE_ID, (r.text.strip() or r.stderr.strip() or "(no output)")[-300:]))

    counts = {s: sum(1 for t in diag.tests if t.status == s) for s in ("pass", "fail", "warn", "skip", "not-run")}
    tally = ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "no test"
    v.data.update(tests={t.name: t.status for t in diag.tests}, counts=counts)
    shape = f" ({diag.form}{', DCGM ' + diag.version if diag.version else ''})" if diag.form != "none" else ""
    head = f"{where}{shape}: {tally}"
    summary = "; ".join([head] + v.errors + v.fails + v.warns + v.notes)
    evidence = list(dict.fromkeys(v.evidence))[:6]
    kw = dict(symptoms=v.symptoms, evidence=evidence, data=v.data, action=v.action)
    if v.errors and not v.fails:
        return error(summary, **kw)
    if v.fails:
        return fail(summary, **kw)
    if v.warns:
        return warn(summary, **kw)
    return ok(summary, evidence=[host.excerpt(PROBE_ID, r'"status"|\| (?:Pass|GPU\d+: Pass)', limit=3)],
              data=v.data)


def _test_key(name: str) -> str:
    """"GPU Memory", "memory" -> "memory"; "Targeted Power", "targeted_power" -> "targetedpower";
    "EUD Test", "eud" -> "eud": the text table's names and DCGM 4's JSON names alike."""
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    return {"gpumemory": "memory", "eudtest": "eud"}.get(key, key)


def _possible(v: _Verdict, err: DcgmError | None) -> None:
    """Name a cause that may explain a failure, as possible only (low confidence in the rules)."""
    if err is None or not err.possible:
        return
    symptom = f"{err.possible}-possible"
    if symptom not in v.symptoms:
        v.symptoms.append(symptom)
        v.fails.append(f"possibly {err.possible}, not established: a power limit or power brake holding the "
                       f"GPU below the test's target is one explanation (nvidia-smi -q -d POWER shows the "
                       f"enforced limit); {err.name} itself is the finding")


class _Verdict:
    def __init__(self, table) -> None:
        self.table = table
        self.errors: list[str] = []
        self.fails: list[str] = []
        self.warns: list[str] = []
        self.notes: list[str] = []  # said, but they change no verdict
        self.symptoms: list[str] = []
        self.evidence: list[Evidence] = []
        self.action: str | None = None
        self.data: dict = {"codes": [], "gpus": {}}

    def add(self, severity: str, phrase: str, symptom: str | None, *evidence: Evidence | None,
            action: str | None = None) -> None:
        {"error": self.errors, "fail": self.fails, "warn": self.warns}[severity].append(phrase)
        if symptom and symptom not in self.symptoms:
            self.symptoms.append(symptom)
        self.evidence.extend(e for e in evidence if e)
        if action and (self.action is None or severity in ("fail", "error") and not self.fails):
            self.action = action

    def code_of(self, message) -> DcgmError | None:
        known = self.table.get(message.code) if message.code else None
        return known or self.table.identify(message.text)

    def describe(self, message) -> tuple[str, DcgmError | None]:
        """The message with its DCGM code, name, severity and NVIDIA's next step, when known."""
        err = self.code_of(message)
        text = message.text[:240]
        if err is None:
            return text, None
        self.data["codes"].append({"code": err.code, "name": err.name, "severity": err.severity,
                                   "cause": err.cause, "gpu": message.gpu})
        nxt = f"; NVIDIA: {err.next}" if err.next and err.next not in message.text else ""
        return f"{err.name} ({err.code}, severity {err.severity}: {err.severity_meaning}): {text}{nxt}", err


def _judge_run_messages(host, diag, v: _Verdict) -> None:
    for m in diag.messages:
        if HOSTENGINE.search(m.text):
            v.add("error", f"dcgmi could not reach DCGM's host engine ({m.text[:160]}): no test ran",
                  "dcgm-hostengine-down", host.excerpt(PROBE_ID, r"Error:", limit=2), action=HOSTENGINE_ACTION)
            continue
        if m.kind == "info":
            err = v.code_of(m)
            if err is None or err.severity in QUIET_SEVERITIES:
                continue
        text, err = v.describe(m)
        severity = "fail" if m.kind == "error" else "warn"
        v.add(severity, f"outside any test: {text}", err.cause if err else "dcgm-diag-failed",
              _message_evidence(host, m), action=_next(err))


def _judge_tests(host, diag, v: _Verdict, level: int | None = None) -> None:
    gpus: dict = v.data["gpus"]
    skipped: list[str] = []
    optional: list[str] = []
    for test in diag.tests:
        for result in test.results:
            gpus.setdefault("all" if result.gpu is None else result.gpu, {})[test.name] = result.status
        warnings = [m for m in test.messages if m.kind in ("warning", "error")]
        coded_info = [m for m in test.messages if m.kind == "info" and (e := v.code_of(m))
                      and e.severity not in QUIET_SEVERITIES]
        named = _failed_gpus(test)
        if test.status == "fail":
            rows_pass = test.results and all(res.status == "pass" for res in test.results)
            also = " (every GPU row says Pass, but DCGM failed the test)" if rows_pass else ""
            for text, err in _grouped(v, warnings) or [(f"no reason printed (status {test.status})", None)]:
                v.add("fail", f"{test.name} failed{named}{also}: {text}", err.cause if err else "dcgm-diag-failed",
                      _test_evidence(host, test), action=_next(err))
                _possible(v, err)
        elif test.status == "warn":
            for text, err in _grouped(v, warnings) or [("no reason printed", None)]:
                v.add("warn", f"{test.name} warned{named}: {text}", err.cause if err else "dcgm-diag-failed",
                      _test_evidence(host, test), action=_next(err))
        elif test.status in ("skip", "not-run"):
            reason = "; ".join(m.text[:160] for m in test.messages if m.kind != "info")
            said = f"{test.name} ({test.status}{': ' + reason if reason else ''})"
            required = _test_key(test.name) in REQUIRED or (test.category or "").lower() == "deployment"
            (skipped if required else optional).append(said)
        elif test.status == "pass" and (warnings or coded_info):
            text, err = v.describe((warnings or coded_info)[0])
            v.add("warn", f"{test.name} passed while reporting {text}: not a clean pass",
                  err.cause if err else "dcgm-diag-incomplete", _test_evidence(host, test), action=_next(err))
        elif test.status == "unknown":
            v.add("warn", f"{test.name}: status word not understood, not read as a pass", "dcgm-diag-incomplete",
                  _test_evidence(host, test))
        elif test.status == "pass" and named:
            v.add("fail", f"{test.name}: the test passed but GPU(s){named} did not", "dcgm-diag-failed",
                  _test_evidence(host, test))
    if optional:
        what = "the EUD plugin is installed separately, and " if any(o.startswith("EUD") or o.startswith("eud")
                                                                    for o in optional) else ""
        at = f" at level {level}" if level else ""
        v.notes.append(f"not required{at}, so not judged: {'; '.join(optional)} ({what}a skip of a "
                       "test the level does not require changes no verdict)")
        v.data["optional_skipped"] = optional
    if skipped:
        judged = sum(1 for t in diag.tests if t.status not in ("skip", "not-run"))
        v.add("warn", f"{len(skipped)} test(s) not run, so not judged (a skip is not a pass): {'; '.join(skipped)}"
              + ("" if judged else "; no test judged the hardware"), "dcgm-diag-incomplete",
              action="make the GPUs idle and check the tests are allowed on this GPU (nvvs.log says why they "
                     "skipped), then re-run the same level")


def _judge_coverage(host, diag, v: _Verdict) -> None:
    """A GPU of the platform that no result names was not diagnosed."""
    expected = host.profile.gpu_count
    seen = {g for g in v.data["gpus"] if isinstance(g, int)}
    if not expected or not seen or "all" in v.data["gpus"]:
        return
    missing = sorted(set(range(expected)) - seen)
    if missing:
        v.add("warn", f"no result for GPU(s) {', '.join(map(str, missing))} of the {expected} the "
              f"{host.profile.id} profile has: those GPUs were not diagnosed", "dcgm-diag-incomplete")


def _grouped(v: _Verdict, messages) -> list[tuple[str, DcgmError | None]]:
    """One phrase per DCGM code (or per text, without one), saying how many times it was printed."""
    groups: dict[object, list] = {}
    for m in messages:
        err = v.code_of(m)
        groups.setdefault(err.code if err else m.text, []).append(m)
    out = []
    for same in list(groups.values())[:3]:
        text, err = v.describe(same[0])
        out.append((text + (f" (and {len(same) - 1} more like it)" if len(same) > 1 else ""), err))
    return out


def _failed_gpus(test) -> str:
    bad = sorted({r.gpu for r in test.results if r.status == "fail" and r.gpu is not None})
    if any(r.status == "fail" and r.gpu is None for r in test.results):
        return " on all GPUs"
    return f" on GPU {', '.join(map(str, bad))}" if bad else ""


def _next(err: DcgmError | None) -> str | None:
    return f"DCGM's next step for {err.name}: {err.next}" if err and err.next else None


def _test_evidence(host, test) -> Evidence | None:
    name = re.escape(test.name)
    return (host.excerpt(PROBE_ID, rf'^\|\s*{name}\s*\|', context=2, limit=1)
            or host.excerpt(PROBE_ID, rf'"name"\s*:\s*"{name}"', context=0, limit=1))


def _message_evidence(host, message) -> Evidence | None:
    words = message.text.split()[:4]
    return host.excerpt(PROBE_ID, r"\s+".join(re.escape(w) for w in words), limit=1) if words else None


# --------------------------------------------------------------------------- host engine


@host_check("dcgm-hostengine", facts=["dcgm_discovery"],
            summary="DCGM's host engine answers and sees the platform's GPUs (dcgmi discovery -l)")
def dcgm_hostengine(host):
    r = host.result(DISCOVERY_PROBE_ID)
    if r is None:
        return skip("dcgmi discovery not collected in this bundle")
    if r.tool_missing:
        return skip("DCGM not installed (no dcgmi): nothing to check")
    disc = host.dcgm_discovery
    for e in disc.errors:
        if HOSTENGINE.search(e):
            return fail(f"DCGM's host engine is not running: dcgmi discovery -l says {e[:160]!r}",
                        symptoms=["dcgm-hostengine-down"], evidence=[host.excerpt(DISCOVERY_PROBE_ID, r"Error:")],
                        action=HOSTENGINE_ACTION)
    if disc.errors:
        return error(f"dcgmi discovery -l failed: {disc.errors[0][:160]}", symptoms=["probe-failed"],
                     evidence=[host.excerpt(DISCOVERY_PROBE_ID, r"Error:")])
    seen = disc.counts.get("GPUs", len(disc.gpus))
    data = {"gpus": seen, "nvswitches": disc.counts.get("NvSwitches"), "connectx": disc.counts.get("ConnectX")}
    evidence = [host.excerpt(DISCOVERY_PROBE_ID, r"found\.", limit=4)]
    expected = host.profile.gpu_count
    if expected and seen < expected:
        return warn(f"DCGM sees {seen} GPU(s), the {host.profile.id} profile has {expected}: DCGM diagnostics and "
                    "health checks leave the others out (see gpu-inventory)", evidence=evidence, data=data)
    return ok(f"host engine answers; DCGM sees {seen} GPU(s)", evidence=evidence, data=data)


# --------------------------------------------------------------------------- background health


@host_check("dcgm-health", facts=["dcgm_health"],
            summary="DCGM's background health watches (dcgmi health -s a, then -c): each watched subsystem "
                    "Healthy, its Warning/Failure incidents with DCGM's code and next step")
def dcgm_health(host):
    r = host.result(HEALTH_PROBE_ID)
    if r is None:
        return skip("dcgmi health not collected in this bundle")
    if r.tool_missing:
        said = (r.stderr.strip().splitlines() or ["dcgmi is not installed"])[-1]
        diag = host.result(PROBE_ID)
        level, asked = asked_level(diag.command) if diag is not None else (None, False)
        if asked:
            return error(f"--dcgm-level {level} asked for DCGM, but {said}: health watches not checked",
                         symptoms=["tool-missing"], action=INSTALL_ACTION)
        return skip(f"{said}: DCGM health watches not checked")
    health = host.dcgm_health
    data: dict = {"form": health.form, "overall": health.overall, "watches_set": health.watches_set,
                  "entities": {e.label: e.health for e in health.entities}, "codes": []}
    for e in health.errors:
        if HOSTENGINE.search(e):
            return error(f"dcgmi health could not reach DCGM's host engine ({e[:160]}): nothing was checked",
                         symptoms=["dcgm-hostengine-down"], evidence=[host.excerpt(HEALTH_PROBE_ID, r"Error:")],
                         data=data, action=HOSTENGINE_ACTION)
    if health.form == "none":
        said = "; ".join(health.errors) or f"exit {health.exits.get('check', r.exit_code)}"
        return error(f"dcgmi health gave no report: {said[:200]}", symptoms=["probe-failed"],
                     evidence=[host.excerpt(HEALTH_PROBE_ID, r"Error:|# preflight:", limit=3)], data=data)
    table = load_dcgm_errors()
    found: dict[str, list[str]] = {"fail": [], "warn": [], "error": []}
    symptoms: list[str] = []
    evidence: list[Evidence | None] = []
    action = None
    for entity, inc in health.incidents:
        err = table.identify(inc.message) if inc.message else None
        named = (f"{err.name} ({err.code}, severity {err.severity}): " if err else "")
        nxt = f"; NVIDIA: {err.next}" if err and err.next and err.next not in inc.message else ""
        level = inc.health if inc.health in found else "warn"  # a word dcgmi never prints: looked at, not passed
        found[level].append(f"{entity.label} {inc.system} {_HEALTH_NAMES.get(inc.health, inc.health)}: "
                            f"{named}{inc.message[:240] or '(no message)'}{nxt}")
        # A code whose cause is "a diagnostic test failed" says nothing of a diagnostic here.
        cause = err.cause if err and err.cause != "dcgm-diag-failed" else "dcgm-health-incident"
        if cause not in symptoms:
            symptoms.append(cause)
        if err:
            data["codes"].append({"code": err.code, "name": err.name, "severity": err.severity, "cause": cause,
                                  "entity": entity.label, "system": inc.system})
            action = action or (err.next if level == "fail" and err.next else None)
        words = " ".join(inc.message.split()[:5])
        evidence.append(host.excerpt(HEALTH_PROBE_ID, re.escape(words) if words else re.escape(inc.system)))
    overall = health.overall or "unknown"
    worst_seen = next((s for s in ("fail", "error", "warn") if found[s] or overall == s), "pass")
    caveat = ("; watches set by this probe just now: DCGM checked only the samples it had kept (seconds, unless "
              "something already watched these fields), and a Healthy report does not mean every subsystem was "
              "watched or that a stress test passed (NVIDIA's health-monitoring guide)") if health.watches_set else (
              "; a Healthy report does not mean every subsystem was watched or that a stress test passed "
              "(NVIDIA's health-monitoring guide)")
    head = f"dcgmi health ({health.form}): overall {_HEALTH_NAMES.get(overall, overall)}"
    parts = found["fail"] + found["error"] + found["warn"]
    if worst_seen != "pass" and not parts:
        parts = [f"overall {overall} with no incident listed"]
        symptoms.append("dcgm-health-incident")
    summary = "; ".join([head] + parts) if parts else head + ", no incident" + caveat
    kw = dict(symptoms=symptoms, evidence=[e for e in evidence if e][:6], data=data)
    if worst_seen == "fail":
        return fail(summary, action=action, **kw)
    if worst_seen == "error":
        return error(summary, **kw)
    if worst_seen == "warn":
        return warn(summary, **kw)
    return ok(summary, evidence=[host.excerpt(HEALTH_PROBE_ID, r"Overall Health|Healthy", limit=2)], data=data)


_HEALTH_NAMES = {"pass": "Healthy", "warn": "Warning", "fail": "Failure", "error": "Internal error"}
