"""Platform profiles: what a healthy node of a given platform looks like.

Profiles are YAML files under ``playbooks/profiles/`` (and any ``--profile-file``), one
platform each, every figure with its source. A host's profile is the one named by
``--profile``, otherwise the first whose ``match.gpu_name`` regex finds the host's GPU model
and whose ``match.min_gpus`` the host reaches, otherwise ``generic``, which judges only what
holds on any node, and says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


def load_profile_file(path: Path) -> Profile:
    data = read_yaml(path, ProfileError)
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: a profile must be a YAML mapping")
    for key in ("id", "name"):
        if not isinstance(data.get(key), str):
            raise ProfileError(f"{path}: field '{key}' must be a string")
    pattern = (data.get("match") or {}).get("gpu_name")
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ProfileError(f"{path}: field 'match.gpu_name' is not a valid regex ({exc})") from None
    return Profile(data["id"], data["name"], data, str(path))


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


def detect(profiles: dict[str, Profile], gpu_names: list[str]) -> Profile:
    """Choose the profile for a host from the product names of its GPUs."""
    if not gpu_names:
        return profiles[GENERIC].chosen("no GPU model known: generic checks only")
    model = max(set(gpu_names), key=gpu_names.count)
    for p in profiles.values():
        pattern = p.get("match.gpu_name")
        if not pattern or not re.search(pattern, model):
            continue
        min_gpus = p.get("match.min_gpus", 1)
        if len(gpu_names) < min_gpus:
            return profiles[GENERIC].chosen(
                f"{len(gpu_names)} x {model} is not a {p.name} (needs at least {min_gpus} GPUs): generic checks only"
            )
        return p.chosen(f"detected from GPU model {model!r}")
    return profiles[GENERIC].chosen(f"no profile matches {model!r}: generic checks only")
