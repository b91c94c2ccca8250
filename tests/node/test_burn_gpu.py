"""The burn on a real GPU: steady GEMM windows and every result checked (marked gpu: skipped
where torch has no CUDA device; run on the lent H200 with `pytest -m gpu`)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from agent_runs import AGENT, heartbeat, read_csv

from preflight.soak.data import read_soak
from preflight.soak.sdc import sdc


def _cuda() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")


@pytest.mark.gpu
def test_the_burn_checks_every_chunk_and_its_results_never_change(tmp_path):
    _cuda()
    out = tmp_path / "soak"
    proc = subprocess.run([sys.executable, str(AGENT), "--engine", "burn", "--seconds", "30", "--interval", "0.5",
                           "--window", "2", "--out", str(out)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = read_csv(out / "throughput.csv")
    gpus = {r["gpu"] for r in rows if r["metric"] == "gpu_tflops"}
    checks = [r for r in rows if r["metric"] == "gpu_sdc_mismatches"]
    agrees = [r for r in rows if r["metric"] == "gpu_sdc_agrees"]
    assert gpus and {r["gpu"] for r in checks} == gpus and len(checks) >= 5 * len(gpus)
    assert {r["value"] for r in checks} == {"0"}
    assert sorted(r["gpu"] for r in agrees) == sorted(gpus) and {r["value"] for r in agrees} == {"1"}
    engine = heartbeat(out)["summary"]["engine"]
    for gpu in gpus:
        # About 20 checks a second per GPU (one per ~50 ms chunk of GEMMs), none of them off.
        assert engine[gpu]["sdc_checks"] >= 10 * 20 and engine[gpu]["sdc_mismatched_tiles"] == 0
    # The verdict itself, without loading every check (the lent GPU machine has no fabric).
    data = read_soak(out)
    [host] = data.meta.hosts
    verdict = sdc(host, data.throughput[data.throughput["host"] == host])
    assert verdict.status.value == "pass", verdict.summary
