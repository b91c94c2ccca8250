"""``preflight explain CAUSE``: one knowledge-base entry as an SRE reads it.

The entry is assembled from both playbook files: the title, meaning, evidence, ordered actions
and references from ``causes.yaml``, and the symptoms that point to the cause from
``rules.yaml`` (each rule that names it, with its confidence) plus the cause id itself, which
any check may report directly. Plain text, wrapped at 100 columns, so it reads the same in a
terminal, a pipe or a ticket.
"""

from __future__ import annotations

import difflib
import textwrap

from preflight.diagnose.engine import Cause, FleetRule, KnowledgeBase, Rule

WIDTH = 100


class UnknownCause(KeyError):
    def __str__(self) -> str:
        return self.args[0]


def find_cause(cause_id: str, kb: KnowledgeBase) -> Cause:
    """The entry for ``cause_id``; UnknownCause names the closest ids when there is none."""
    if cause_id in kb.causes:
        return kb.causes[cause_id]
    close = difflib.get_close_matches(cause_id, list(kb.causes), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else "; `preflight explain --list` lists them"
    raise UnknownCause(f"unknown cause {cause_id!r}{hint}")


def pointing_symptoms(cause_id: str, kb: KnowledgeBase) -> list[str]:
    """One line per way of reaching the cause: directly, through a rule, or a fleet pattern."""
    lines = [f"{cause_id} reported by a check (high)"]
    lines += [_rule_line(r) for r in kb.rules if r.cause == cause_id]
    lines += [_fleet_line(r) for r in kb.fleet_rules if r.cause == cause_id]
    return lines


def _rule_line(rule: Rule) -> str:
    parts = []
    if rule.all:
        parts.append(" + ".join(sorted(rule.all)))
    if rule.any:
        parts.append(("with any of " if rule.all else "any of ") + ", ".join(sorted(rule.any)))
    line = f"{' '.join(parts)} ({rule.confidence})"
    if rule.explains - rule.all - rule.any:
        line += f"; also accounts for {', '.join(sorted(rule.explains - rule.all - rule.any))}"
    if rule.action:
        line += f"; action: {rule.action}"
    return line


def _fleet_line(rule: FleetRule) -> str:
    line = (f"every host judged (at least {rule.min_hosts}) shows {' or '.join(sorted(rule.any))} "
            f"({rule.confidence}, fleet pattern)")
    if rule.unless:
        line += f"; not when the run also shows {', '.join(sorted(rule.unless))}"
    return line


def explain(cause_id: str, kb: KnowledgeBase) -> str:
    cause = find_cause(cause_id, kb)
    out = [f"{cause.id}: {cause.title}", ""]
    if cause.meaning:
        out += ["What it means:", *_wrap(cause.meaning, "  ", "  "), ""]
    out += ["Symptoms that point to it:"]
    out += [w for line in pointing_symptoms(cause.id, kb) for w in _wrap(line, "  - ", "    ")]
    out.append("")
    if cause.evidence:
        out += ["Evidence to look at:"]
        out += [w for line in cause.evidence for w in _wrap(line, "  - ", "    ")]
        out.append("")
    out += ["What to do, in order:"]
    for i, action in enumerate(cause.actions, 1):
        out += _wrap(action, f"  {i}. ", "     ")
    if cause.references:
        out += ["", "References:"]
        out += [w for ref in cause.references for w in _wrap(ref, "  - ", "    ")]
    return "\n".join(out) + "\n"


def list_causes(kb: KnowledgeBase) -> str:
    width = max((len(c) for c in kb.causes), default=0)
    return "".join(f"{cid.ljust(width)}  {kb.causes[cid].title}\n" for cid in sorted(kb.causes))


def _wrap(text: str, first: str, rest: str) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=first, subsequent_indent=rest,
                         break_on_hyphens=False, break_long_words=False) or [first.rstrip()]
