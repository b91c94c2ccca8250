"""The verdict on the burn's silent-data-corruption checks (``preflight/node/burn.py``).

The burn reports, per GPU and window, how many 1024-square tiles of its GEMM's result differed
from the GPU's first result (``gpu_sdc_mismatches``), and once per GPU whether that first result
agreed with the other GPUs of its model on the node (``gpu_sdc_agrees``). Either one wrong is a
FAIL ``gpu-silent-data-corruption`` naming the GPU and when; a soak without these rows (a vLLM
soak, a burn run with ``--no-sdc``, telemetry assembled from elsewhere) is a SKIP that says so.
"""

from __future__ import annotations

import pandas as pd

from preflight.check import Outcome
from preflight.contracts import THROUGHPUT_CSV
from preflight.model import Evidence, Status

SYMPTOM = "gpu-silent-data-corruption"


def sdc(host: str, rows: pd.DataFrame) -> Outcome:
    """``rows``: the host's throughput.csv rows (time, metric, value, gpu)."""
    checks = rows[rows["metric"] == "gpu_sdc_mismatches"]
    agrees = rows[rows["metric"] == "gpu_sdc_agrees"]
    if checks.empty and agrees.empty:
        return Outcome(Status.SKIP, "the engine did not check its results (only the burn does, unless run "
                                    "with --no-sdc)", host=host)
    t0 = rows["time"].min()
    wrong, evidence = [], []
    for gpu, got in checks[checks["value"] > 0].groupby("gpu"):
        first = got.iloc[0]
        wrong.append(f"GPU {int(gpu)}: {int(got['value'].sum())} tile(s) of its GEMM result changed in "
                     f"{len(got)} window(s), first at +{(first['time'] - t0) / 60:.1f} min")
        evidence.append(Evidence(THROUGHPUT_CSV, f"{first['time']},{host},gpu_sdc_mismatches,"
                                                 f"{first['value']:g},{int(gpu)}"))
    outvoted = sorted(int(g) for g in agrees[agrees["value"] == 0]["gpu"])
    if outvoted:
        wrong.append(f"GPU(s) {', '.join(map(str, outvoted))}: first GEMM result differs from the other GPUs "
                     f"of the node" + (" (no majority: every GPU of the model is suspect)"
                                       if len(outvoted) == agrees["gpu"].nunique() else ""))
        evidence += [Evidence(THROUGHPUT_CSV, f"{host},gpu_sdc_agrees,0,{g}") for g in outvoted]
    gpus = int(pd.concat([checks["gpu"], agrees["gpu"]]).nunique())
    if wrong:
        return Outcome(Status.FAIL, "silent data corruption: " + "; ".join(wrong), (SYMPTOM,), tuple(evidence),
                       {"gpus_wrong": sorted({*outvoted, *(int(g) for g in checks[checks["value"] > 0]["gpu"])})},
                       host)
    return Outcome(Status.PASS, f"{len(checks)} windows of result checks on {gpus} GPU(s): every GEMM result "
                                f"identical to the first, and across the node's GPUs", (), (),
                   {"windows": len(checks)}, host)
