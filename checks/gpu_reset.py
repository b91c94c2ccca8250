"""Whether the driver asks for a GPU reset, drain or reboot (check ``gpu-reset``).

Two views of the same driver state in ``nvidia-smi -q``:

- ``GPU Reset Status`` (drivers 535-58x; "deprecated" in 59x, which reads as not reported):
  ``Reset Required: Yes`` -> FAIL; ``Drain and Reset Recommended: Yes`` -> FAIL as well: it is
  the flag NVML reports as the DRAIN_AND_RESET recovery action, for which DCGM says "Do not
  schedule new work on this GPU" (DCGM_FR_GPU_RECOVERY_DRAIN_RESET, docs/sources.md §5.3). The
  GPU still runs what it has, but a node under acceptance is about to get new work.
- ``GPU Recovery Action`` (NVML's recovery action, 56x+): ``None`` passes; ``Drain P2P`` ->
  WARN (a transitional state: once peer-to-peer traffic is drained NVML reports one of the
  other actions, which a re-run then judges); any
  action that resets or reboots (Reset, Reboot, Drain and Reset, and the newer bus reset /
  system reboot / IMEX recovery) -> FAIL, since the GPU cannot be trusted with new work
  until it is done (NVIDIA A100 memory error management, "Error Recovery and Response
  Flags"; NVML ``nvmlDeviceGpuRecoveryAction_t``, docs/sources.md §5.2). A value preflight does not
  know warns rather than passes.

Every GPU is judged; one outcome per verdict lists the GPUs. Not applicable (SKIP): no GPU
reports either view (drivers before 535, excerpts without those sections).
"""

from __future__ import annotations

from preflight.check import fail, host_check, ok, skip, warn
from preflight.model import Evidence

_ORDER = {"fail": 0, "warn": 1, "pass": 2}
ACTIONS = {
    "reset": "stop the GPU processes and reset the GPU (nvidia-smi -r -i {i}), then re-run preflight",
    "reboot": "drain the node and reboot it, then re-run preflight",
    "drain": "stop peer-to-peer traffic to the GPU (drain its jobs) before new work; re-run preflight",
}


@host_check("gpu-reset", facts=["smi", "smi_probe"],
            summary="GPU Reset Status and GPU Recovery Action: does the driver ask for a reset, drain or reboot")
def gpu_reset(host):
    gpus = [g for g in host.smi.gpus if g.reset_required is not None
            or g.drain_and_reset_recommended is not None or g.recovery_action is not None]
    if not gpus:
        return skip("GPU Reset Status / GPU Recovery Action not reported (driver before 535, or an excerpt)")
    judged = [(gpu, *judge(gpu)) for gpu in gpus]
    bad = [j for j in judged if j[1] != "pass"]
    if not bad:
        return ok(f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''}: no reset, drain or reboot asked for "
                  f"({_states(gpus)})")
    out = []
    for verdict in ("fail", "warn"):
        hits = [(g, said, step) for g, v, said, step in bad if v == verdict]
        if not hits:
            continue
        names = "; ".join(f"{_label(g)}: {said}" for g, said, _ in hits)
        action = "; ".join(f"{_label(g)}: {step.format(i=g.index if g.index is not None else '<index>')}"
                           for g, _, step in hits)
        make = fail if verdict == "fail" else warn
        out.append(make(f"the driver asks for recovery on {len(hits)} of {len(gpus)} GPUs: {names}",
                        symptoms=["gpu-recovery-action"],
                        evidence=[Evidence(host.smi_probe, "\n".join(f"{_label(g)}: {said}" for g, said, _ in hits))],
                        action=action, data={"gpus": [g.pci_bus_id for g, _, _ in hits]}))
    return out


def judge(gpu) -> tuple[str, str, str]:
    """(pass | warn | fail, what nvidia-smi said, the next step) for one GPU; the worst of
    its Reset Status and Recovery Action."""
    views = [_recovery(gpu.recovery_action)]
    if gpu.reset_required:
        views.append(("fail", "Reset Required: Yes", ACTIONS["reset"]))
    elif gpu.drain_and_reset_recommended:
        views.append(("fail", "Drain and Reset Recommended: Yes",
                      "drain the GPU's jobs, then " + ACTIONS["reset"]))
    return min(views, key=lambda v: _ORDER[v[0]])


def _recovery(action: str | None) -> tuple[str, str, str]:
    if action is None:
        return "pass", "", ""
    said = f"GPU Recovery Action: {action}"
    words = action.casefold().replace("_", " ")
    if words == "none":
        return "pass", said, ""
    if "reboot" in words:
        return "fail", said, ACTIONS["reboot"]
    if "imex" in words:
        return "fail", said, "recover the node's IMEX domain, then re-run preflight"
    if "reset" in words or "flr" in words:
        step = ACTIONS["reset"] if "drain" not in words else "drain the GPU's jobs, then " + ACTIONS["reset"]
        return "fail", said, step
    if "drain" in words:
        return "warn", said, ACTIONS["drain"]
    return "warn", f"{said} (a value preflight does not know)", "look the action up in nvidia-smi's documentation"


def _states(gpus) -> str:
    seen = sorted({f"Recovery Action {g.recovery_action}" for g in gpus if g.recovery_action}
                  | {"Reset Required No" for g in gpus if g.reset_required is False})
    return ", ".join(seen)


def _label(gpu) -> str:
    index = f"GPU{gpu.index}" if gpu.index is not None else "GPU"
    return f"{index} {gpu.pci_bus_id}" if gpu.pci_bus_id else index
