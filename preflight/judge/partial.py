"""A check judged on evidence that broke off part-way passes nothing it did not see.

Some facts hold what a tool showed before its output ended or broke (``SmiReport.cut``: an
``nvidia-smi -q -x`` cut after GPU 2 of 8; ``IbInventory.cut``: an ``ibstat`` that failed
part-way). A check reads such a fact like a whole one and judges the GPUs or ports in it, which
is right for what it found, but its PASS (or its SKIP for want of data) would speak of the ones
the output never showed. So after a host check has run, every outcome that read a cut fact is
marked here: a PASS or a SKIP becomes an ERROR that says what was judged and what was not, a
WARN or FAIL keeps its status and gains the same words. A check that speaks of the cut itself
declares the fact ``<name>_cut`` (gpu-inventory does) and is left as it is.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from preflight.check import Outcome
from preflight.judge.facts import FACTS
from preflight.model import Status

TRUNCATED = "probe-truncated"


def cut_of(derived: dict, names: Iterable[str]) -> list[str]:
    """The cut descriptions of the facts ``names`` among those already ``derived`` (a context's
    cache: name -> (ok, value)), a fact's own and those of the facts it needs."""
    seen: set[str] = set()
    found: list[str] = []
    stack = list(names)
    while stack:
        name = stack.pop()
        if name in seen or name not in FACTS:
            continue
        seen.add(name)
        stack.extend(FACTS[name].needs)
        ok, value = derived.get(name, (False, None))
        cut = getattr(value, "cut", None) if ok else None
        if isinstance(cut, str) and cut not in found:
            found.append(cut)
    return found


def mark(outcomes: list[Outcome], declared: Iterable[str], read: Iterable[str], derived: dict) -> list[Outcome]:
    """``outcomes`` of a check that declared the facts ``declared`` and asked for ``read`` while it
    ran, marked where one it read was cut. (A verdict reached before reading a fact, a SKIP for
    want of a profile figure, owes nothing to it.)"""
    declared = tuple(declared)
    judged = [n for n in read if n in declared and f"{n}_cut" not in declared]
    cuts = cut_of(derived, judged)
    if not cuts:
        return outcomes
    why = "; ".join(cuts)
    out = []
    for o in outcomes:
        symptoms = o.symptoms if TRUNCATED in o.symptoms else (*o.symptoms, TRUNCATED)
        if o.status in (Status.PASS, Status.SKIP):
            summary = f"judged only what the output showed before it broke off ({o.summary}): {why}"
            out.append(replace(o, status=Status.ERROR, summary=summary, symptoms=symptoms))
        elif why in o.summary:
            out.append(replace(o, symptoms=symptoms))  # the check said it already
        else:
            out.append(replace(o, summary=f"{o.summary}; the output broke off part-way: {why}", symptoms=symptoms))
    return out
