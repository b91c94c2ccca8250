"""The lifecycle's policy from ``playbooks/lifecycle.yaml`` and a site's own file (``--site``),
checked on load: a bad entry is an error naming the file and the field, before anything runs."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from pathlib import Path

from preflight.knowledge.datafile import read_yaml
from preflight.lifecycle.machine import STEPS, CausePolicy, Policy, Silence
from preflight.shipped import playbooks_dir

FORMAT = "preflight-lifecycle/1"
TIMINGS = ("confirm_delay_s", "confirm_k", "confirm_n", "startup_grace_s", "escalate_incidents", "retest_failures",
           "step_timeout_s")
SITE_ONLY = ("escalate_window_s", "breaker_drains", "breaker_window_s", "breaker_fraction", "retest_dcgm_level",
             "capture_timeout_s", "capture_max_bytes")
# What each timing counts: readings, incidents and drains are whole numbers (2.5 of them is a typo
# that would otherwise compare as a threshold no count meets); the breaker's share is of the fleet.
COUNTS = ("confirm_k", "confirm_n", "escalate_incidents", "retest_failures", "breaker_drains", "retest_dcgm_level",
          "capture_max_bytes")
# A capture's commands each keep the transport's kill grace (15 s) inside the limit: below this
# nothing would run, which is what 0 says plainly.
CAPTURE_MIN_S = 20
FRACTIONS = ("breaker_fraction",)
SILENCE_TEXT = ("node", "cause", "owner", "reason")


class PolicyError(ValueError):
    """A lifecycle file preflight cannot follow; the message names the file and field."""


def _expiry(value, where: str) -> float:
    if isinstance(value, datetime):
        t = value
    else:
        try:
            t = datetime.fromisoformat(str(value))
        except ValueError:
            raise PolicyError(f"{where}: expires must be a date or time (2026-12-31, 2026-12-31T18:00Z), "
                              f"not {value!r}") from None
    return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp()


def _timing(key: str, value, where: str):
    """One timing, checked for what it counts; NaN and infinity are refused (NaN compares false
    with every bound, so it once passed ``>= 0`` and disabled the rule it set)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise PolicyError(f"{where}: a number >= 0 (finite), not {value!r}")
    if key in COUNTS:
        if not float(value).is_integer():
            raise PolicyError(f"{where}: a whole number (it counts), not {value!r}")
        value = int(value)
    if key in FRACTIONS and value > 1:
        raise PolicyError(f"{where}: a share of the fleet, from 0 to 1, not {value!r}")
    if key == "retest_dcgm_level" and value not in (1, 2, 3, 4):
        raise PolicyError(f"{where}: a dcgmi diag level, 1 to 4, not {value!r}")
    if key == "capture_timeout_s" and 0 < value < CAPTURE_MIN_S:
        raise PolicyError(f"{where}: 0 (no capture before a step) or at least {CAPTURE_MIN_S} seconds (each "
                          f"command keeps 15 s of it for the transport's kill grace), not {value!r}")
    if key == "capture_max_bytes" and value < 1:
        raise PolicyError(f"{where}: at least 1 byte (capture_timeout_s: 0 turns the capture off), not {value!r}")
    return value


def _section(doc: dict, name: str, kind: type, path: Path):
    """A top-level section of the file, of the shape it must have (absent or empty: none)."""
    value = doc.get(name)
    if value is None:
        return kind()
    if not isinstance(value, kind):
        shape = "a mapping (name: value lines)" if kind is dict else "a list (- entries)"
        raise PolicyError(f"{path}: {name}: must be {shape}, not {type(value).__name__}")
    return value


def _silence(entry, where: str, causes_known: set[str] | None) -> Silence:
    if not isinstance(entry, dict):
        raise PolicyError(f"{where}: must be a mapping with node, cause, owner, reason, expires")
    missing = [k for k in (*SILENCE_TEXT, "expires") if entry.get(k) in (None, "")]
    if missing:
        raise PolicyError(f"{where}: missing {', '.join(missing)} (a silence has an owner, a reason and "
                          "an expiry)")
    for k in SILENCE_TEXT:
        if not isinstance(entry[k], str):
            raise PolicyError(f"{where}.{k}: a text, not {entry[k]!r} ({type(entry[k]).__name__}; quote it)")
    if causes_known is not None and entry["cause"] != "*" and entry["cause"] not in causes_known:
        raise PolicyError(f"{where}.cause: {entry['cause']!r}: no such cause in the knowledge base "
                          "(preflight explain --list; '*' silences every cause)")
    return Silence(entry["node"], entry["cause"], entry["owner"], entry["reason"],
                   _expiry(entry["expires"], where))


def _cause(data, where: str, checks_known: set[str] | None = None) -> CausePolicy:
    if not isinstance(data, dict):
        raise PolicyError(f"{where}: must be a mapping")
    confirm = data.get("confirm", "again")
    step = data.get("step", "none")
    if confirm not in ("once", "again"):
        raise PolicyError(f"{where}.confirm: 'once' or 'again', not {confirm!r}")
    if step not in STEPS:
        raise PolicyError(f"{where}.step: one of {', '.join(STEPS)}, not {step!r}")
    if step == "restart" and not isinstance(data.get("service"), str):
        raise PolicyError(f"{where}.service: a restart names its service (nvidia-fabricmanager)")
    acceptance = data.get("acceptance") or []
    if not isinstance(acceptance, list) or not all(isinstance(a, str) for a in acceptance):
        raise PolicyError(f"{where}.acceptance: a list of check ids")
    # A check that does not exist would fail every retest of the cause: refused here instead.
    unknown = [a for a in acceptance if checks_known is not None and a not in checks_known]
    if unknown:
        raise PolicyError(f"{where}.acceptance: no such check: {', '.join(unknown)} (preflight checks)")
    then = data.get("then") or []
    if not isinstance(then, list) or not all(isinstance(t, str) for t in then):
        raise PolicyError(f"{where}.then: a list of steps (reset, restart, reboot) tried in order once an earlier "
                          "one returned")
    bad = [t for t in then if t not in STEPS or t == "none"]
    if bad:
        raise PolicyError(f"{where}.then: not a step: {', '.join(map(repr, bad))} (reset, restart, reboot)")
    if step == "none" and then:
        raise PolicyError(f"{where}.then: a cause whose step is none has no next step")
    ladder = [step, *then]
    if len(set(ladder)) != len(ladder):
        raise PolicyError(f"{where}.then: a step appears twice in {step}, {', '.join(then)} (a returned step is "
                          "not tried again)")
    if "restart" in then and not isinstance(data.get("service"), str):
        raise PolicyError(f"{where}.service: a restart names its service (nvidia-fabricmanager)")
    return CausePolicy(confirm, step, data.get("service"), tuple(acceptance), str(data.get("person") or ""),
                       tuple(then))


def load(site: Path | None = None, causes_known: set[str] | None = None,
         checks_known: set[str] | None = None) -> tuple[Policy, dict]:
    """The shipped policy with the site's file over it; also the timings the controller reads
    (the breaker, the escalation window). ``causes_known`` and ``checks_known``: the causes a
    file may name (under ``causes:`` and in silences) and the checks an ``acceptance:`` may."""
    files = [playbooks_dir() / "lifecycle.yaml"] + ([site] if site else [])
    causes: dict[str, CausePolicy] = {}
    timings: dict = {}
    silences: list[Silence] = []
    for path in files:
        if not path.is_file():
            raise PolicyError(f"{path}: no such file")
        doc = read_yaml(path, PolicyError)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise PolicyError(f"{path}: not a {FORMAT} file (its first line should be 'format: {FORMAT}')")
        for key, value in _section(doc, "timings", dict, path).items():
            if key not in TIMINGS + SITE_ONLY:
                raise PolicyError(f"{path}: timings.{key}: unknown; known: {', '.join(TIMINGS + SITE_ONLY)}")
            timings[key] = _timing(key, value, f"{path}: timings.{key}")
        for cause, data in _section(doc, "causes", dict, path).items():
            where = f"{path}: causes.{cause}"
            if causes_known is not None and cause not in causes_known:
                raise PolicyError(f"{where}: no such cause in the knowledge base (preflight explain --list)")
            causes[cause] = _cause(data, where, checks_known)
        for i, entry in enumerate(_section(doc, "silences", list, path)):
            silences.append(_silence(entry, f"{path}: silences[{i}]", causes_known))
    kw = {k: timings[k] for k in TIMINGS if k in timings}
    return Policy(causes=causes, silences=tuple(silences), **kw), timings
