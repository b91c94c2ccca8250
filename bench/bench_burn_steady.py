"""How steady the burn holds a GPU, from a soak agent's output directory.

    python3 preflight/node/agent.py --engine burn --seconds 300 --interval 0.5 --bench 20 --out DIR
    python3 bench/bench_burn_steady.py DIR [--warmup 120]

Prints, per GPU, over the burn's windows after ``--warmup`` seconds: the 5th percentile and the
minimum of the power samples against the enforced limit, the GPU temperature's range, the
median GEMM TFLOP/s against the plain ``torch.matmul`` loop of ``--bench`` on the same GPU, and
the silent-data-corruption checks (result checks, tiles that differed). Standard library only,
so it runs where the agent ran.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path


def _floats(row: dict, *keys: str) -> tuple[float, ...] | None:
    try:
        return tuple(float(row[k]) for k in keys)
    except (KeyError, TypeError, ValueError):
        return None


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--warmup", type=float, default=120.0, help="seconds of the burn left out at its start")
    args = ap.parse_args()
    with (args.dir / "throughput.csv").open(newline="") as f:
        thr = list(csv.DictReader(f))
    with (args.dir / "telemetry.csv").open(newline="") as f:
        tele = list(csv.DictReader(f))
    beat = json.loads((args.dir / "heartbeat.json").read_text())
    engine = (beat.get("summary") or {}).get("engine") or {}
    windows = [r for r in thr if r["metric"] == "gpu_tflops"]
    if not windows:
        sys.exit(f"{args.dir}: no gpu_tflops windows (not a burn soak?)")
    start, end = min(float(r["time"]) for r in windows), max(float(r["time"]) for r in windows)
    t0 = start + args.warmup
    print(f"# {args.dir}: burn windows {start:.0f}..{end:.0f} ({end - start:.0f} s), judged after {args.warmup:g} s")
    print(f"{'gpu':>3} {'P5 power/limit':>15} {'min power':>10} {'temp range':>11} {'TFLOP/s':>8} "
          f"{'matmul':>7} {'eff':>6} {'sdc checks':>10} {'bad tiles':>9}")
    for gpu in sorted({r["gpu"] for r in windows}, key=int):
        power, limits, temps = [], [], []
        for row in tele:
            got = _floats(row, "time", "power_w", "power_limit_w", "temperature_c")
            if row["gpu"] == gpu and got and t0 <= got[0] <= end:
                power.append(got[1])
                limits.append(got[2])
                temps.append(got[3])
        tflops = [float(r["value"]) for r in windows if r["gpu"] == gpu and float(r["time"]) >= t0]
        sdc = [float(r["value"]) for r in thr if r["metric"] == "gpu_sdc_mismatches" and r["gpu"] == gpu]
        g = engine.get(gpu, {})
        bench = g.get("bench_matmul_tflops")
        med = statistics.median(tflops) if tflops else float("nan")
        if not power:
            print(f"{gpu:>3} no telemetry after the warm-up")
            continue
        limit = statistics.median(limits)
        print(f"{gpu:>3} {percentile(power, 5):>7.1f}/{limit:<5.0f}{percentile(power, 5) / limit:>4.0%}"
              f" {min(power):>9.1f}W {min(temps):>5.0f}-{max(temps):<3.0f}°C {med:>8.1f} "
              f"{bench if bench else float('nan'):>7.1f} {med / bench if bench else float('nan'):>6.1%} "
              f"{len(sdc):>10} {int(sum(sdc)):>9}")
        _trace(gpu, tele, start, end)
    return 0


def _trace(gpu: str, tele: list[dict], start: float, end: float, step: float = 30.0) -> None:
    """Per ``step`` seconds of the burn: median temperature and the 5th percentile of power, so a
    slow warm-up reads apart from dips."""
    buckets: dict[int, list[tuple[float, float]]] = {}
    for row in tele:
        got = _floats(row, "time", "power_w", "temperature_c")
        if row["gpu"] == gpu and got and start <= got[0] <= end:
            buckets.setdefault(int((got[0] - start) // step), []).append((got[1], got[2]))
    print("    " + "  ".join(f"+{k * step:.0f}s {statistics.median(t for _, t in v):.0f}°C "
                             f"P5 {percentile([p for p, _ in v], 5):.0f}W" for k, v in sorted(buckets.items())))


if __name__ == "__main__":
    sys.exit(main())
