"""checks/fabric.py (fabric-manager) on real `nvidia-smi -q` captures.

The 8-GPU node is the real H100 `nvidia-smi -q` (driver 590, Fabric Completed/Success)
repeated per GPU (tests/derived.py h100_node_text); each fault sets Fabric lines to a value
seen in the field, named in the test.
"""

from pathlib import Path

from ctx import make_host, run_check
from derived import H100_TEXT, h100_node_text, h200_node_xml, node_nvlink_status, with_fabric

from preflight.diagnose.engine import diagnose, load_knowledge
from preflight.model import Status

CORPUS = Path(__file__).parents[1] / "fixtures" / "corpus"
SMI, SMI_X, STATUS = "nvidia-smi-q", "nvidia-smi-q-x", "nvidia-smi-nvlink-status"
# CliqueId and ClusterUUID of a healthy GB200 tray (leptonai/gpud#1106).
CLIQUE, CLUSTER = "4026", "9c6f5af3-53bf-49b5-a436-b66766c413c3"


def fabric(probes, profile="hgx-h100"):
    return run_check("fabric-manager", make_host(probes, profile))


def test_hgx_h100_registered_fabric_passes():
    [f] = fabric({SMI: h100_node_text()})
    assert f.status is Status.PASS
    assert f.summary == "fabric registered on 8 GPUs (State Completed, Status Success)"


def test_nvl72_tray_in_a_clique_passes_and_names_it():
    [f] = fabric({SMI: with_fabric(h100_node_text(4), CliqueId=CLIQUE, ClusterUUID=CLUSTER)},
                 "gb300-nvl72-tray")
    assert f.status is Status.PASS
    assert f.summary == (f"fabric registered on 4 GPUs (State Completed, Status Success, "
                         f"CliqueId {CLIQUE}, ClusterUUID {CLUSTER})")


def test_fabric_manager_dead_leaves_state_in_progress_on_b300_with_links_up():
    # A dead FM leaves fabric.state at In Progress (NVIDIA/NVSentinel#889); on B300 the links
    # still show active (docs/sources.md §2), which the summary must say so nobody trusts them.
    smi = with_fabric(h100_node_text(), State="In Progress")
    [f] = fabric({SMI: smi, STATUS: node_nvlink_status()}, "hgx-b300")
    assert f.status is Status.FAIL
    assert f.symptoms == ("fabric-manager-down",)
    assert f.summary.startswith("fabric state In Progress on 8 of 8 GPUs (GPU0, GPU1, GPU2, GPU3, "
                                "GPU4, GPU5, GPU6, GPU7)")
    assert "although nvidia-smi nvlink --status shows all 144 links active" in f.summary
    assert f.evidence[0].probe == SMI
    assert f.evidence[0].excerpt.splitlines()[0] == "State                                          : In Progress"
    action = f.action
    assert "systemctl status nvidia-fabricmanager" in action
    assert "driver version (590.48.01)" in action
    assert "nvlsm" in action and "ib_umad" in action  # B300: fourth-generation NVSwitch


def test_not_started_in_xml_fails_with_the_xml_line():
    # The H200 XML with the fabric an HGX board reports (Completed/Success, as in the H100
    # capture), then GPU2 "Not Started": FM never began registering it (NVSentinel#883).
    registered = with_fabric(h200_node_xml(8), State="Completed", Status="Success", CliqueId="0",
                             ClusterUUID="00000000-0000-0000-0000-000000000000")
    [f] = fabric({SMI_X: registered}, "hgx-h200")
    assert f.status is Status.PASS
    [f] = fabric({SMI_X: with_fabric(registered, gpus=[2], State="Not Started")}, "hgx-h200")
    assert f.status is Status.FAIL
    assert f.summary == "fabric state Not Started on 1 of 8 GPUs (GPU2)"
    assert f.evidence[0].probe == SMI_X
    assert f.evidence[0].excerpt == "<state>Not Started</state>"
    assert "driver version (580.159.04)" in f.action


def test_registration_failure_status_on_one_gpu():
    # "Insufficient Resources": the status seen on a failing node (Azure/azhpc-images#506).
    smi = with_fabric(h100_node_text(), gpus=[4], Status="Insufficient Resources")
    [f] = fabric({SMI: smi})
    assert f.status is Status.FAIL
    assert f.summary == "fabric status Insufficient Resources on 1 of 8 GPUs (GPU4)"
    assert f.evidence[0].excerpt == "Status                                         : Insufficient Resources"
    assert "nvlsm" not in f.action  # H100: third-generation NVSwitch, no NVLSM
    [d] = diagnose([f], load_knowledge())
    assert (d.cause, d.action) == ("fabric-manager-down", f.action)


def test_tray_outside_any_clique_fails():
    # CliqueId 0 and a zero ClusterUUID: healthy on HGX, a tray outside its NVLink domain here.
    [f] = fabric({SMI: h100_node_text(4)}, "gb300-nvl72-tray")
    assert f.status is Status.FAIL
    assert f.summary == ("CliqueId 0, ClusterUUID 00000000-0000-0000-0000-000000000000 "
                         "(not in an NVLink domain) on 4 of 4 GPUs (GPU0, GPU1, GPU2, GPU3)")
    assert "Fabric Manager does not run on a compute tray" in f.action


def test_unhealthy_fabric_health_is_its_own_finding():
    # State Completed but Health Summary Unhealthy (kubernetes-sigs/dra-driver-nvidia-gpu#626).
    [f] = fabric({SMI: with_fabric(h100_node_text(), gpus=[1], Summary="Unhealthy")})
    assert f.status is Status.FAIL
    assert f.symptoms == ("nvlink-fabric-degraded",)
    assert f.summary == "fabric health Unhealthy on 1 of 8 GPUs (GPU1)"
    assert f.evidence[0].excerpt == "Summary                                    : Unhealthy"
    [d] = diagnose([f], load_knowledge())
    assert d.cause == "nvlink-fabric-degraded"


def test_one_gpu_without_fabric_state_among_registered_ones_fails():
    [f] = fabric({SMI: with_fabric(h100_node_text(), gpus=[6], State="N/A")})
    assert f.status is Status.FAIL
    assert f.summary == "no fabric state while other GPUs report one on 1 of 8 GPUs (GPU6)"


def test_no_fabric_state_on_an_hgx_board_cannot_be_judged():
    # The real H200 VM XML repeated to 8 GPUs: every fabric field is N/A.
    [f] = fabric({SMI_X: h200_node_xml(8, fabric=False)}, "hgx-h200")
    assert f.status is Status.ERROR
    assert f.summary.startswith("NVML reports no fabric state (N/A) on any of the 8 GPUs: cannot tell")
    assert f.evidence[0].excerpt.splitlines()[0] == "<state>N/A</state>"


def test_no_fabric_state_on_an_nvl72_tray_fails():
    # leptonai/gpud#1108: a GB200 tray whose fabric was unhealthy showed State Not Supported.
    [f] = fabric({SMI_X: h200_node_xml(4, fabric=False)}, "gb300-nvl72-tray")
    assert f.status is Status.FAIL
    assert f.symptoms == ("fabric-manager-down",)
    assert "did not join the NVLink fabric" in f.summary


def test_one_gpu_vm_is_skipped():
    # The real 1-GPU H100 VM reports Completed, the real H200 VM N/A: a lone GPU is never judged.
    # Judged as an 8-GPU HGX board (the profile the run was given), the skip says so rather than
    # calling the fabric "not applicable" on a platform that has one (issue 33).
    for probes in ({SMI: H100_TEXT.read_text()}, {SMI_X: (CORPUS / "h200-vm/smi-q.xml").read_text()},
                   {SMI: (CORPUS / "h200-vm/smi-q.txt").read_text()}):
        [f] = fabric(probes, "hgx-h200")
        assert f.status is Status.SKIP
        assert f.summary == ("1 GPU listed where a NVIDIA HGX H200 8-GPU has 8 (gpu-inventory judges the count): "
                             "NVSwitch fabric not judged (NVML reports no fabric for a lone GPU)")


def test_generic_profile_passes_over_a_registered_fabric():
    [f] = fabric({SMI: h100_node_text()}, "generic")
    assert (f.status, f.summary) == (Status.SKIP, "no NVSwitch fabric expected on this platform, and no "
                                                  "failed registration reported: test")


def test_generic_profile_without_smi_is_skipped():
    [f] = fabric({STATUS: node_nvlink_status()}, "generic")
    assert (f.status, f.summary) == (Status.SKIP, "no NVSwitch fabric expected on this platform: test")


def test_generic_profile_fails_a_completed_registration_with_a_failed_status():
    # The driver's own verdict needs no platform figure: "Insufficient Resources" on GPU4
    # (Azure/azhpc-images#506), "Unknown Error" on GPU2 (aws/eks-node-monitoring-agent#141).
    smi = with_fabric(with_fabric(h100_node_text(), gpus=[4], Status="Insufficient Resources"),
                      gpus=[2], Status="Unknown Error")
    [f] = fabric({SMI: smi}, "generic")
    assert f.status is Status.FAIL and f.symptoms == ("fabric-manager-down",)
    assert f.summary.startswith("fabric status Unknown Error on 1 of 8 GPUs (GPU2); "
                                "fabric status Insufficient Resources on 1 of 8 GPUs (GPU4) (reported by the driver")
    assert set(f.evidence[0].excerpt.splitlines()) == {
        "Status                                         : Insufficient Resources",
        "Status                                         : Unknown Error"}
    [d] = diagnose([f], load_knowledge())
    assert d.cause == "fabric-manager-down" and "nvidia-imex" in d.action


def test_generic_profile_fails_an_unhealthy_fabric_summary():
    [f] = fabric({SMI: with_fabric(h100_node_text(), gpus=[1], Summary="Unhealthy")}, "generic")
    assert f.status is Status.FAIL and f.symptoms == ("nvlink-fabric-degraded",)
    assert f.summary.startswith("fabric health Unhealthy on 1 of 8 GPUs (GPU1)")


def test_generic_profile_leaves_a_state_in_progress_alone():
    # In Progress needs the platform to mean anything: a dead FM on HGX (NVSentinel#889) and a
    # platform that has no fabric to register cannot be told apart without a profile.
    [f] = fabric({SMI: with_fabric(h100_node_text(), State="In Progress")}, "generic")
    assert f.status is Status.SKIP


def test_smi_not_collected_is_not_judged():
    [f] = fabric({STATUS: node_nvlink_status()})
    assert f.status is Status.SKIP
    assert f.summary == "not judged: nvidia-smi-q-x not collected in this bundle"
