"""Fleet consistency: driver, CUDA and VBIOS versions that differ between hosts.

The most common value is taken as the fleet's; hosts on another one are named, grouped by
value, so an SRE reads "14 hosts on 580.126.20, 2 on 570.195.03 (gpu07, gpu12)". Driver and
CUDA drift fails the odd hosts (mixed drivers break multi-node jobs and usually mean a
forgotten upgrade); VBIOS drift only warns.

A version whose evidence holds bytes that are not text (a NUL in the driver version) is not a
version: the parser leaves it out (``unreadable`` of the report or GPU), and the host is said to
be unreadable there (WARN ``probe-unreadable``), never compared, so it is no drift and no pass.
"""

from collections import Counter

from preflight.check import fail, fleet_check, ok, warn


def group_summary(values: dict[str, str], noun: str) -> str:
    """'14 hosts on A, 2 on B (h1, h2)': the majority first, the others named."""
    parts = []
    for i, (value, n) in enumerate(Counter(values.values()).most_common()):
        if i == 0:
            parts.append(f"{n} host{'s' if n != 1 else ''} on {noun} {value}")
            continue
        hosts = sorted(h for h, v in values.items() if v == value)
        more = ", ..." if len(hosts) > 8 else ""
        parts.append(f"{n} on {value} ({', '.join(hosts[:8])}{more})")
    return ", ".join(parts)


def compare(reports: dict, fields: dict, verdict, symptom: str, unreadable: dict | None = None,
            follows: dict | None = None):
    """One outcome per host: pass where every field matches the fleet's majority. ``unreadable``:
    noun -> a function saying where that field of a report was unreadable (None: it was not).
    ``follows``: noun -> the noun whose value brings it along (CUDA -> driver: nvidia-smi prints the
    CUDA version of its driver); a host off in both is told to move the one it follows only."""
    unreadable = unreadable or {}
    follows = follows or {}
    garbled = {h: [f"{noun} unreadable ({where})" for noun, why in unreadable.items() if (where := why(smi))]
               for h, smi in reports.items()}
    odd: dict[str, list[str]] = {h: [] for h in reports}
    actions: dict[str, list[str]] = {h: [] for h in reports}
    groups = []
    off: dict[str, set[str]] = {h: set() for h in reports}
    for noun, read in fields.items():
        values = {h: v for h, smi in reports.items() if (v := read(smi))}
        if len(set(values.values())) <= 1:
            continue
        majority = Counter(values.values()).most_common(1)[0][0]
        groups.append(group_summary(values, noun))
        for h, v in values.items():
            if v != majority:
                odd[h].append(f"{noun} {v}, the fleet runs {majority}")
                off[h].add(noun)
                if follows.get(noun) not in off[h]:
                    actions[h].append(f"move {h} to {noun} {majority} (it runs {v})")
    fleet_view = "; ".join(groups)
    for host in reports:
        if garbled[host] and not odd[host]:
            yield warn(f"{'; '.join(garbled[host])}: bytes that are not text in the evidence, so not compared "
                       "with the fleet", host=host, symptoms=["probe-unreadable"])
        elif not odd[host]:
            yield ok(f"same {' / '.join(fields)} as the fleet", host=host)
        else:
            yield verdict(f"{'; '.join(odd[host])} [{fleet_view}]", host=host, symptoms=[symptom],
                          action="; ".join(actions[host]) + ", then reboot and re-run preflight")


@fleet_check("fleet-consistency", facts=["smi"],
             summary="GPU driver and CUDA versions identical across hosts")
def driver_consistency(fleet):
    reports = fleet.facts("smi")
    if len(reports) < 2:
        return None
    return list(compare(reports, {"driver": lambda s: s.driver_version, "CUDA": lambda s: s.cuda_version},
                        fail, "driver-version-drift",
                        {"driver": lambda s: _header_unreadable(s, "driver_version"),
                         "CUDA": lambda s: _header_unreadable(s, "cuda_version")}, follows={"CUDA": "driver"}))


def _header_unreadable(smi, field: str) -> str | None:
    return "nvidia-smi's report header" if field in smi.unreadable else None


def _gpus_unreadable(smi, field: str) -> str | None:
    where = [g.pci_bus_id or str(g.index) for g in smi.gpus if field in g.unreadable]
    return f"GPU {', '.join(where)}" if where else None


@fleet_check("vbios-consistency", facts=["smi"],
             summary="GPU VBIOS versions identical across hosts with the same GPU model")
def vbios_consistency(fleet):
    # Compared within one GPU model only: an H100 node and an H200 node are meant to differ.
    by_model: dict[str, dict] = {}
    for host, smi in fleet.facts("smi").items():
        models = {g.name for g in smi.gpus if g.name}
        if len(models) == 1:
            by_model.setdefault(models.pop(), {})[host] = smi
    out = []
    for reports in by_model.values():
        if len(reports) >= 2:
            vbios = lambda s: ",".join(sorted({g.vbios_version for g in s.gpus if g.vbios_version})) or None  # noqa: E731
            out += compare(reports, {"VBIOS": vbios}, warn, "vbios-drift",
                           {"VBIOS": lambda s: _gpus_unreadable(s, "vbios_version")})
    return out or None
