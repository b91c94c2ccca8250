"""GPU inventory: the GPUs a node shows, against the count and model its platform has."""

from preflight.check import fail, host_check, ok, skip, warn


@host_check("gpu-inventory", facts=["smi", "smi_probe"],
            summary="GPU count and model against the platform profile; driver and CUDA versions")
def gpu_inventory(host):
    smi = host.smi
    gpus = smi.gpus
    expected = host.profile.gpu_count
    models = sorted({g.name for g in gpus if g.name})
    versions = f"driver {smi.driver_version or '?'}, CUDA {smi.cuda_version or '?'}"
    data = {"gpu_count": len(gpus), "gpu_models": models, "driver_version": smi.driver_version,
            "cuda_version": smi.cuda_version, "profile": host.profile.id}
    # `attached_gpus` is the driver's own count; a GPU that stopped answering can be counted
    # there yet missing from the per-GPU list, which is still a missing GPU.
    seen = len(gpus)
    if not gpus:
        return fail(f"no GPU listed by nvidia-smi ({versions})", symptoms=["gpu-missing"],
                    evidence=[host.excerpt(host.smi_probe, r"[Aa]ttached|attached_gpus")], data=data)
    if expected is None:
        return skip(f"{seen} x {', '.join(models)} ({versions}); no GPU count to compare with: "
                    f"{host.profile.why}", data=data)
    if seen < expected:
        return fail(f"{seen} of {expected} GPUs visible ({versions})", symptoms=["gpu-missing"],
                    evidence=[host.excerpt(host.smi_probe,
                                           r"[Aa]ttached GPUs|<attached_gpus>|Product Name|product_name")],
                    data=data)
    if seen > expected:
        # More GPUs than the platform has: the wrong profile, a board that is not what it was
        # sold as, or a listing counted twice. Not a fault of a GPU, but nothing to pass either.
        return warn(f"{seen} GPUs visible, more than the {expected} of a {host.profile.name} ({versions}): "
                    "check the platform profile (--profile) and the node's hardware",
                    symptoms=["gpu-count-unexpected"],
                    evidence=[host.excerpt(host.smi_probe, r"[Aa]ttached GPUs|<attached_gpus>")], data=data)
    return ok(f"{seen} x {', '.join(models)} ({versions})", data=data)
