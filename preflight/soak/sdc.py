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


def sdc(host: str, rows: pd.DataFrame, engine: str | None = None, checked: bool | None = None) -> Outcome:
    """``rows``: the host's throughput.csv rows (time, metric, value, gpu). ``engine``: soak.json's;
    ``checked``: whether the host's burn says it checked its results (its summary's ``sdc``, written
    since it was added; None where the agent wrote none), for the reason of a SKIP."""
    checks = rows[rows["metric"] == "gpu_sdc_mismatches"]
    agrees = rows[rows["metric"] == "gpu_sdc_agrees"]
    if checks.empty and agrees.empty:
        return Outcome(Status.SKIP, _unchecked(engine, checked), host=host)
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


def _unchecked(engine: str | None, checked: bool | None) -> str:
    """Why a host's soak has no result checks, as far as its soak.json can tell."""
    if engine != "burn":
        return (f"the {engine} engine does not check its results (only the burn does)" if engine
                else "no result checks in the soak (only the burn makes them)")
    if checked is False:
        return "the burn ran with --no-sdc: its results were not checked"
    if checked:
        return "the burn was to check its results but recorded no check (did a window finish?)"
    # The example h200-soak-5min is such a soak: recorded (2026-11-29) before the burn checked
    # its results, so its agent's summary has no "sdc" and its throughput.csv no gpu_sdc rows.
    return ("the burn recorded no result checks: its agent predates them (its summary names no sdc), "
            "or it ran with --no-sdc")

