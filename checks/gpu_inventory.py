"""GPU inventory: the GPUs a node shows, against the count and model its platform has.

The count and model come from the GPU census (``preflight.judge.census``): ``nvidia-smi -q``
when the bundle has it, else ``nvidia-smi nvlink --status``, ``nvidia-smi topo -m`` or
``lspci``. The summary names the command the count came from, and any other source that
counted differently (lspci listing more GPUs than the driver shows is itself a clue: a GPU on
the bus the driver lost). Driver and CUDA versions are known only from ``-q``. A count from
lspci alone can fail a node (fewer GPUs on the bus than the platform has) but never pass it,
and is not used at all when nvidia-smi ran and failed: then the driver's view is unknown.

An ``nvidia-smi -q`` that does not say it lists every GPU (no "Attached GPUs" line, or fewer
GPUs than that line counts with none said to be unreachable: an excerpt, or ``-q -i 0``) counts
nothing either: its GPUs name the model, the count comes from another view, and the summary says
why nvidia-smi -q was not counted.

An ``nvidia-smi -q -x`` (or ``-q``) that broke off part-way (the tool died mid-way, or the capture was cut)
is a finding of its own, whatever the count: it counts nothing (the GPUs before the cut are not
the node's GPUs), so the count comes from another view, and the verdict is never a PASS: a WARN
when ``nvidia-smi -q`` showed every GPU in its stead, else an ERROR naming what was not shown.
"""

from dataclasses import replace

from preflight.check import error, fail, host_check, ok, skip, warn
from preflight.judge.context import EvidenceMissing
from preflight.model import Status

# Lines of each source that show the GPUs it counted, for evidence.
_COUNT_LINES = {
    "nvidia-smi-q-x": r"<attached_gpus>|product_name",
    "nvidia-smi-q": r"[Aa]ttached GPUs|Product Name",
    "nvidia-smi-nvlink-status": r"^\s*GPU \d+:",
    "nvidia-smi-topo": r"^\s*GPU\d+\s",
    "lspci": r"NVIDIA Corporation",
}


@host_check("gpu-inventory", facts=["gpu_census", "smi", "smi_probe", "smi_cut"],
            summary="GPU count and model against the platform profile; driver and CUDA versions")
def gpu_inventory(host):
    outcome = _inventory(host)
    cut = host.optional("smi_cut")
    if cut is None:
        return outcome
    symptoms = (*outcome.symptoms, "probe-truncated")
    evidence = (*outcome.evidence, host.excerpt("nvidia-smi-q-x", r"<gpu id=|<attached_gpus>")
                or host.excerpt("nvidia-smi-q", r"^GPU [0-9A-Fa-f]|Attached GPUs"))
    evidence = tuple(e for e in evidence if e)
    if host.smi_probe == "nvidia-smi-q" and host.smi.cut is None and outcome.status is Status.PASS:
        return warn(f"{outcome.summary}; but {cut}: read nvidia-smi -q instead, which shows every GPU",
                    symptoms=symptoms, evidence=evidence, data=outcome.data)
    if outcome.status in (Status.PASS, Status.SKIP):
        return error(f"{cut}; {outcome.summary}", symptoms=symptoms, evidence=evidence, data=outcome.data)
    return replace(outcome, summary=f"{outcome.summary}; {cut}", symptoms=symptoms, evidence=evidence)


def _inventory(host):
    census = host.gpu_census
    try:
        smi, smi_why = host.smi, None
    except EvidenceMissing as exc:
        smi, smi_why = None, exc
    expected = host.profile.gpu_count
    models = sorted(set(census.models))
    if smi is not None:
        versions = f"driver {smi.driver_version or '?'}, CUDA {smi.cuda_version or '?'}"
    else:
        versions = f"driver and CUDA versions unknown: {smi_why}"
    data = {"gpu_count": census.count, "gpu_models": models,
            "driver_version": smi.driver_version if smi else None,
            "cuda_version": smi.cuda_version if smi else None, "profile": host.profile.id}
    if census.count_probe not in ("nvidia-smi-q-x", "nvidia-smi-q"):
        data["counted_by"] = census.count_probe  # -q, the usual source, is left unsaid
    if census.uncounted:
        data["not_counted"] = list(census.uncounted)
    if census.count is None:
        return skip(f"{', '.join(models) or 'GPU model'} named in {census.model_probe}, but no "
                    f"evidence counts the GPUs ({versions})" + "".join(f"; {u}" for u in census.uncounted), data=data)
    seen = census.count
    on_bus_only = census.count_probe == "lspci"
    if on_bus_only and smi_why is not None and smi_why.collected:
        # nvidia-smi ran and failed: what the driver sees is unknown, and the bus cannot say.
        raise smi_why
    source = _source(census)
    smi_counted = census.count_probe in ("nvidia-smi-q-x", "nvidia-smi-q")

    def evidence():
        # Only a finding that is not a pass shows it: a scan of an 8-GPU -q -x is milliseconds a host.
        return [host.excerpt(census.count_probe, _COUNT_LINES.get(census.count_probe, "GPU"),
                             limit=6 if smi_counted else 8)]
    if seen == 0:
        return fail(f"no GPU listed by {_command(census)} ({source}{versions})", symptoms=["gpu-missing"],
                    evidence=evidence(), data=data)
    what = f"{seen} x {', '.join(models)}" if models else f"{seen} GPUs"
    if expected is None:
        return skip(f"{what} ({source}{versions}); no GPU count to compare with: "
                    f"{host.profile.why}", data=data)
    if seen < expected:
        return fail(f"{seen} of {expected} GPUs visible ({source}{versions})",
                    symptoms=["gpu-missing"], evidence=evidence(), data=data)
    if on_bus_only:
        # lspci lists what is on the bus, a GPU the driver lost included: enough to say one
        # is missing, not enough to pass.
        return skip(f"{what} on the PCI bus ({source}{versions}); whether the driver sees them "
                    "is not in the evidence", data=data)
    if seen > expected:
        # More GPUs than the platform has: the wrong profile, a board that is not what it was
        # sold as, or a listing counted twice. Not a fault of a GPU, but nothing to pass either.
        return warn(f"{seen} GPUs visible, more than the {expected} of a {host.profile.name} "
                    f"({source}{versions}): check the platform profile (--profile) and the node's hardware",
                    symptoms=["gpu-count-unexpected"], evidence=evidence(), data=data)
    return ok(f"{what} ({source}{versions})", data=data)


def _command(census) -> str:
    return next(c.command for c in census.counts if c.probe == census.count_probe)


def _source(census) -> str:
    """"counted by COMMAND[, while OTHER shows N]; " where the count is not nvidia-smi -q's own
    (the usual source, left unsaid) or another source disagrees with it; else ""."""
    others = census.disagreements()
    if census.count_probe in ("nvidia-smi-q-x", "nvidia-smi-q") and not others:
        return ""
    # Where nvidia-smi -q listed GPUs it does not say are all (an excerpt, a selection), say why
    # its number was not the count, so that a reader does not hold the two against each other.
    not_counted = "".join(f" ({u})" for u in census.uncounted)
    return (f"counted by {_command(census)}" + (f", while {', '.join(others)}" if others else "")
            + not_counted + "; ")
