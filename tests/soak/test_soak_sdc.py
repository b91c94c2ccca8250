"""The burn's silent-data-corruption verdict (preflight/soak/sdc.py, check soak-sdc), on the real
150 s H200 burn (tests/fixtures/h200-device/burn-sdc-150s, its MANIFEST says how it was
recorded). No real corruption was ever seen, so the failing cases edit one real row each: a
window whose count of differing tiles is set to 3, and a GPU's agreement set to 0."""

from __future__ import annotations

import shutil
from pathlib import Path

from preflight.diagnose.engine import load_knowledge
from preflight.model import Status
from preflight.node.burn import sdc_agreement
from preflight.soak.data import read_soak
from preflight.soak.judge import judge_soak
from preflight.soak.sdc import sdc

REAL = Path(__file__).resolve().parent.parent / "fixtures" / "h200-device" / "burn-sdc-150s"


def _verdict(soak: Path):
    data = read_soak(soak)
    [host] = data.meta.hosts
    return sdc(host, data.throughput[data.throughput["host"] == host])


def _copy_with(tmp_path: Path, metric: str, nth: int, value: str) -> Path:
    soak = tmp_path / "soak"
    shutil.copytree(REAL, soak)
    lines = (soak / "throughput.csv").read_text().splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if f",{metric}," in line]
    cells = lines[hits[nth]].rstrip("\n").split(",")
    cells[3] = value
    lines[hits[nth]] = ",".join(cells) + "\n"
    (soak / "throughput.csv").write_text("".join(lines))
    return soak


def test_the_real_burn_passes_with_its_windows_counted():
    verdict = _verdict(REAL)
    assert verdict.status is Status.PASS
    assert verdict.summary.startswith("29 windows of result checks on 1 GPU(s)")


def test_a_window_whose_result_changed_fails_with_the_gpu_and_the_time(tmp_path):
    verdict = _verdict(_copy_with(tmp_path, "gpu_sdc_mismatches", 10, "3"))
    assert verdict.status is Status.FAIL and verdict.symptoms == ("gpu-silent-data-corruption",)
    assert "GPU 0: 3 tile(s) of its GEMM result changed in 1 window(s), first at +" in verdict.summary
    assert verdict.evidence[0].probe == "throughput.csv" and ",gpu_sdc_mismatches,3,0" in verdict.evidence[0].excerpt


def test_a_gpu_outvoted_by_the_others_fails_and_the_diagnosis_names_the_cause(tmp_path):
    soak = _copy_with(tmp_path, "gpu_sdc_agrees", 0, "0")
    verdict = _verdict(soak)
    assert verdict.status is Status.FAIL
    assert "GPU(s) 0: first GEMM result differs from the other GPUs of the node (no majority" in verdict.summary
    analysis = judge_soak(soak, load_knowledge())
    assert [d.cause for d in analysis.diagnoses] == ["gpu-silent-data-corruption"]
    assert [f.check for f in analysis.findings if f.status is Status.FAIL] == ["soak-sdc"]


def test_a_gpu_is_outvoted_only_by_a_majority_of_its_own_model():
    h200, b200 = "NVIDIA H200 n=8192", "NVIDIA B200 n=8192"
    assert sdc_agreement({0: (h200, "a"), 1: (h200, "a"), 2: (h200, "b"), 3: (b200, "c")}) == \
        {0: True, 1: True, 2: False, 3: True}  # the B200 is alone of its kind: nothing to compare with
    assert sdc_agreement({0: (h200, "a"), 1: (h200, "b")}) == {0: False, 1: False}  # no majority
    assert sdc_agreement({g: (h200, "a") for g in range(8)}) == {g: True for g in range(8)}


# --- Why a soak has no result checks (issue 34) ------------------------------------------------

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "h200-soak-5min"


def _context_verdict(soak: Path):
    from preflight.soak.context import soak_context

    data = read_soak(soak)
    [host] = data.meta.hosts
    return soak_context(data).judge_sdc(host)


def _burn_without_checks(tmp_path: Path, agents: dict | None, engine: str = "burn") -> Path:
    import json

    soak = tmp_path / "soak"
    shutil.copytree(REAL, soak)
    lines = (soak / "throughput.csv").read_text().splitlines(keepends=True)
    (soak / "throughput.csv").write_text("".join(line for line in lines if ",gpu_sdc_" not in line))
    meta = json.loads((soak / "soak.json").read_text())
    meta.update(engine=engine, agents=agents)
    (soak / "soak.json").write_text(json.dumps(meta))
    return soak


def test_the_five_minute_example_is_a_burn_whose_agent_predates_the_checks():
    # It used to read "the engine did not check its results (only the burn does ...)": it is the burn,
    # recorded before the burn checked its results.
    verdict = _context_verdict(EXAMPLE)
    assert verdict.status is Status.SKIP
    assert verdict.summary == ("the burn recorded no result checks: its agent predates them (its summary names "
                               "no sdc), or it ran with --no-sdc")


def test_a_burn_run_with_no_sdc_says_so(tmp_path):
    [host] = read_soak(REAL).meta.hosts
    agents = {host: {"outcome": "finished", "summary": {"engine": {"0": {"sdc": False, "windows": 29}}}}}
    verdict = _context_verdict(_burn_without_checks(tmp_path, agents))
    assert (verdict.status, verdict.summary) == (Status.SKIP, "the burn ran with --no-sdc: its results were not checked")


def test_another_engine_is_named(tmp_path):
    verdict = _context_verdict(_burn_without_checks(tmp_path, None, engine="none"))
    assert verdict.summary == "the none engine does not check its results (only the burn does)"


def test_the_burn_summary_says_whether_it_checked_its_results():
    from preflight.node.burn import BurnEngine, BurnParams

    assert BurnEngine([(0, "GPU-0")], BurnParams(sdc=False)).summary() == {"0": {"sdc": False}}
    assert BurnEngine([(0, "GPU-0")], BurnParams()).summary()["0"]["sdc"] is True
