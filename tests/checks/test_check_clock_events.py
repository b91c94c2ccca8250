"""clock-events (checks/clock_events.py) on real `nvidia-smi -q` text: a V100 whose HW power brake
is asserted at 382 MHz (tests/fixtures/corpus/smi-q, MANIFEST.tsv names its source) and the
lent H200 at idle (tests/fixtures/h200-device). Thermal and HW-slowdown-alone have no real
capture: they are the V100 capture with one reason line edited, as each test says."""

from __future__ import annotations

from pathlib import Path

from ctx import make_host, run_check

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
V100 = (FIXTURES / "corpus" / "smi-q" / "v100-sxm2-32gb-dell-c4130-hw-power-brake-excerpt.txt").read_text()
H200_IDLE = (FIXTURES / "h200-device" / "nvidia-smi-q-d-performance-idle.txt").read_text()


def _edit(text: str, reason: str, state: str) -> str:
    lines = text.splitlines(keepends=True)
    i = next(i for i, line in enumerate(lines) if line.strip().startswith(reason))
    lines[i] = lines[i].replace("Not Active", state) if state == "Active" else lines[i].replace(": Active", ": Not Active")
    return "".join(lines)


def test_a_power_brake_fails_and_points_at_the_power_delivery():
    [f] = run_check("clock-events", make_host({"nvidia-smi-q": V100}))
    assert f.status.value == "fail" and f.symptoms == ("power-capping",)
    assert f.summary.startswith("HW power brake slowdown active on GPU")
    assert "SM 382 MHz" in f.evidence[0].excerpt and "hw_power_brake_slowdown" in f.evidence[0].excerpt
    assert "power supplies" in f.action


def test_an_idle_h200_passes():
    [f] = run_check("clock-events", make_host({"nvidia-smi-q": H200_IDLE}))
    assert f.status.value == "pass" and f.summary == "1 GPU: no hardware or thermal clock event (active: gpu_idle)"


def test_thermal_slowdown_fails_as_thermal_throttling():
    # The V100 capture with its brake released and HW Thermal Slowdown set instead.
    text = _edit(_edit(V100, "HW Power Brake Slowdown", "Not Active"), "HW Thermal Slowdown", "Active")
    [f] = run_check("clock-events", make_host({"nvidia-smi-q": text}))
    assert f.status.value == "fail" and f.symptoms == ("thermal-throttling",)
    assert f.summary.startswith("thermal slowdown active on GPU")


def test_hw_slowdown_alone_warns_and_asks_for_a_second_reading():
    # The V100 capture with its brake released: HW Slowdown stays, with no reason beneath it.
    [f] = run_check("clock-events", make_host({"nvidia-smi-q": _edit(V100, "HW Power Brake Slowdown", "Not Active")}))
    assert f.status.value == "warn" and "P-state change" in f.summary and "again" in f.action
