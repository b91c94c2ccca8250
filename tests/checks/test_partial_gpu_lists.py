"""A partial `nvidia-smi -q` is not the node's GPU list (issue 33).

Only "Attached GPUs : N" says how many GPUs an nvidia-smi -q has to show. An output without it
(a paste of one GPU's sections), or a whole one listing fewer GPUs than it counts (`nvidia-smi -q
-i 0`), names the model and holds GPU records but counts nothing; the checks that need a count
take it from another view, and no skip reason contradicts the profile the run chose.

Real captures: `nvidia-smi -q -i 0` of an 8 x H800 node (smi-q/h800-8gpu-drv525-q-i0-one-of-8.txt),
the H100 -q cut below its report header (test_parse_nvidia_smi.headerless_h100_excerpt says
exactly what was cut), an AWS p5.48xlarge's 8 x H100 nvlink --status, and the 8-GPU H100 text
-q of tests/derived.py (the real H100 section repeated) as the healthy node of the same kind.
"""

import sys
from pathlib import Path

import pytest
from captures import CORPUS, H100_P5_NVLINK
from ctx import _CHECKS, _PROFILES, result
from derived import h100_node_text

from preflight.judge.analyze import judge_host
from preflight.model import Status

sys.path.insert(0, str(Path(__file__).parents[1] / "parse"))
from test_parse_nvidia_smi import headerless_h100_excerpt  # noqa: E402

SMI, STATUS = "nvidia-smi-q", "nvidia-smi-nvlink-status"
H800_Q_I0 = (CORPUS / "smi-q" / "h800-8gpu-drv525-q-i0-one-of-8.txt").read_text()
CHECKS = [c for c in _CHECKS.values() if c.id in ("gpu-inventory", "fabric-manager", "nvlink")]


def judged(probes, profile=None):
    """check id -> finding, and the profile, of one host judged as a run judges it (profile detected
    from the evidence unless given)."""
    records = {p: v if not isinstance(v, str) else result(p, v) for p, v in probes.items()}
    j = judge_host("node1", records, CHECKS, _PROFILES, forced_profile=profile)
    return {f.check: f for f in j.findings}, j.profile


@pytest.mark.parametrize("profile", ["hgx-h100", None])
def test_one_gpus_sections_beside_an_8_gpu_nvlink_listing_is_an_8_gpu_node(profile):
    found, chosen = judged({SMI: headerless_h100_excerpt(), STATUS: H100_P5_NVLINK}, profile)
    assert chosen.id == "hgx-h100", chosen.why
    inventory = found["gpu-inventory"]
    assert inventory.status is Status.PASS, inventory.summary
    assert inventory.summary.startswith("8 x NVIDIA H100 80GB HBM3 (counted by nvidia-smi nvlink --status "
                                        "(nvidia-smi -q output without its 'Attached GPUs' line")
    fabric = found["fabric-manager"]
    assert fabric.status is Status.SKIP and "not applicable" not in fabric.summary
    assert fabric.summary.startswith("fabric registered on the 1 GPU(s) listed (State Completed, Status Success); "
                                     "the node's other GPUs not judged: nvidia-smi -q output without")


def test_one_gpus_sections_alone_count_nothing_rather_than_fail_the_count():
    found, _ = judged({SMI: headerless_h100_excerpt()}, "hgx-h100")
    inventory = found["gpu-inventory"]
    assert inventory.status is Status.SKIP and inventory.symptoms == (), inventory.summary
    assert "no evidence counts the GPUs" in inventory.summary and "an excerpt" in inventory.summary


def test_a_real_q_i0_is_a_selection_not_a_dead_tool():
    found, _ = judged({SMI: H800_Q_I0}, "hgx-h100")
    inventory = found["gpu-inventory"]
    assert inventory.status is Status.SKIP and "probe-truncated" not in inventory.symptoms, inventory.summary
    assert "lists 1 of the 8 GPUs its 'Attached GPUs' line counts" in inventory.summary
    assert "died" not in inventory.summary
    fabric = found["fabric-manager"]
    assert fabric.status is Status.SKIP and "not applicable" not in fabric.summary, fabric.summary


def test_the_same_text_from_the_probes_own_command_broke_off():
    # `nvidia-smi -q` (no -i) asked for all 8: one section and a clean end means it stopped early.
    found, _ = judged({SMI: result(SMI, H800_Q_I0, command=("nvidia-smi", "-q"))}, "hgx-h100")
    inventory = found["gpu-inventory"]
    assert inventory.status is Status.ERROR and inventory.symptoms == ("probe-truncated",), inventory.summary
    assert "7 GPU(s) never shown" in inventory.summary


def test_a_healthy_whole_listing_of_the_same_kind_is_not_flagged():
    found, chosen = judged({SMI: result(SMI, h100_node_text(8), command=("nvidia-smi", "-q")), STATUS: H100_P5_NVLINK})
    assert chosen.id == "hgx-h100"
    assert found["gpu-inventory"].status is Status.PASS
    assert found["gpu-inventory"].summary.startswith("8 x NVIDIA H100 80GB HBM3 (driver 590.48.01")
    assert "not_counted" not in found["gpu-inventory"].data
    assert found["fabric-manager"].status is Status.PASS


def test_a_selection_is_judged_on_the_platform_its_attached_gpus_line_names(tmp_path):
    # A site's own profile for its 8 x H800 boards (no H800 profile ships): `-q -i 0` lists one GPU,
    # but "Attached GPUs : 8" says which platform this is, so min_gpus 2 is met and the board's
    # profile is chosen; the count itself stays unjudged.
    from preflight.knowledge.profiles import load_profiles

    site = tmp_path / "site-h800.yaml"
    site.write_text("id: site-h800\nname: site 8 x H800 board\nmatch:\n  gpu_name: 'H800'\n  min_gpus: 2\n"
                    "gpu:\n  count: 8\nnvlink:\n  fabric_manager: true\n")
    records = {SMI: result(SMI, H800_Q_I0)}
    j = judge_host("node1", records, CHECKS, load_profiles([site]))
    assert j.profile.id == "site-h800" and j.profile.why == "detected from GPU model 'NVIDIA H800', 8 GPUs on the node"
    found = {f.check: f for f in j.findings}
    assert found["gpu-inventory"].status is Status.SKIP
    assert found["fabric-manager"].summary.startswith("fabric registered on the 1 GPU(s) listed")
