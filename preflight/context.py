"""What a check sees: one host's evidence, parsed on demand, and its profile.

Facts are ``cached_property`` attributes that parse a probe's saved output the first time a
check asks, so a host pays only for the parsers its selected checks use, and every check
reads the same parsed record. A fact whose evidence is missing raises ``EvidenceMissing``;
the runner turns that into an ERROR finding that says why (tool absent, timed out, failed),
so no check has to repeat that bookkeeping.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

from .model import Evidence, ProbeResult
from .parsers import ParseError
from .profiles import Profile


class EvidenceMissing(Exception):
    """A fact cannot be had from the evidence; ``symptoms`` say why, for the diagnosis."""

    def __init__(self, message: str, symptoms: tuple[str, ...] = (), evidence: tuple[Evidence, ...] = ()):
        super().__init__(message)
        self.symptoms = symptoms
        self.evidence = evidence


def why_missing(result: ProbeResult | None, probe: str) -> EvidenceMissing:
    if result is None:
        return EvidenceMissing(f"probe {probe} did not run")
    command = " ".join(result.command) or probe
    if result.error:
        return EvidenceMissing(f"{probe}: {result.error}")
    if result.tool_missing:
        tool = result.command[0] if result.command else probe
        return EvidenceMissing(
            f"{tool} is not installed (or not on PATH)", ("tool-missing",),
            (Evidence(probe, result.stderr.strip()[-300:] or f"{command}: exit {result.exit_code}"),),
        )
    if result.timed_out:
        return EvidenceMissing(
            f"{command} did not finish within its timeout ({result.duration_s}s)", ("probe-timeout",),
            (Evidence(probe, (result.text.strip()[-300:] or "(no output)")),),
        )
    return EvidenceMissing(
        f"{command} failed with exit code {result.exit_code}", ("probe-failed",),
        (Evidence(probe, (result.stderr.strip() or result.text.strip())[-300:] or "(no output)"),),
    )


@dataclass
class HostContext:
    name: str
    probes: dict[str, ProbeResult]
    profile: Profile

    def result(self, probe: str) -> ProbeResult | None:
        return self.probes.get(probe)

    def text(self, probe: str) -> str:
        """The probe's output; raises EvidenceMissing unless it ran cleanly."""
        r = self.probes.get(probe)
        if r is None or not r.ok:
            raise why_missing(r, probe)
        return r.text

    def first_text(self, *probes: str) -> tuple[str, str]:
        """The first of several alternative probes that ran cleanly: (probe id, text)."""
        failures = []
        for p in probes:
            try:
                return p, self.text(p)
            except EvidenceMissing as exc:
                failures.append(exc)
        # Report the most telling reason: a missing tool beats "did not run".
        best = max(failures, key=lambda e: len(e.symptoms))
        raise best

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
    # Each fact parses one probe (or the first of alternatives) once. Missing or unreadable
    # evidence raises EvidenceMissing, which the runner reports as an ERROR finding.

    def _parsed(self, parse, *probes: str):
        probe, text = self.first_text(*probes)
        try:
            return probe, parse(probe, text)
        except ParseError as exc:
            raise EvidenceMissing(f"{probe}: unreadable output ({exc})", ("probe-unreadable",),
                                  (Evidence(probe, text.strip()[:300]),)) from None

    @cached_property
    def _smi(self):
        from .parsers import nvidia_smi

        return self._parsed(
            lambda p, t: (nvidia_smi.parse_smi_xml if p == "nvidia-smi-q-x" else nvidia_smi.parse_smi_text)(t),
            "nvidia-smi-q-x", "nvidia-smi-q")

    @cached_property
    def smi_probe(self) -> str:
        """Which probe the ``smi`` fact came from, for evidence excerpts."""
        return self._smi[0]

    @cached_property
    def smi(self):
        """GPU inventory and health (``SmiReport``), from the XML probe or else the text one."""
        return self._smi[1]

    @cached_property
    def topo(self):
        """``TopoMatrix`` from ``nvidia-smi topo -m``."""
        from .parsers.topo import parse_topo

        return self._parsed(lambda p, t: parse_topo(t), "nvidia-smi-topo")[1]

    @cached_property
    def nvlink_status(self):
        """``NvlinkStatus`` from ``nvidia-smi nvlink --status``."""
        from .parsers.nvlink import parse_nvlink_status

        return self._parsed(lambda p, t: parse_nvlink_status(t), "nvidia-smi-nvlink-status")[1]

    @cached_property
    def nvlink_errors(self):
        """``NvlinkErrors`` from ``nvidia-smi nvlink -e``."""
        from .parsers.nvlink import parse_nvlink_errors

        return self._parsed(lambda p, t: parse_nvlink_errors(t), "nvidia-smi-nvlink-errors")[1]

    @cached_property
    def lspci(self):
        """PCI devices with link capability and status, from ``lspci -vvv``."""
        from .parsers.lspci import parse_lspci

        return self._parsed(lambda p, t: parse_lspci(t), "lspci")[1]


@dataclass
class FleetContext:
    hosts: dict[str, HostContext]  # reachable hosts only, in inventory order

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
