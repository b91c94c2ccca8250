"""parse_nvlink_status / parse_nvlink_errors on real captures (tests/fixtures/corpus)."""

from pathlib import Path

import pytest

from preflight.parse import ParseError
from preflight.parse.nvlink import parse_nvlink_errors, parse_nvlink_status

CORPUS = Path(__file__).parents[1] / "fixtures" / "corpus"


def load(name: str) -> str:
    return (CORPUS / name).read_text()


@pytest.mark.parametrize(
    "name, model",
    [
        ("nvlink/h100-1gpu-vm-drv590-nvlink-s.txt", "NVIDIA H100 80GB HBM3"),
        ("nvlink/h200-1gpu-drv590-nvlink-s.txt", "NVIDIA H200"),
    ],
)
def test_hopper_18_links(name, model):
    status = parse_nvlink_status(load(name))
    (gpu,) = status.gpus
    assert (gpu.index, gpu.name) == (0, model)
    assert gpu.uuid == "GPU-00000000-0000-0000-0000-000000000000"
    assert [link.number for link in gpu.links] == list(range(18))
    assert {link.speed_gbps for link in gpu.links} == {26.562}
    assert (gpu.active_count, gpu.inactive_count) == (18, 0)
    assert (gpu.supported, gpu.reason) == (True, None)
    assert status.notes == ()


def test_v100_8gpu_6_links():
    status = parse_nvlink_status(load("nvlink/v100-sxm2-8gpu-nvlink-s-6-links.txt"))
    assert [gpu.index for gpu in status.gpus] == list(range(8))
    assert status.gpus[7].uuid == "GPU-a8544b18-6cba-63b6-a3ff-968559aca7f9"
    assert all(gpu.active_count == 6 and gpu.inactive_count == 0 for gpu in status.gpus)
    assert {link.speed_gbps for gpu in status.gpus for link in gpu.links} == {25.781}


def test_inactive_link():
    # Synthetic: the real H100 capture with link 3 turned into "<inactive>", the form
    # reported in Azure/azhpc-diagnostics#73.
    text = load("nvlink/h100-1gpu-vm-drv590-nvlink-s.txt").replace(
        "Link 3: 26.562 GB/s", "Link 3: <inactive>"
    )
    (gpu,) = parse_nvlink_status(text).gpus
    assert (gpu.active_count, gpu.inactive_count) == (17, 1)
    assert gpu.links[3].speed_gbps is None and not gpu.links[3].active
    assert gpu.supported is True


def test_mig_mode_is_unknown_not_unsupported():
    status = parse_nvlink_status(load("nvlink/h100-mig-mode-drv590-nvlink-s-unsupported.txt"))
    (gpu,) = status.gpus
    assert gpu.links == ()
    assert (gpu.supported, gpu.reason) == (None, "mig-mode")
    assert gpu.message == "Nvlink queries are not supported for Devices in MIG mode"


def test_device_without_nvlink():
    (gpu,) = parse_nvlink_status(load("nvlink/l40s-drv595-nvlink-s-not-supported.txt")).gpus
    assert (gpu.name, gpu.supported, gpu.reason) == ("NVIDIA L40S", False, "no-nvlink")
    assert gpu.message == "Device does not have or support Nvlink"


def test_all_links_inactive_message():
    # Synthetic: the real MIG capture with its message line replaced by the one NVML prints
    # when every link is down (quoted from a B200 node in leptonai/gpud#1085).
    text = load("nvlink/h100-mig-mode-drv590-nvlink-s-unsupported.txt").replace(
        "Nvlink queries are not supported for Devices in MIG mode",
        "NVML: Unable to retrieve NVLink information as all links are inActive",
    )
    (gpu,) = parse_nvlink_status(text).gpus
    assert (gpu.supported, gpu.reason, gpu.active_count) == (True, "all-links-inactive", 0)


def test_empty_output_from_1gpu_h200_vm_is_a_result():
    assert load("h200-vm/nvlink-status.txt") == ""
    status = parse_nvlink_status(load("h200-vm/nvlink-status.txt"))
    assert status.gpus == ()
    assert "empty output" in status.notes[0]


@pytest.mark.parametrize(
    "name, what",
    [
        ("nvlink/dcgmi-nvlink-link-status-all-down-2gpu.txt", "dcgmi"),
        ("nvlink/v100-sxm2-8gpu-nvlink-gt-d-throughput-kib.txt", "-gt"),
    ],
)
@pytest.mark.parametrize("parse", [parse_nvlink_status, parse_nvlink_errors])
def test_other_nvlink_views_are_rejected(parse, name, what):
    with pytest.raises(ParseError, match=what):
        parse(load(name))


def test_status_and_errors_do_not_read_each_other():
    with pytest.raises(ParseError, match="--status"):
        parse_nvlink_status(load("nvlink/h100-nvlink-e-error-counters-zero-excerpt.txt"))
    with pytest.raises(ParseError, match="-e"):
        parse_nvlink_errors(load("nvlink/h100-1gpu-vm-drv590-nvlink-s.txt"))


def test_not_nvidia_smi_raises():
    with pytest.raises(ParseError):
        parse_nvlink_status("bash: nvidia-smi: command not found\n")


def test_error_counters_excerpt():
    errors = parse_nvlink_errors(load("nvlink/h100-nvlink-e-error-counters-zero-excerpt.txt"))
    (gpu,) = errors.gpus
    assert gpu.uuid == "GPU-abcdefab-cdef-abdc-abcd-abababababab"
    assert [link.number for link in gpu.links] == [0, 1, 17]
    assert gpu.links[2].counters == (("replay", 0), ("recovery", 0), ("crc", 0))
    assert gpu.links[0].counter("crc") == 0 and gpu.links[0].counter("crc_flit") is None
    assert errors.nonzero() == ()
    notes = " | ".join(errors.notes)
    assert "[...]" in notes  # the author's elision is reported, not silently dropped
    assert "1->17" in notes


def test_nonzero_error_counter():
    # Synthetic: the real excerpt with link 17's replay counter changed from 0 to 5.
    text = load("nvlink/h100-nvlink-e-error-counters-zero-excerpt.txt").replace(
        "Link 17: Replay Errors: 0", "Link 17: Replay Errors: 5"
    )
    errors = parse_nvlink_errors(text)
    assert errors.nonzero() == ((0, 17, "replay", 5),)
    assert errors.gpus[0].links[2].total == 5


@pytest.mark.parametrize(
    "name, supported, reason",
    [
        ("nvlink/l40s-drv595-nvlink-s-not-supported.txt", False, "no-nvlink"),
        ("nvlink/h100-mig-mode-drv590-nvlink-s-unsupported.txt", None, "mig-mode"),
    ],
)
def test_errors_carry_the_same_unsupported_states(name, supported, reason):
    (gpu,) = parse_nvlink_errors(load(name)).gpus
    assert (gpu.links, gpu.supported, gpu.reason) == ((), supported, reason)


def test_errors_empty_output():
    assert parse_nvlink_errors(load("h200-vm/nvlink-status.txt")).gpus == ()


def test_b300_names_and_counts_every_gpu_it_lists():
    # Dell XE9780 (an 8-GPU HGX B300 server) that shows 7 GPUs: the names say the platform.
    status = parse_nvlink_status((CORPUS / "nvlink" / "b300-sxm6-ac-xe9780-7-of-8-gpus-drv610-nvlink-s.txt").read_text())
    assert [g.index for g in status.gpus] == list(range(7))
    assert {g.name for g in status.gpus} == {"NVIDIA B300 SXM6 AC"}
    assert all(g.active_count == 18 for g in status.gpus)
    assert not status.excerpt


def test_a_dotted_elision_is_noted_and_marks_an_excerpt():
    # Azure/azhpc-diagnostics#73 pasted "...." before GPU 3: not an error, not the whole node.
    status = parse_nvlink_status((CORPUS / "nvlink" / "v100-sxm2-gpu3-2-of-6-links-inactive-excerpt.txt").read_text())
    [gpu] = status.gpus
    assert (gpu.index, gpu.active_count, gpu.inactive_count) == (3, 4, 2)
    assert status.excerpt
