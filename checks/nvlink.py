"""NVLink links and NVLink topology against the platform profile (check ``nvlink``).

Judges two views of the same fabric:

- ``nvidia-smi nvlink --status``: every GPU must list ``nvlink.links_per_gpu`` links, none
  ``<inactive>`` (NVIDIA Health Validation ``max_inactive_nvlinks`` = 0, docs/sources.md §2), each at
  ``nvlink.link_speed_gbs`` (26.562 GB/s NVLink4, 53.125 NVLink5). nvidia-smi prints the speed
  rounded to three decimals (26.562 for 26.5625), and a link that trained down shows a
  clearly lower figure, so a 1% tolerance absorbs only the rounding. NVML's "all links are
  inActive" message (a GPU whose links all failed, open-gpu-kernel-modules#1150) is a fault.
- ``nvidia-smi topo -m``: every GPU pair must show at least the profile's
  ``nvlink.pair_topology`` (NV18 on HGX boards). A pair at NV17 lost a link; a pair at
  SYS/NODE/PHB has no NVLink path at all.

Link state does not depend on load (unlike PCIe, NVLink does not downshift when idle), so an
idle node is judged as it is. Not applicable, hence SKIP and never FAIL: a single GPU (a VM
slice has no peer to link to), GPUs in MIG mode (nvidia-smi cannot query NVLink there) and GPUs
without NVLink. The generic profile has no link count, speed or NV# to hold a node to (the V100
hybrid cube mesh mixes NV1/NV2 by design), so there only the link states that are a fault on
any platform are judged: an SXM GPU with some links up and others inactive, or a GPU with fewer
links up than a peer of its model; PCIe cards with NVLink bridges leave links inactive by
design and are never failed for it (checks/_link_states.py). Where every GPU's product name is
an SXM part of ``playbooks/nvlink_parts.yaml`` (V100/A100/A800-SXM, H100/H200/H800 SXM, B200, B300),
the part itself is the expectation: it has NVLink, so all links inactive is a fault (not "no
expectation"), and where the table gives the part's link count, fewer links listed is one too.
The part is learnt from the GPU's own ``nvlink --status`` header, else from any other probe naming
the node's GPUs (checks/_nvlink_part.py), and one GPU whose links are down is judged by it.
With a profile of several GPUs, one GPU listed is judged against the profile's figures and never
called "not applicable"; a clean one is a SKIP naming the board (the count is gpu-inventory's).
Either probe alone is enough to judge; with both missing the check cannot tell.
On B300 the links train in hardware whatever the fabric state, so all-active links do not
prove the fabric usable there: the ``fabric-manager`` check judges that side.
"""

from __future__ import annotations

import re
from itertools import combinations

from preflight.check import error, fail, host_check, ok, skip
from preflight.judge.context import EvidenceMissing
from preflight.model import Evidence

from ._link_states import judge_states
from ._nvlink_part import GpuPart, common_part, parts_of, said

STATUS = "nvidia-smi-nvlink-status"
TOPO = "nvidia-smi-topo"
# Relative: nvidia-smi rounds 26.5625 to 26.562 and 53.125 prints exactly.
SPEED_TOLERANCE = 0.01
ACTION = ("drain the node, then reset the GPU (nvidia-smi -r) -> reboot -> open a service case if "
          "links stay down (NVIDIA Health Validation nvlink_active); confirm with "
          "nvidia-smi nvlink --status and nvidia-smi topo -m")

_NV = re.compile(r"NV(\d+)")
_GPU_LINE = re.compile(r"\s*GPU (\d+):")
_LINK_LINE = re.compile(r"\s*Link (\d+):")


@host_check("nvlink", facts=["nvlink_status", "topo", "gpu_census"],
            summary="NVLink links active at full count and speed; NV# between every GPU pair")
def nvlink(host):
    profile = host.profile
    want_links = profile.get("nvlink.links_per_gpu")
    status, status_missing = _fact(host, "nvlink_status")
    topo, topo_missing = _fact(host, "topo")
    if not want_links:
        return _without_figures(host, status, status_missing)
    if status is None and topo is None:
        raise status_missing

    gpus = status.gpus if status else ()
    reasons = {g.reason for g in gpus}
    if gpus and reasons == {"mig-mode"}:
        return skip(f"MIG mode: nvidia-smi cannot query NVLink ({gpus[0].message})")
    if gpus and reasons == {"no-nvlink"}:
        return skip(f"{gpus[0].name or 'this GPU'} has no NVLink ({gpus[0].message})")
    count = len(gpus) or (len(topo.gpus) if topo else 0)
    lone = None
    if count == 1:
        expected = profile.gpu_count
        if not (isinstance(expected, int) and expected > 1):
            return skip("1 GPU: NVLink not applicable")
        # The profile is a board of several GPUs: one listed is not "not applicable" there. Its
        # links are judged against the board's figures when it lists them; the count is
        # gpu-inventory's to judge.
        lone = f"1 GPU listed where a {profile.name} has {expected} (gpu-inventory judges the count)"
        if not any(g.links or g.reason == "all-links-inactive" for g in gpus):
            return skip(f"{lone}: NVLink not judged")
    if count == 0:
        why = f" ({topo_missing})" if topo_missing else ""
        return error(f"cannot judge: nvidia-smi nvlink --status listed no GPU and the topology is missing{why}")

    speed = profile.get("nvlink.link_speed_gbs")
    problems: list[str] = []
    notes: list[str] = [lone] if lone else []
    bad_links: dict[int, set[int] | None] = {}
    judged_gpus = _judge_links(gpus, want_links, speed, problems, notes, bad_links)
    if status is not None and not gpus:
        notes.append("nvidia-smi nvlink --status listed no GPU")
    pair = profile.get("nvlink.pair_topology")
    bad_rows: set[str] = set()
    judged_pairs = _judge_topology(topo, pair, problems, notes, bad_rows) if topo else 0
    if topo is None:
        notes.append(f"topology not checked ({topo_missing})")
    if status is None:
        notes.append(f"link status not checked ({status_missing})")

    data = {"gpus": count, "links_per_gpu": want_links, "link_speed_gbs": speed,
            "pair_topology": pair, "problems": problems, "notes": notes}
    if problems:
        evidence = []
        if bad_links:
            evidence.append(Evidence(STATUS, _status_excerpt(host.result(STATUS).text, bad_links)))
        if bad_rows:
            rows = "|".join(sorted(bad_rows))
            evidence.append(host.excerpt(TOPO, rf"CPU Affinity|^\s*({rows})\s", limit=len(bad_rows) + 1))
        return fail("; ".join(_capped(problems) + notes), symptoms=["nvlink-down"], evidence=evidence,
                    data=data, action=ACTION)
    if not judged_gpus and not judged_pairs:
        return skip("NVLink not judged: " + "; ".join(notes))
    parts = []
    if judged_gpus:
        speeds = sorted({link.speed_gbps for g in gpus for link in g.links if link.active})
        parts.append(f"{judged_gpus} GPUs x {want_links} links active at "
                     f"{'/'.join(f'{s:g}' for s in speeds)} GB/s")
    if judged_pairs:
        parts.append(f"{pair} between all {judged_pairs} GPU pairs")
    if profile.get("nvlink.check_fabric_state"):
        # docs/sources.md §2, B300 caveat: ALI trains links in hardware whatever the fabric state.
        notes.append("active links alone do not prove the fabric usable on this platform "
                     "(see fabric-manager)")
    if lone:
        # One GPU of a board judged whole is no pass of the board's NVLink.
        return skip("; ".join(parts + notes) + "; the board's other GPUs not shown, so not judged", data=data)
    return ok("; ".join(parts + notes), data=data)


def _without_figures(host, status, missing):
    """The generic profile's part: link states that are a fault on any platform (checks/_link_states.py).
    Counts, speeds and the topology need a platform figure and are not judged."""
    why = host.profile.why
    if status is None:
        # Without a platform figure a failed link listing is no fault of the node: on a GPU
        # without NVLink it is all the tool can say.
        return skip(f"no NVLink expectation for this platform: {why}")
    gpus = status.gpus
    reasons = {g.reason for g in gpus}
    if not gpus or reasons <= {"mig-mode", "no-nvlink", "error"}:
        return skip(f"no NVLink expectation for this platform, and no link states to judge: {why}")
    excerpt = " (a pasted excerpt: other GPUs not shown)" if status.excerpt else ""
    parts = parts_of(gpus, host.optional("gpu_census"))
    part = common_part(parts)
    # One GPU whose links are all up is a VM slice or a lone card (not judged below); one whose
    # links are down is judged by its part, which has NVLink whatever else the node has.
    faulty = any(g.reason == "all-links-inactive" or g.inactive_count for g in gpus)
    if part is not None and (len(gpus) > 1 or status.excerpt or faulty):
        return _judge_part(host, status, part, excerpt)
    states = judge_states(gpus, {i: p.shape for i, p in parts.items() if p.shape != "unknown"})
    data = {"gpus": len(gpus), "problems": list(states.problems), "by_design": list(states.by_design)}
    if states.problems:
        return fail("; ".join(_capped(list(states.problems))) + excerpt, symptoms=["nvlink-down"],
                    evidence=[Evidence(STATUS, _status_excerpt(host.result(STATUS).text, states.bad_links))],
                    data=data, action=ACTION)
    if states.by_design:
        gpus_with = f"{states.judged} GPU{'s' if states.judged != 1 else ''}"
        return skip(f"{gpus_with} with NVLink; inactive links not judged: "
                    + "; ".join(_capped(list(states.by_design)))
                    + f" (PCIe cards reach their peers only through the bridges fitted){excerpt}", data=data)
    if states.judged < 2 and not status.excerpt:
        return skip("1 GPU: NVLink not applicable")
    return ok(f"{states.judged} GPUs: all {states.active} listed links active; link count, speed and "
              f"topology not judged without a platform figure ({why}){excerpt}", data=data)


def _judge_part(host, status, gpu_part: GpuPart, excerpt: str):
    """Link states and counts of a node of one SXM part, with no platform profile: the part has
    NVLink (and, where the table says, ``links_per_gpu`` links)."""
    part = gpu_part.part
    want = part.links_per_gpu
    problems: list[str] = []
    bad: dict[int, set[int] | None] = {}
    judged = 0
    for g in status.gpus:
        label = f"GPU{g.index} ({g.name})"
        if g.reason == "all-links-inactive":
            problems.append(f"{label}: all links inactive ({g.message})")
            bad[g.index] = None
            continue
        if not g.links:
            continue  # MIG mode or an error line: not judged
        judged += 1
        inactive = [link.number for link in g.links if not link.active]
        if inactive:
            rest = "while its other links are up" if g.active_count else "none of its links up"
            problems.append(f"{label}: {len(inactive)} of {len(g.links)} links inactive "
                            f"(link {', '.join(map(str, inactive))}) {rest}")
        if want and len(g.links) < want and not status.excerpt:
            problems.append(f"{label}: {len(g.links)} of {want} links listed")
        if inactive or (want and len(g.links) < want):
            bad[g.index] = set(inactive)
    counts = sorted({len(g.links) for g in status.gpus if g.links})
    expected = f"{want} links per GPU" if want else "NVLink (link count not known from a source: not judged)"
    basis = (f"the {part.family} has {expected}, from its form factor{said(gpu_part)}; no platform profile "
             f"matched ({host.profile.why})")
    data = {"gpus": len(status.gpus), "part": part.family, "links_per_gpu": want, "problems": problems,
            "source": part.source, "part_named_by": gpu_part.source}
    if problems:
        return fail("; ".join(_capped(problems)) + f" [{basis}]{excerpt}", symptoms=["nvlink-down"],
                    evidence=[Evidence(STATUS, _status_excerpt(host.result(STATUS).text, bad))], data=data,
                    action=ACTION)
    if not judged:
        return skip(f"NVLink not judged: no GPU listed its links [{basis}]{excerpt}", data=data)
    if not want and len(counts) > 1:
        return fail(f"GPUs of one part list different link counts ({'/'.join(map(str, counts))}) "
                    f"[{basis}]{excerpt}", symptoms=["nvlink-down"], data=data, action=ACTION)
    return ok(f"{judged} GPUs x {'/'.join(map(str, counts))} links active [{basis}; speed and topology not "
              f"judged without a platform figure]{excerpt}", data=data)


def _fact(host, name: str):
    """(fact, None) or (None, why it is missing): either NVLink view alone can be judged."""
    try:
        return getattr(host, name), None
    except EvidenceMissing as exc:
        return None, exc


def _judge_links(gpus, want_links: int, speed: float | None, problems: list[str],
                 notes: list[str], bad_links: dict[int, set[int] | None]) -> int:
    """Append each GPU's link faults; return how many GPUs had links to judge."""
    judged = 0
    dead = [gpu for gpu in gpus if gpu.reason == "all-links-inactive"]
    if dead:
        labels = ", ".join(f"GPU{gpu.index}" for gpu in dead)
        problems.append(f"all links inactive on {len(dead)} of {len(gpus)} GPUs ({labels}): "
                        f"{dead[0].message!r}")
        bad_links.update((gpu.index, None) for gpu in dead)
    for gpu in gpus:
        label = f"GPU{gpu.index}"
        if gpu.reason == "all-links-inactive":
            continue
        if not gpu.links:
            notes.append(f"{label} not judged ({gpu.message or 'no link lines: output truncated?'})")
            continue
        judged += 1
        inactive = [link.number for link in gpu.links if not link.active]
        slow = [link for link in gpu.links
                if link.active and speed and link.speed_gbps < speed * (1 - SPEED_TOLERANCE)]
        if inactive:
            problems.append(f"{label}: {len(inactive)} of {len(gpu.links)} links inactive "
                            f"(link {', '.join(map(str, inactive))})")
        if len(gpu.links) < want_links:
            problems.append(f"{label}: {len(gpu.links)} of {want_links} links listed")
        if slow:
            seen = "/".join(sorted({f"{link.speed_gbps:g}" for link in slow}))
            which = "" if len(slow) == len(gpu.links) else f" (link {', '.join(str(k.number) for k in slow)})"
            problems.append(f"{label}: {len(slow)} of {len(gpu.links)} links at {seen} GB/s, "
                            f"below {speed:g}{which}")
        if inactive or slow or len(gpu.links) < want_links:
            bad_links[gpu.index] = set(inactive) | {link.number for link in slow}
    return judged


def _judge_topology(topo, pair: str | None, problems: list[str], notes: list[str],
                    bad_rows: set[str]) -> int:
    """Append GPU pairs below the profile's NV#; return how many pairs were judged."""
    want = _NV.fullmatch(pair or "")
    if not want:
        return 0
    if topo.kind != "topology":
        notes.append("the topology probe holds a P2P matrix, not topo -m: pairs not checked")
        return 0
    judged, short, unread = 0, [], 0
    for a, b in combinations(topo.gpus, 2):
        cell = topo.link(a, b)
        if cell is None:
            unread += 1
            continue
        judged += 1
        if topo.nvlink_count(a, b) < int(want.group(1)):
            short.append(f"{a}-{b} {cell}")
            bad_rows.update((a, b))
    if short:
        more = f" and {len(short) - 4} more" if len(short) > 4 else ""
        problems.append(f"topology: {len(short)} of {judged} GPU pairs below {pair} "
                        f"({', '.join(short[:4])}{more})")
    if unread:
        notes.append(f"{unread} GPU pairs not in the topology capture (truncated?)")
    return judged


def _capped(problems: list[str], shown: int = 4) -> list[str]:
    """The first few problems for the summary; data["problems"] keeps them all."""
    if len(problems) <= shown:
        return problems
    return problems[:shown] + [f"and {len(problems) - shown} more"]


def _status_excerpt(text: str, bad: dict[int, set[int] | None], per_gpu: int = 4) -> str:
    """Each faulty GPU's header and up to ``per_gpu`` of its faulty link lines (its message
    lines when it lists no links)."""
    keep: list[str] = []
    gpu, taken = None, 0
    for line in text.splitlines():
        header = _GPU_LINE.match(line)
        if header:
            gpu, taken = int(header.group(1)), 0
            if gpu in bad:
                keep.append(line.strip())
            continue
        if gpu not in bad or not line.strip() or taken >= per_gpu:
            continue
        link = _LINK_LINE.match(line)
        links = bad[gpu]
        if (links is None and not link) or (links and link and int(link.group(1)) in links):
            keep.append(line.strip())
            taken += 1
    return "\n".join(keep)
