"""``preflight prolog``: the program for slurm.conf's ``Prolog``, run on a node before each job.

It must take seconds and answer with its exit code alone: a prolog that exits non-zero makes
Slurm drain the node (reason "Prolog error") and requeue the job, so it never calls a Slurm
command itself. It runs the fast static checks of the node (``PROLOG_CHECKS``, or ``--checks``),
leaving out tools that take long to answer (``SLOW_TOOLS``: mlxfwmanager reads every NIC's flash),
within ``--budget`` seconds (default 10), and keeps the report on the node's disk like the
healthcheck does.

Exit status: 1 only when a check FAILs. ERROR (could not tell: a tool timed out) exits 0, so a
slow tool never drains a node and requeues every job it was given; the healthcheck, which runs
with a larger budget, is where such a node is looked at again.
"""

from __future__ import annotations

from preflight.contracts import EXIT_FAILED, EXIT_OK

# GPUs present and healthy, the NVSwitch fabric up, the NIC ports up: what makes a job fail at
# its start. The NIC firmware matrix, PCIe widths, kernel-log scans and fleet checks are left to
# the healthcheck and to runs.
PROLOG_CHECKS = ("gpu-inventory", "gpu-memory", "gpu-reset", "fabric-manager", "ib-port-down")
SLOW_TOOLS = frozenset({"mlxfwmanager"})
DEFAULT_BUDGET_S = 10.0


def prolog_probes(probes):
    """The checks' probes without the slow tools (a check reads what the others give); the
    healthcheck's plan then keeps the static ones and bounds each by the budget."""
    return tuple(p for p in probes if p.tool not in SLOW_TOOLS)


def exit_code(status: str) -> int:
    return EXIT_FAILED if status == "fail" else EXIT_OK


def summary(analysis, code: int) -> str:
    """One line after the table: the exit status and why, and the checks that judged nothing
    (a node without a GPU or a NIC answers exit 0 with every GPU check unjudged: said, not silent)."""
    findings = [f for f in analysis.findings if f.check in PROLOG_CHECKS]
    unjudged = sorted({f.check for f in findings if f.status.value == "error"})
    skipped = sorted({f.check for f in findings if f.status.value == "skip"})
    why = {EXIT_FAILED: "a check failed: Slurm drains the node and requeues the job",
           EXIT_OK: "nothing failed"}[code]
    if code == EXIT_OK and unjudged:
        why += " (could not tell is never a FAIL: the healthcheck looks again)"
    return (f"prolog: exit {code}: {why}" + (f"; not judged: {', '.join(unjudged)}" if unjudged else "")
            + (f"; skipped: {', '.join(skipped)}" if skipped else ""))

