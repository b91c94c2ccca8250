"""What a check returned, checked before it becomes findings: a plugin's garbage never reaches a report.

A check returns one ``Outcome``, an iterable of them, or None (preflight/check.py). A plugin
may return anything: a string (which ``list()`` would split into characters), a dict, objects
of its own, a finding whose ``data`` no JSON writer can hold, or one that names a host the run
never had. ``outcomes_of`` accepts only what the report contract can carry and raises
``CheckOutputError`` saying what was wrong; the runners (judge/analyze.py, soak/analysis.py)
turn that into the check's "check crashed" ERROR naming its file, and the run goes on.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from preflight.check import Outcome
from preflight.model import Evidence, Status


class CheckOutputError(TypeError):
    """A check returned something that is not an outcome the report can carry."""


def outcomes_of(returned: Any, hosts: Collection[str] | None = None) -> list[Outcome]:
    """The outcomes in ``returned``, each checked; ``hosts``: the names an outcome may blame
    (None: any). Iterating a generator runs the check's code, so call this inside the same
    ``try`` as the check itself."""
    if returned is None:
        return []
    if isinstance(returned, Outcome):
        items: list[Any] = [returned]
    elif isinstance(returned, (str, bytes, Mapping)) or not isinstance(returned, Iterable):
        raise CheckOutputError(f"returned {_kind(returned)}, not an Outcome, an iterable of them or None")
    else:
        items = list(returned)
    for item in items:
        _check(item, hosts)
    return items


def _check(o: Any, hosts: Collection[str] | None) -> None:
    if not isinstance(o, Outcome):
        raise CheckOutputError(f"returned {_kind(o)} among its outcomes, not an Outcome")
    if not isinstance(o.status, Status):
        raise CheckOutputError(f"returned an Outcome whose status is {_kind(o.status)}, not a Status")
    if not isinstance(o.summary, str):
        raise CheckOutputError(f"returned an Outcome whose summary is {_kind(o.summary)}, not a str")
    if not all(isinstance(s, str) for s in o.symptoms) or isinstance(o.symptoms, str):
        raise CheckOutputError("returned an Outcome whose symptoms are not a list of str")
    if not all(isinstance(e, Evidence) and isinstance(e.excerpt, str) for e in o.evidence):
        raise CheckOutputError("returned an Outcome whose evidence is not a list of Evidence")
    if o.action is not None and not isinstance(o.action, str):
        raise CheckOutputError(f"returned an Outcome whose action is {_kind(o.action)}, not a str")
    if o.host is not None and (not isinstance(o.host, str) or (hosts is not None and o.host not in hosts)):
        raise CheckOutputError(f"blamed host {o.host!r}, which is not in the inventory")
    if not isinstance(o.data, Mapping):
        raise CheckOutputError(f"returned an Outcome whose data is {_kind(o.data)}, not a dict")
    try:
        json.dumps(o.data, default=_scalar)
    except (TypeError, ValueError) as exc:
        raise CheckOutputError(f"put data in its finding that JSON cannot hold ({exc})") from None


def _scalar(value: Any) -> Any:
    # numpy scalars (the soak's figures) are numbers; anything else is not JSON.
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{_kind(value)} is not JSON serialisable")


def _kind(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '…' if len(text) > 60 else text}"
