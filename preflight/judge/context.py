"""What a check sees: one host's evidence, its facts derived on demand, and its profile.

``host.smi``, ``host.nics`` and the other facts of ``preflight.judge.facts`` are derived the
first time a check asks and kept, so a host pays only for the parsers its selected checks use
and every check reads the same record. A fact whose evidence is missing raises
``EvidenceMissing``; the analysis turns that into an ERROR finding that says why (tool absent,
timed out, failed), so no check repeats that bookkeeping.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from preflight.judge.facts import FACTS
from preflight.judge.missing import EvidenceMissing, why_missing
from preflight.knowledge.profiles import Profile
from preflight.model import Evidence, HostHistory, ProbeResult

__all__ = ["EvidenceMissing", "FleetContext", "HostContext", "why_missing"]


@dataclass
class HostContext:
    name: str
    probes: dict[str, ProbeResult]
    profile: Profile
    # The node's past from the results store (the ``history`` fact reads it), and this run's own
    # figures, filled in before the checks that read the history run (judge.analyze.judge_host).
    past: HostHistory | None = None
    readings: dict[str, float] = field(default_factory=dict)
    verdicts: dict[str, bool] = field(default_factory=dict)  # check -> failed (fail or error) in this run

    def result(self, probe: str) -> ProbeResult | None:
        return self.probes.get(probe)

    def text(self, probe: str) -> str:
        """The probe's output; raises EvidenceMissing unless it ran cleanly."""
        r = self.probes.get(probe)
        if r is None or not r.ok:
            raise why_missing(r, probe, self.answered_by_tool(probe))
        return r.text

    def answered_by_tool(self, probe: str) -> tuple[str, ...]:
        """The other probes run by the same program as ``probe`` (its command's first word; a
        ``sh -c`` script says nothing of one) that returned output on this host."""
        r = self.probes.get(probe)
        tool = r.command[0] if r is not None and r.command else None
        if tool in (None, "sh", "bash"):
            return ()
        return tuple(p for p, other in self.probes.items()
                     if p != probe and other.command[:1] == (tool,) and other.ok and other.stdout)

    def first_text(self, *probes: str) -> tuple[str, str]:
        """The first of several alternative probes that ran cleanly: (probe id, text)."""
        failures = []
        for p in probes:
            try:
                return p, self.text(p)
            except EvidenceMissing as exc:
                failures.append(exc)
        # Report the most telling reason: a probe that ran and failed beats one not collected.
        raise max(failures, key=lambda e: (e.collected, len(e.symptoms)))

    def excerpt(self, probe: str, pattern: str, context: int = 0, limit: int = 6) -> Evidence | None:
        """Lines of a probe's output matching ``pattern`` (a regex), as evidence."""
        r = self.probes.get(probe)
        if r is None or r.stdout is None:
            return None
        lines = r.text.splitlines()
        rx = re.compile(pattern)
        picked: list[int] = []
        for i, line in enumerate(lines):
            if rx.search(line):
                picked.extend(range(max(0, i - context), min(len(lines), i + context + 1)))
        if not picked:
            return None
        keep = sorted(set(picked))[: limit * (2 * context + 1)]
        return Evidence(probe, "\n".join(lines[i].strip() for i in keep))

    # ---- parsed facts -------------------------------------------------------------------
    # ``host.smi``, ``host.nics`` ...: the facts of preflight.judge.facts, each derived on first
    # use and kept, failures too (a fact many checks read is parsed, or refused, once).

    def __getattr__(self, name: str):
        declared = FACTS.get(name)
        if declared is None or name.startswith("__"):
            raise AttributeError(f"{type(self).__name__} has no attribute or fact {name!r}")
        self.__dict__.setdefault("_reads", set()).add(name)
        cache = self.__dict__.setdefault("_derived", {})
        if name not in cache:
            try:
                cache[name] = (True, declared.derive(self))
            except EvidenceMissing as exc:
                cache[name] = (False, exc)
        ok, value = cache[name]
        if not ok:
            raise value
        return value

    def derived(self) -> dict[str, tuple[bool, object]]:
        """The facts derived so far: name -> (True, value) or (False, the EvidenceMissing)."""
        return self.__dict__.setdefault("_derived", {})

    def reads(self) -> set[str]:
        """The facts asked for since the last ``forget_reads`` (a check's own reads, for
        preflight.judge.partial)."""
        return set(self.__dict__.get("_reads", ()))

    def forget_reads(self) -> None:
        self.__dict__["_reads"] = set()

    def optional(self, name: str):
        """A fact, or None when its evidence is missing."""
        try:
            return getattr(self, name)
        except EvidenceMissing:
            return None

    def device_excerpt(self, probe: str, device: str, pattern: str, limit: int = 8) -> Evidence | None:
        """Lines matching ``pattern`` in one device's part of a multi-device listing (ibv_devinfo,
        ibstat, ibstatus, ``== IFACE ==`` ethtool blocks, ib-sysfs lines), after its header."""
        r = self.probes.get(probe)
        if r is None or r.stdout is None:
            return None
        name = re.escape(device)
        own = re.compile(rf"^\s*(?:hca_id:\s*{name}\s*$|CA '{name}'|Infiniband device '{name}'|==\s*{name}\s*==)")
        header = re.compile(r"^\s*(?:hca_id:|CA '|Infiniband device '|==\s*\S+\s*==)")
        wanted = re.compile(pattern)
        picked: list[str] = []
        inside = False
        for line in r.text.splitlines():
            if f"/infiniband/{device}/" in line:  # sysfs: every line names its device
                if wanted.search(line):
                    picked.append(line.strip())
            elif own.match(line):
                inside = True
                picked.append(line.strip())
            elif header.match(line):
                inside = False
            elif inside and wanted.search(line):
                picked.append(line.strip())
        return Evidence(probe, "\n".join(picked[:limit])) if picked else None


@dataclass
class FleetContext:
    hosts: dict[str, HostContext]  # reachable hosts only, in inventory order
    # -- nccl-multinode: for checks/nccl_multinode.py --
    # Results of runs that span hosts, saved under the bundle's pseudo-host (bundle.FLEET_HOST).
    probes: dict[str, ProbeResult] = field(default_factory=dict)

    def facts(self, attribute: str) -> dict[str, object]:
        """One fact from every host that has it; hosts where it is missing are left out
        (their own host checks already report why)."""
        out: dict[str, object] = {}
        for name, host in self.hosts.items():
            try:
                out[name] = getattr(host, attribute)
            except EvidenceMissing:
                continue
        return out
