"""Persistence mode: off means GPU state is torn down between jobs (latency spikes)."""

from preflight.check import host_check, ok, skip, warn


@host_check("persistence-mode", facts=["smi", "smi_probe"],
            summary="persistence mode enabled on every GPU")
def persistence_mode(host):
    gpus = host.smi.gpus
    known = [g for g in gpus if g.persistence_mode is not None]
    if not known:
        return skip("persistence mode not reported")
    off = [g for g in known if not g.persistence_mode]
    if off:
        names = ", ".join(_gpu_label(g) for g in off)
        return warn(f"persistence mode off on {len(off)} of {_gpus(len(known))} ({names})",
                    symptoms=["persistence-mode-off"],
                    evidence=[host.excerpt(host.smi_probe, r"Persistence Mode|persistence_mode")])
    return ok(f"persistence mode on, {_gpus(len(known))}")


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"  # "1 GPUs" read on the lent one-GPU H200


def _gpu_label(gpu):
    return f"GPU{gpu.index} {gpu.pci_bus_id or ''}".strip()
