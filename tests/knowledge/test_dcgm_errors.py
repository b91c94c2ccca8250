"""The DCGM error table (playbooks/dcgm_errors.yaml): NVIDIA's facts kept, codes found in text."""

from preflight.diagnose.engine import load_knowledge
from preflight.knowledge.dcgm_errors import load_dcgm_errors


def test_codes_carry_nvidias_message_next_step_and_severity():
    table = load_dcgm_errors()
    remap = table.get(85)
    assert (remap.name, remap.severity, remap.category, remap.cause) == (
        "DCGM_FR_PENDING_ROW_REMAP", "reset", "hardware_memory", "gpu-row-remap")
    assert remap.message == "GPU %u had memory errors and row remappings are pending"
    assert remap.severity_meaning == "Drain and reset GPU"
    assert table.get(29).next.startswith("Enable persistence mode")
    assert len(table.errors) == 133 and table.version == "4.6.0"


def test_every_cause_is_in_the_knowledge_base():
    causes = load_knowledge().causes
    assert {e.cause for e in load_dcgm_errors().errors.values()} <= set(causes)


def test_identify_text_table_messages():
    table = load_dcgm_errors()
    cases = {
        "GPU 0 Thermal violations totaling 13.3 seconds started at 9.7 seconds into the test for GPU 0 Verify": 41,
        "GPU 3 has uncorrectable memory errors and row remappings are pending": 85,  # older wording
        "GPU 0GPU 0's NvLink link 2 is currently down Run a field diagnostic on the GPU.": 14,
        "There was an internal error during the test: 'A child process (152) exited with non-zero status 1'": 44,
    }
    for text, code in cases.items():
        assert table.identify(text).code == code, text
    assert table.identify("Allocated 112427837082 bytes (87.5%)") is None
