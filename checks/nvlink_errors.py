"""NVLink error counters from ``nvidia-smi nvlink -e`` (check ``nvlink-errors``).

Input: per GPU and link, ``Replay Errors``, ``Recovery Errors`` and ``CRC Errors`` (Hopper), or
``CRC Flit`` / ``CRC Data`` on older parts. The counters accumulate since the driver loaded,
so any non-zero count is a past event on that link, not a rate.

How a count is read:

- Recovery (the link went down and retrained) above zero: FAIL. Sweeps of 320 NVLink5 GPUs
  found every counter at zero but one link's recovery count (505, still rising); that link
  went down five days later with Xid 149 (marin-community/marin#9086).
- Replay or CRC above zero, no recovery: WARN. These errors were corrected by retransmission,
  and a count since driver load does not say the link is failing now; whether it rises under
  load does. Tools that alert on them use a threshold of 0 by default (facebookresearch/gcm
  check-dcgmi nvlink), so they are reported, not ignored.
- Other counter names (the longer NVLink5 lists) are not judged: no capture of them is in
  the corpus to tell error counters from traffic counters.

Counters are meaningful wherever NVLink exists, so this check needs no platform profile:
a generic-profile V100 with CRC errors is still worth a warning. It skips only when nothing
was counted: a 1-GPU VM printing nothing, MIG mode, no NVLink, or every link down (``nvlink``
judges that).
"""

from __future__ import annotations

from preflight.check import fail, host_check, ok, skip, warn

ERRORS = "nvidia-smi-nvlink-errors"
RECOVERY = "recovery"
CORRECTED = ("replay", "crc", "crc_flit", "crc_data")
FAIL_ACTION = ("drain the node, then reset the GPU (nvidia-smi -r) -> reboot -> replace the hardware if "
               "recovery errors recur (Xid catalog WORKFLOW_NVLINK_ERR); watch nvidia-smi nvlink -e")
WARN_ACTION = ("note the counts, run nccl all_reduce (or the soak) and read nvidia-smi nvlink -e again: "
               "counts that rise under load mean a marginal link; reset the GPU or reboot, and replace "
               "the hardware if they keep rising")


@host_check("nvlink-errors", facts=["nvlink_errors"],
            summary="NVLink replay, recovery and CRC error counters at zero")
def nvlink_errors(host):
    report = host.nvlink_errors
    counted = [g for g in report.gpus if g.links]
    if not counted:
        why = "; ".join(sorted({g.message for g in report.gpus if g.message})) or "; ".join(report.notes)
        return skip(f"no NVLink counters to judge ({why or 'no GPU listed'})")

    recovery, corrected = [], []
    for gpu, link, name, value in report.nonzero():
        entry = f"GPU{gpu} link {link} {name} {value}"
        if RECOVERY in name:
            recovery.append(entry)
        elif name in CORRECTED:
            corrected.append(entry)
    links = sum(len(g.links) for g in counted)
    data = {"gpus": len(counted), "links": links, "recovery": recovery, "corrected": corrected}
    if recovery or corrected:
        bad_gpus = "|".join(sorted({str(gpu) for gpu, *_ in report.nonzero()}))
        evidence = [host.excerpt(ERRORS, rf"^\s*GPU ({bad_gpus}):|:\s*[1-9]\d*\s*$", limit=24)]
        found = _listed(recovery + corrected)
        if recovery:
            return fail(f"NVLink recovery errors: {found}", symptoms=["nvlink-errors"], evidence=evidence,
                        data=data, action=FAIL_ACTION)
        return warn(f"NVLink errors corrected by replay: {found} (counted since driver load)",
                    symptoms=["nvlink-errors"], evidence=evidence, data=data, action=WARN_ACTION)
    gpus = f"{len(counted)} GPU" + ("s" if len(counted) > 1 else "")
    unreadable = [n for n in report.notes if "unreadable counter" in n]
    if unreadable:
        # A counter whose value is not a number (a damaged capture, another script's digit) may
        # hold anything: the others being zero is no pass of it.
        return warn(f"{len(unreadable)} NVLink error counter(s) unreadable: {'; '.join(unreadable[:4])}; the "
                    f"{links} links read otherwise show zero", symptoms=["probe-unreadable"], data=data,
                    evidence=[host.excerpt(ERRORS, r"Errors?:", limit=4)])
    return ok(f"all NVLink error counters zero ({links} links on {gpus})", data=data)


def _listed(entries: list[str]) -> str:
    more = f" and {len(entries) - 6} more" if len(entries) > 6 else ""
    return ", ".join(entries[:6]) + more
