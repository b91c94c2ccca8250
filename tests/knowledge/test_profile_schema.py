"""Profile files are type-checked (knowledge/profiles.py SCHEMA): a wrong type or a misspelled
key is refused naming the file and the key, and `run`/`analyze` exit 2 before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from preflight.app.cli import main
from preflight.knowledge.profiles import PROFILE_DIR, ProfileError, load_profile_file, load_profiles

H200 = PROFILE_DIR / "hgx-h200.yaml"
FLEET = Path(__file__).resolve().parents[2] / "examples" / "h200-fleet"


def _site(tmp_path, **sections) -> Path:
    data = yaml.safe_load(H200.read_text())
    for dotted, value in sections.items():
        section, _, key = dotted.partition("__")
        if key:
            data.setdefault(section, {})[key] = value
        else:
            data[section] = value
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_every_shipped_profile_passes_the_schema():
    assert set(load_profiles()) >= {"generic", "hgx-h200", "hgx-b300"}


@pytest.mark.parametrize(("change", "said"), [
    ({"gpu__count": "8"}, "field 'gpu.count' must be a whole number, not '8'"),
    ({"gpu__count": True}, "field 'gpu.count' must be a whole number, not True"),
    ({"match__gpu_name": 200}, "field 'match.gpu_name' must be a regular expression, not 200"),
    ({"match__gpu_name": "H200("}, "field 'match.gpu_name' must be a regular expression"),
    ({"nccl__all_reduce_busbw_gbs": "475 GB/s"}, "field 'nccl.all_reduce_busbw_gbs' must be a positive number"),
    ({"nccl__all_reduce_busbw_gbs": float("nan")}, "field 'nccl.all_reduce_busbw_gbs' must be a positive number"),
    ({"nvlink__fabric_manager": "yes"}, "field 'nvlink.fabric_manager' must be true or false"),
    ({"nvlink__link_per_gpu": 18}, "field 'nvlink.link_per_gpu' is not a profile key"),
    ({"nic": ["ConnectX-7"]}, "field 'nic' must be a mapping"),
    ({"sources": ["HGX"]}, "field 'sources' must map keys to strings"),
])
def test_a_wrong_type_or_key_is_refused_naming_file_and_key(tmp_path, change, said):
    path = _site(tmp_path, **change)
    with pytest.raises(ProfileError) as exc:
        load_profile_file(path)
    assert str(exc.value).startswith(f"{path}: {said}")


def test_analyze_refuses_it_with_exit_2_and_writes_nothing(tmp_path, capsys):
    path = _site(tmp_path, gpu__count="eight")
    assert main(["analyze", str(FLEET), "--profile-file", str(path), "--out", str(tmp_path / "out"), "-q"]) == 2
    assert f"{path}: field 'gpu.count' must be a whole number" in capsys.readouterr().err.replace("\n", "")
    assert not (tmp_path / "out").exists()


def test_a_sites_own_section_is_kept(tmp_path):
    profile = load_profile_file(_site(tmp_path, site={"rack": "A7"}))
    assert profile.get("site.rack") == "A7"


# Issue 26: a profile naming a NIC policy that is missing or broken was accepted at load and
# every host it judged got an ERROR from nic-firmware instead; now the profile is refused.
@pytest.mark.parametrize(("policy", "said"), [
    (None, "policy.yaml: cannot read (No such file or directory)"),
    ("pins: [\n", "policy.yaml:2: invalid YAML"),
    ('pins:\n  - {family: ConnectX-99, version: "1.2.3"}\n', "unknown adapter family 'ConnectX-99'"),
])
def test_a_profile_whose_policy_file_is_missing_or_broken_is_refused_naming_both(tmp_path, capsys, policy, said):
    site = _site(tmp_path, nic__policy_file="policy.yaml")
    if policy is not None:
        (tmp_path / "policy.yaml").write_text(policy)
    with pytest.raises(ProfileError) as exc:
        load_profile_file(site)
    assert str(exc.value).startswith(f"{site}: field 'nic.policy_file' (policy.yaml): {tmp_path / 'policy.yaml'}")
    assert said in str(exc.value)
    out = tmp_path / "out"
    assert main(["analyze", str(FLEET), "--profile-file", str(site), "--out", str(out), "-q"]) == 2
    assert f"{site}: field 'nic.policy_file'" in capsys.readouterr().err and not out.exists()


def test_a_profile_whose_policy_file_reads_is_loaded(tmp_path):
    site = _site(tmp_path, nic__policy_file="policy.yaml")
    (tmp_path / "policy.yaml").write_text('pins:\n  - {family: ConnectX-7, version: "28.46.1006"}\n')
    assert load_profile_file(site).get("nic.policy_file") == "policy.yaml"
