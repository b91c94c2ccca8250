"""checks/gpu_memory.py and checks/gpu_reset.py on real nvidia-smi captures and faulty variants
of the real H200 node (tests/derived.py: one value of one GPU changed per scenario)."""

from pathlib import Path

import pytest
from ctx import make_host, result, run_check
from derived import h200_node_xml, with_gpu_values

from preflight.diagnose.engine import diagnose, load_knowledge
from preflight.model import Status

SMI_Q = Path(__file__).parents[1] / "fixtures" / "corpus" / "smi-q"
A100_PENDING = (SMI_Q / "a100-sxm4-80gb-drv510-remapped-rows-pending-excerpt.txt").read_text()
A100_XML = (SMI_Q / "a100-sxm4-80gb-drv535-q-x-dtd-v12.txt").read_text()
A10G_XML = (SMI_Q / "a10g-drv515-q-x-dtd-v11-throttle-names.txt").read_text()
H100_TEXT = (SMI_Q / "h100-80gb-hbm3-drv590-under-load.txt").read_text()
RTX4000_XML = (SMI_Q / "rtx4000-sff-ada-drv595-q-x-dtd-v13-tabs.txt").read_text()
CLOCKS_EXCERPT = (SMI_Q / "clocks-event-reasons-sw-power-cap-active-excerpt.txt").read_text()


def memory(probes, profile="generic"):
    return run_check("gpu-memory", make_host(probes, profile))


def node(gpu=None, **values):
    """The 8-GPU H200 node, with `values` set on GPU `gpu`."""
    xml = h200_node_xml(8)
    return {"nvidia-smi-q-x": with_gpu_values(xml, gpu, values) if values else xml}


# ---- gpu-memory ---------------------------------------------------------------------------

def test_healthy_h200_node_passes():
    [f] = memory(node(), "hgx-h200")
    assert f.status is Status.PASS
    assert f.summary == "8 GPUs: no uncorrectable ECC error since the driver loaded, no row remap pending or failed"


@pytest.mark.parametrize("probe, text", [("nvidia-smi-q", H100_TEXT), ("nvidia-smi-q-x", A100_XML),
                                         ("nvidia-smi-q-x", A10G_XML), ("nvidia-smi-q-x", RTX4000_XML)])
def test_real_healthy_single_gpus_pass(probe, text):
    [f] = memory({probe: text})
    assert f.status is Status.PASS and f.summary.startswith("1 GPU: no uncorrectable ECC error")


def test_real_a100_pending_remap_fails_with_a_reset_action():
    # DCGM's diagnostic fails a GPU whose row remap is pending (docs/sources.md §5.3).
    [f] = memory({"nvidia-smi-q": A100_PENDING})
    assert f.status is Status.FAIL
    assert f.symptoms == ("gpu-row-remap",)
    assert "row remapping pending on 1 of 1 GPUs: GPU0 00000000:10:1C.0 (Remapped Rows Pending: Yes" in f.summary
    # The 177 DRAM correctable errors of that capture are shown, not judged.
    assert "177 correctable since boot" in f.summary and "1 rows remapped" in f.summary
    assert "nvidia-smi -r -i 0" in f.action and "Pending must read No" in f.action
    assert f.evidence[0].probe == "nvidia-smi-q"


def test_pending_remap_diagnoses_row_remap_with_the_checks_action():
    host = make_host({"nvidia-smi-q": A100_PENDING})
    [d] = diagnose(run_check("gpu-memory", host), load_knowledge())
    assert d.cause == "gpu-row-remap" and "reset the GPU (nvidia-smi -r -i 0)" in d.action


def test_volatile_uncorrectable_fails_on_the_gpu_that_has_it():
    [f] = memory(node(2, **{"volatile/dram_uncorrectable": "2"}))
    assert f.status is Status.FAIL
    assert f.symptoms == ("gpu-ecc-uncorrectable",)
    assert f.summary.startswith("uncorrectable ECC errors since the driver loaded on 1 of 8 GPUs: "
                                "GPU2 00000000:3A:00.0 (volatile uncorrectable 2: DRAM 2, SRAM 0)")
    assert f.data["gpus"] == ["00000000:3A:00.0"]


def test_lifetime_uncorrectable_alone_is_history_not_a_fault():
    [f] = memory(node(5, **{"aggregate/dram_uncorrectable": "3"}))
    assert f.status is Status.PASS
    assert "GPU5 00000000:AB:00.0: 3 uncorrectable in its lifetime" in f.summary


@pytest.mark.parametrize("values, what, status, needle", [
    ({"remapped_row_failure": "Yes"}, "row remapping failed", Status.FAIL, "RMA the GPU"),
    ({"row_remapper_histogram_none": "1 bank(s)"}, "memory banks without a spare row left", Status.FAIL,
     "RMA the GPU"),
    ({"sram_threshold_exceeded": "Yes"}, "SRAM uncorrectable-error threshold exceeded", Status.FAIL,
     "field diagnostics"),
    ({"remapped_row_pending": "Yes"}, "row remapping pending", Status.FAIL, "nvidia-smi -r -i 4"),
    ({"pending_retirement": "Yes"}, "retired pages pending", Status.FAIL, "nvidia-smi -r -i 4"),
])
def test_each_memory_fault(values, what, status, needle):
    [f] = memory(node(4, **values))
    assert f.status is status
    assert f.summary.startswith(f"{what} on 1 of 8 GPUs: GPU4 00000000:9A:00.0")
    assert needle in f.action


def test_several_faults_give_one_outcome_each_most_severe_first():
    xml = with_gpu_values(h200_node_xml(8), 1, {"remapped_row_pending": "Yes"})
    xml = with_gpu_values(xml, 6, {"remapped_row_pending": "Yes", "volatile/dram_uncorrectable": "1"})
    fs = memory({"nvidia-smi-q-x": xml})
    assert [(f.status, f.symptoms) for f in fs] == [(Status.FAIL, ("gpu-ecc-uncorrectable",)),
                                                     (Status.FAIL, ("gpu-row-remap",))]
    assert "on 2 of 8 GPUs: GPU1 00000000:2A:00.0" in fs[1].summary and "GPU6 00000000:BA:00.0" in fs[1].summary
    assert fs[1].action.endswith("(N = 1, 6, one call each)")


def test_excerpt_without_memory_sections_skips():
    [f] = memory({"nvidia-smi-q": CLOCKS_EXCERPT})
    assert f.status is Status.SKIP and f.summary == "no GPU reports ECC, row remapping or page retirement"


def test_missing_nvidia_smi_is_an_error_not_a_pass():
    missing = result("nvidia-smi-q-x", None, exit_code=127, command=("nvidia-smi", "-q", "-x"),
                     stderr="sh: 1: nvidia-smi: not found")
    [f] = memory({"nvidia-smi-q-x": missing})
    assert f.status is Status.ERROR and f.symptoms == ("tool-missing",)
    assert "nvidia-smi is not installed" in f.summary


# ---- gpu-reset ----------------------------------------------------------------------------

def reset(probes):
    return run_check("gpu-reset", make_host(probes))


def test_reset_healthy_node_and_real_captures_pass():
    [f] = reset(node())
    assert f.status is Status.PASS and f.summary == "8 GPUs: no reset, drain or reboot asked for (Recovery Action None)"
    [f] = reset({"nvidia-smi-q-x": A100_XML})
    assert f.status is Status.PASS and f.summary.endswith("(Reset Required No)")
    [f] = reset({"nvidia-smi-q": H100_TEXT})
    assert f.status is Status.PASS


def test_reset_required_and_drain_recommended_both_fail():
    # The real 535 A100 capture with one Yes/No value of its GPU Reset Status flipped.
    [f] = reset({"nvidia-smi-q-x": A100_XML.replace("<reset_required>No<", "<reset_required>Yes<")})
    assert (f.status, f.symptoms) == (Status.FAIL, ("gpu-recovery-action",))
    assert f.summary == "the driver asks for recovery on 1 of 1 GPUs: GPU0 00000000:01:00.0: Reset Required: Yes"
    assert "nvidia-smi -r -i 0" in f.action
    [f] = reset({"nvidia-smi-q-x": A100_XML.replace("<drain_and_reset_recommended>No<",
                                                    "<drain_and_reset_recommended>Yes<")})
    # DCGM: "Do not schedule new work on this GPU" (DCGM_FR_GPU_RECOVERY_DRAIN_RESET).
    assert f.status is Status.FAIL and "Drain and Reset Recommended: Yes" in f.summary
    assert "drain the GPU's jobs, then stop the GPU processes" in f.action


@pytest.mark.parametrize("action, status, step", [
    ("Reset", Status.FAIL, "reset the GPU (nvidia-smi -r -i 3)"),
    ("Reboot", Status.FAIL, "reboot it"),
    ("Drain and Reset", Status.FAIL, "drain the GPU's jobs, then stop the GPU processes"),
    ("Drain P2P", Status.WARN, "stop peer-to-peer traffic"),
    ("Something New", Status.WARN, "look the action up"),
])
def test_recovery_action_decides(action, status, step):
    [f] = reset(node(3, gpu_recovery_action=action))
    assert f.status is status
    assert f"GPU3 00000000:5D:00.0: GPU Recovery Action: {action}" in f.summary
    assert step in f.action


def test_reset_status_not_reported_by_old_driver_skips():
    [f] = reset({"nvidia-smi-q-x": A10G_XML})  # driver 515: no GPU Reset Status section yet
    assert f.status is Status.SKIP


def test_reset_without_evidence():
    [f] = reset({})
    assert f.status is Status.SKIP and f.summary == "not judged: nvidia-smi-q-x not collected in this bundle"
    broken = result("nvidia-smi-q-x", b"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
                    b"driver. Make sure that the latest NVIDIA driver is installed and running.\n", exit_code=9,
                    command=("nvidia-smi", "-q", "-x"))
    [f] = reset({"nvidia-smi-q-x": broken})
    assert (f.status, f.symptoms) == (Status.ERROR, ("probe-failed",))
    assert "couldn't communicate with the NVIDIA driver" in f.evidence[0].excerpt


def test_recovery_action_caused_by_a_pending_remap_diagnoses_the_remap_only():
    host = make_host(node(4, remapped_row_pending="Yes", gpu_recovery_action="Reset"), "hgx-h200")
    findings = run_check("gpu-memory", host) + run_check("gpu-reset", host)
    assert [f.status for f in findings] == [Status.FAIL, Status.FAIL]
    [d] = diagnose(findings, load_knowledge())
    assert (d.cause, d.symptoms) == ("gpu-row-remap", ("gpu-recovery-action", "gpu-row-remap"))
