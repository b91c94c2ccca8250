"""The lifecycle's policy from ``playbooks/lifecycle.yaml`` and a site's own file (``--site``),
checked on load: a bad entry is an error naming the file and the field, before anything runs."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from preflight.knowledge.datafile import read_yaml
from preflight.lifecycle.machine import STEPS, CausePolicy, Policy, Silence
from preflight.shipped import playbooks_dir

FORMAT = "preflight-lifecycle/1"
TIMINGS = ("confirm_delay_s", "confirm_k", "confirm_n", "startup_grace_s", "escalate_incidents", "retest_failures",
           "step_timeout_s")
SITE_ONLY = ("escalate_window_s", "breaker_drains", "breaker_window_s", "breaker_fraction", "retest_dcgm_level")


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


def _cause(data, where: str) -> CausePolicy:
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
    return CausePolicy(confirm, step, data.get("service"), tuple(acceptance), str(data.get("person") or ""))


def load(site: Path | None = None, causes_known: set[str] | None = None) -> tuple[Policy, dict]:
    """The shipped policy with the site's file over it; also the timings the controller reads
    (the breaker, the escalation window)."""
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
        for key, value in (doc.get("timings") or {}).items():
            if key not in TIMINGS + SITE_ONLY:
                raise PolicyError(f"{path}: timings.{key}: unknown; known: {', '.join(TIMINGS + SITE_ONLY)}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise PolicyError(f"{path}: timings.{key}: a number >= 0, not {value!r}")
            if key == "retest_dcgm_level" and value not in (1, 2, 3, 4):
                raise PolicyError(f"{path}: timings.{key}: a dcgmi diag level, 1 to 4, not {value!r}")
            timings[key] = value
        for cause, data in (doc.get("causes") or {}).items():
            where = f"{path}: causes.{cause}"
            if causes_known is not None and cause not in causes_known:
                raise PolicyError(f"{where}: no such cause in the knowledge base (preflight explain --list)")
            causes[cause] = _cause(data, where)
        for i, entry in enumerate(doc.get("silences") or ()):
            where = f"{path}: silences[{i}]"
            if not isinstance(entry, dict):
                raise PolicyError(f"{where}: must be a mapping with node, cause, owner, reason, expires")
            missing = [k for k in ("node", "cause", "owner", "reason", "expires") if not entry.get(k)]
            if missing:
                raise PolicyError(f"{where}: missing {', '.join(missing)} (a silence has an owner, a reason and "
                                  "an expiry)")
            silences.append(Silence(str(entry["node"]), str(entry["cause"]), str(entry["owner"]),
                                    str(entry["reason"]), _expiry(entry["expires"], where)))
    kw = {k: timings[k] for k in TIMINGS if k in timings}
    return Policy(causes=causes, silences=tuple(silences), **kw), timings
