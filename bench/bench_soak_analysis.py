"""Time the soak analysis on an hour of 8-GPU telemetry sampled at 10 Hz.

    python3 bench/bench_soak_analysis.py [--minutes 60] [--gpus 8] [--repeat 3]

The telemetry is the real H200 burn's loaded part (tests/fixtures/corpus/h200-vm/
burn_samples.json, 10 Hz) repeated to the length asked for on every GPU (tests/soak_scenarios.py);
it is written as a preflight-soak/1 directory, then read and judged the way
`preflight analyze SOAK_DIR` does. Prints best-of-N seconds for reading and for judging.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import soak_scenarios as S  # noqa: E402

from preflight.soak.analysis import analyze  # noqa: E402
from preflight.soak.data import SoakMeta, read_soak, write_soak  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    tele, thr = S.steady_frames(minutes=args.minutes, gpus=args.gpus, every=1)
    with tempfile.TemporaryDirectory() as tmp:
        soak = write_soak(Path(tmp) / "soak", SoakMeta("burn", S.START.isoformat(), ("gpu001",)), tele, thr)
        size = (soak / "telemetry.csv").stat().st_size
        reads, judges = [], []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            data = read_soak(soak)
            t1 = time.perf_counter()
            analyze(data)
            t2 = time.perf_counter()
            reads.append(t1 - t0)
            judges.append(t2 - t1)
    print(f"# {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}: {len(tele)} telemetry rows "
          f"({args.minutes:g} min x {args.gpus} GPUs x 10 Hz), {size / 1e6:.1f} MB CSV; best of {args.repeat}")
    print(f"read  {min(reads):.2f} s")
    print(f"judge {min(judges):.2f} s")


if __name__ == "__main__":
    main()
