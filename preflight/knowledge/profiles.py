"""Platform profiles: what a healthy node of a given platform looks like.

Profiles are YAML files under ``playbooks/profiles/`` (and any ``--profile-file``), one
platform each, every figure with its source. A host's profile is the one named by
``--profile``, otherwise the first whose ``match.gpu_name`` regex finds the host's GPU model
and whose ``match.min_gpus`` the host reaches, otherwise ``generic``, which judges only what
holds on any node, and says so. The model comes from whichever evidence names the GPUs
(``preflight.judge.census``: nvidia-smi -q, else nvidia-smi nvlink --status), else from the
PCI device ids lspci lists, matched against each profile's ``gpu.pci_device_id``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from preflight.knowledge import nic_matrix
from preflight.knowledge.datafile import read_yaml
from preflight.shipped import playbooks_dir

PROFILE_DIR = playbooks_dir() / "profiles"
GENERIC = "generic"


class ProfileError(ValueError):
    pass


@dataclass(frozen=True)
class Profile:
    id: str
    name: str
    data: dict[str, Any] = field(compare=False, hash=False)
    source_file: str = ""
    why: str = ""  # how this profile came to be chosen for a host

    @property
    def generic(self) -> bool:
        return self.id == GENERIC

    def get(self, path: str, default: Any = None) -> Any:
        """A dotted lookup: ``profile.get("nvlink.links_per_gpu")``; None when not set."""
        node: Any = self.data
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def source(self, path: str) -> str | None:
        return (self.data.get("sources") or {}).get(path)

    @property
    def gpu_count(self) -> int | None:
        return self.get("gpu.count")

    def chosen(self, why: str) -> Profile:
        return Profile(self.id, self.name, self.data, self.source_file, why)


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _positive_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _regex(v: Any) -> bool:
    if not isinstance(v, str):
        return False
    try:
        re.compile(v)
    except re.error:
        return False
    return True


# Every key a check reads, with what it must be: a profile is data the checks trust, so a
# string for a number or a number for a regex is refused naming the file and key, and a key
# misspelled inside a known section ("nvlink.link_per_gpu") is refused rather than ignored.
# Sections not listed here are a site's own and are kept as they are.
SCHEMA: dict[str, dict[str, tuple[str, Callable[[Any], bool]]]] = {
    "match": {"gpu_name": ("a regular expression", _regex),
              "min_gpus": ("a whole number", _count)},
    "gpu": {"count": ("a whole number", _count), "pci_device_id": ("a whole number", _count),
            "power_limit_w": ("a positive number", _positive_number)},
    "nvlink": {"links_per_gpu": ("a whole number", _count),
               "link_speed_gbs": ("a positive number", _positive_number),
               "pair_topology": ("a string", lambda v: isinstance(v, str)),
               **{flag: ("true or false", lambda v: isinstance(v, bool))
                  for flag in ("fabric_manager", "nvlsm", "check_fabric_state", "fabric_clique_required")}},
    "nic": {"family": ("a string", lambda v: isinstance(v, str)), "count": ("a whole number", _count),
            "rate_gbps": ("a positive number", _positive_number),
            "gpu_nic_max_path": ("a string", lambda v: isinstance(v, str)),
            "policy_file": ("a file path", lambda v: isinstance(v, str) and bool(v))},
    "nccl": {**{key: ("a positive number", _positive_number)
                for key in ("all_reduce_busbw_gbs", "all_reduce_busbw_ring_gbs", "inter_node_busbw_per_nic_gbs",
                            # a site baseline's own lines and what its figure was measured on
                            # (preflight/knowledge/site_profile.py)
                            "all_reduce_busbw_warn_gbs", "all_reduce_busbw_fail_gbs")},
             "all_reduce_ranks": ("a whole number", _count), "all_reduce_bytes": ("a whole number", _count),
             "all_reduce_gpu_model": ("a string", lambda v: isinstance(v, str) and bool(v))},
}


def _schema_error(data: dict) -> str | None:
    """The first key of a profile that breaks ``SCHEMA``, as "field 'KEY' must be WHAT", or None."""
    for section, keys in SCHEMA.items():
        value = data.get(section)
        if value is None:
            continue
        if not isinstance(value, dict):
            return f"field {section!r} must be a mapping, not {value!r}"
        for key, item in value.items():
            if key not in keys:
                return f"field '{section}.{key}' is not a profile key (known: {', '.join(keys)})"
            kind, ok = keys[key]
            if item is not None and not ok(item):
                return f"field '{section}.{key}' must be {kind}, not {item!r}"
    lines = _site_lines_error(data.get("nccl") or {})
    if lines:
        return lines
    sources = data.get("sources")
    if sources is not None and (not isinstance(sources, dict)
                                or not all(isinstance(v, str) for v in sources.values())):
        return "field 'sources' must map keys to strings"
    return None


def _site_lines_error(nccl: dict) -> str | None:
    """A site baseline's warn and fail lines come together, under a figure, in that order
    (preflight/knowledge/site_profile.py): one alone would leave the check on the other rule."""
    warn, fail = nccl.get("all_reduce_busbw_warn_gbs"), nccl.get("all_reduce_busbw_fail_gbs")
    figure = nccl.get("all_reduce_busbw_gbs")
    if warn is None and fail is None:
        return None
    if warn is None or fail is None or figure is None:
        return ("fields 'nccl.all_reduce_busbw_warn_gbs' and 'nccl.all_reduce_busbw_fail_gbs' go together, "
                "with 'nccl.all_reduce_busbw_gbs'")
    if not fail < warn <= figure:
        return (f"field 'nccl.all_reduce_busbw_fail_gbs' ({fail}) must be below 'nccl.all_reduce_busbw_warn_gbs' "
                f"({warn}), and that at most 'nccl.all_reduce_busbw_gbs' ({figure})")
    return None


def load_profile_file(path: Path) -> Profile:
    data = read_yaml(path, ProfileError)
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: a profile must be a YAML mapping")
    for key in ("id", "name"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise ProfileError(f"{path}: field '{key}' must be a string")
    bad = _schema_error(data)
    if bad:
        raise ProfileError(f"{path}: {bad}")
    _check_policy_file(path, data)
    return Profile(data["id"], data["name"], data, str(path))


def policy_path(profile_file: str | Path | None, policy: str) -> Path:
    """A profile's ``nic.policy_file``: absolute, or relative to the profile's own file."""
    if Path(policy).is_absolute() or not profile_file:
        return Path(policy)
    return Path(profile_file).parent / policy


def _check_policy_file(path: Path, data: dict) -> None:
    """A profile whose NIC policy is missing or broken is refused when it is loaded, naming both
    files, rather than accepted and turned into an ERROR on every host it judges."""
    policy = (data.get("nic") or {}).get("policy_file")
    if not policy:
        return
    target = policy_path(path, policy)
    try:
        nic_matrix.load_matrix(str(target))
    except nic_matrix.NicMatrixError as exc:
        raise ProfileError(f"{path}: field 'nic.policy_file' ({policy}): {exc}") from None


def load_profiles(extra_files: list[Path] = ()) -> dict[str, Profile]:
    profiles: dict[str, Profile] = {}
    for path in sorted(PROFILE_DIR.glob("*.yaml")) + list(extra_files):
        p = load_profile_file(path)
        # A user's profile file with a built-in id replaces it: that is how a site pins
        # its own figures without forking the project.
        profiles[p.id] = p
    if GENERIC not in profiles:
        raise ProfileError(f"{PROFILE_DIR}: the generic profile is missing")
    return profiles


def detect(profiles: dict[str, Profile], gpu_names: list[str], *, source: str | None = None,
           pci_device_ids: tuple[int, ...] = (), gpu_count: int | None = None) -> Profile:
    """Choose the profile for a host from the product names of its GPUs, else from their PCI
    device ids (a profile's ``gpu.pci_device_id``). ``source`` names the command the names
    came from, for the reason shown with the verdict (none for nvidia-smi -q, the usual one).
    ``gpu_count``: how many GPUs the evidence counts, where that is known apart from the names
    (an excerpt of nvidia-smi -q names one GPU of eight): ``match.min_gpus`` is held to it."""
    where = f" in {source}" if source else ""
    if not gpu_names and pci_device_ids:
        return _detect_by_pci(profiles, pci_device_ids)
    if not gpu_names:
        return profiles[GENERIC].chosen("no GPU model known: generic checks only")
    model = max(set(gpu_names), key=gpu_names.count)
    count = gpu_count if gpu_count is not None else len(gpu_names)
    for p in profiles.values():
        pattern = p.get("match.gpu_name")
        if not pattern or not re.search(pattern, model):
            continue
        min_gpus = p.get("match.min_gpus", 1)
        if count < min_gpus:
            return profiles[GENERIC].chosen(
                f"{count} x {model}{where} is not a {p.name} (needs at least {min_gpus} GPUs): "
                "generic checks only"
            )
        counted = f", {count} GPUs on the node" if count != len(gpu_names) else ""
        return p.chosen(f"detected from GPU model {model!r}{where}{counted}")
    return profiles[GENERIC].chosen(f"no profile matches {model!r}{where}: generic checks only")


def _detect_by_pci(profiles: dict[str, Profile], ids: tuple[int, ...]) -> Profile:
    """lspci lists the GPUs by device id where no tool named them; the profile whose sourced
    ``gpu.pci_device_id`` is the commonest id is the platform."""
    device = max(set(ids), key=ids.count)
    for p in profiles.values():
        if p.get("gpu.pci_device_id") != device:
            continue
        min_gpus = p.get("match.min_gpus", 1)
        if len(ids) < min_gpus:
            return profiles[GENERIC].chosen(
                f"{len(ids)} x PCI device {device:#06x} (lspci) is not a {p.name} "
                f"(needs at least {min_gpus} GPUs): generic checks only")
        return p.chosen(f"detected from PCI device id {device:#06x} of {len(ids)} GPUs in lspci")
    return profiles[GENERIC].chosen(f"no profile has PCI device id {device:#06x} (lspci): generic checks only")
