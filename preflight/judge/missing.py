"""Why a fact cannot be had: ``EvidenceMissing`` and the reason read from a probe's record."""

from __future__ import annotations

from collections.abc import Sequence

from preflight.model import Evidence, ProbeResult
from preflight.node.schedule import hung_tool_of


class EvidenceMissing(Exception):
    """A fact cannot be had from the evidence; ``symptoms`` say why, for the diagnosis."""

    def __init__(self, message: str, symptoms: tuple[str, ...] = (), evidence: tuple[Evidence, ...] = (),
                 collected: bool = True):
        super().__init__(message)
        self.symptoms = symptoms
        self.evidence = evidence
        # False when the bundle simply has no record of the probe (a bundle assembled by hand,
        # or a run that selected other checks): nothing went wrong on the node, so the check
        # is not applicable rather than in error. A live run records every probe it starts.
        self.collected = collected


def why_missing(result: ProbeResult | None, probe: str, answered: Sequence[str] = ()) -> EvidenceMissing:
    """Why ``probe``'s evidence cannot be had. ``answered``: the other probes of the same tool
    on the host that returned output; with any, an exit 127 is not "not installed"."""
    if result is None:
        return EvidenceMissing(f"{probe} not collected in this bundle", collected=False)
    command = " ".join(result.command) or probe
    if result.error:
        if hung_tool_of(result.error):
            # Passed over because its tool hung in an earlier probe of this node: that hang is
            # the finding, reported where it happened (the probe that timed out and the host's
            # probe health); this probe has no verdict of its own to add, so it is a skip.
            return EvidenceMissing(f"{probe} skipped because {result.error.removeprefix('not run: ')}",
                                   collected=False)
        return EvidenceMissing(f"{probe}: {result.error}")
    if result.tool_missing and answered:
        # The shell's 127 is "command not found", but the dynamic loader exits 127 too when a
        # library the program needs cannot be loaded; either way the tool is there, since it
        # answered the other probes, so this one probe failed.
        tool = result.command[0] if result.command else probe
        return EvidenceMissing(
            f"{command} exited {result.exit_code} although {tool} answered {len(answered)} other probe(s) on this "
            f"host ({', '.join(answered)}): not a missing tool but this one command failing (a library or helper "
            "it loads not found, or a different PATH for this probe); run it by hand on the node",
            ("probe-failed",),
            (Evidence(probe, result.stderr.strip()[-300:] or f"{command}: exit {result.exit_code}"),),
        )
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
