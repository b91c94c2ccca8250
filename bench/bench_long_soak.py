"""Long soaks stay cheap? Node-side bytes per GPU-hour at 1 Hz, and the analysis of a long fleet soak.

    python3 bench/bench_long_soak.py [--hours 72] [--gpus 8] [--nodes 1,2,4] [--keep DIR]

SYNTHESISED DATA, from real rows: the node-side files are the real H200 burn's
(tests/fixtures/h200-device/burn-sdc-150s, written by the agent on the lent H200 at 0.5 s): its
loaded telemetry rows (utilisation above 50 %) and its throughput windows are repeated, byte for
byte except the time, host and gpu fields, at 1 Hz (telemetry) and every 5 s (throughput, the
burn's window), each GPU at another phase of the cycle, for ``--hours`` on ``--gpus`` GPUs of
each of ``--nodes`` nodes. Each size is written as a ``preflight-soak/1`` directory and judged by
``preflight analyze SOAK_DIR`` in a child process (``--no-html``: judging, not drawing), whose
wall time and peak resident memory (``ru_maxrss``) are printed. The analysis reads the files in
chunks and keeps each host's rows on disk while another host is judged (preflight/soak/hostrows.py),
so its memory should stay that of one node whatever ``--nodes`` is; the scratch it writes lies under
the system's temporary directory (``TMPDIR``) while it runs, next to the soak itself.

Bytes per GPU-hour are measured on the files as written: telemetry.csv per GPU, throughput.csv
per node divided by its GPUs; heartbeat.json is replaced, not appended, and stays one small file.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT / "tests" / "fixtures" / "h200-device" / "burn-sdc-150s"
WINDOW_S = 5


def _split(line: str, fields: int) -> list[str]:
    return line.rstrip("\n").split(",", fields)


def real_rows() -> tuple[list[str], list[list[tuple[str, str, str, str]]], str, str]:
    """The loaded telemetry rows' tails (after time,host,gpu), the throughput windows (each a list
    of (metric, value, gpu, node-or-gpu) rows), and the two headers."""
    tele = (REAL / "telemetry.csv").read_text().splitlines(keepends=True)
    loaded = [_split(line, 3)[3] for line in tele[1:] if float(_split(line, 10)[9]) > 50]
    thr = (REAL / "throughput.csv").read_text().splitlines(keepends=True)
    windows: dict[float, list] = {}
    for line in thr[1:]:
        t, _, metric, value, gpu = line.rstrip("\n").split(",")
        if metric.endswith(("tflops", "hbm_gbps", "sdc_mismatches")):
            windows.setdefault(round(float(t)), []).append((metric, value, gpu))
    return loaded, [w for _, w in sorted(windows.items())], tele[0], thr[0]


def write_soak(out: Path, hours: float, gpus: int, nodes: int) -> tuple[Path, dict]:
    loaded, windows, tele_head, thr_head = real_rows()
    out.mkdir(parents=True)
    hosts = [f"gpu{n + 1:03d}" for n in range(nodes)]
    t0 = 1796140800.0
    seconds = int(hours * 3600)
    sizes = {"telemetry": 0, "throughput": 0}
    with open(out / "telemetry.csv", "w") as tele, open(out / "throughput.csv", "w") as thr:
        tele.write(tele_head)
        thr.write(thr_head)
        for s in range(seconds):
            t = f"{t0 + s:.3f}"
            # One sample a second of every GPU of every node, as the agent appends them.
            tele.write("".join(f"{t},{h},{g},{loaded[(s + 7 * g) % len(loaded)]}\n"
                               for h in hosts for g in range(gpus)))
            if s % WINDOW_S == WINDOW_S - 1:
                rows = windows[(s // WINDOW_S) % len(windows)]
                thr.write("".join(f"{t},{h},{m},{v},{gpu_field(gpu, g)}\n"
                                  for h in hosts for m, v, gpu in rows
                                  for g in (range(gpus) if gpu else (None,))))
    sizes["telemetry"] = (out / "telemetry.csv").stat().st_size
    sizes["throughput"] = (out / "throughput.csv").stat().st_size
    meta = json.loads((REAL / "soak.json").read_text())
    meta.update({"hosts": hosts, "planned_s": float(seconds), "interval_s": 1.0,
                 "started": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(t0)),
                 "gpus": {h: [dict(meta["gpus"]["vm"][0], gpu=g) for g in range(gpus)] for h in hosts}})
    (out / "soak.json").write_text(json.dumps(meta))
    (out / "events.csv").write_text((REAL / "events.csv").read_text())
    return out, sizes


def gpu_field(recorded: str, gpu: int | None) -> str:
    return "" if gpu is None else str(gpu) if recorded else ""


def analyse(soak: Path, reports: Path) -> tuple[float, float, int]:
    """Wall seconds, peak RSS (MiB) and exit code of ``preflight analyze SOAK_DIR``."""
    code = ("import resource, sys, time\n"
            "from preflight.app.cli import main\n"
            "t = time.perf_counter()\n"
            f"rc = main(['analyze', {str(soak)!r}, '--out', {str(reports)!r}, '--no-html', '-q'])\n"
            "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, rc)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0 or len(proc.stdout.split()) < 3:
        raise SystemExit(f"analyze failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    wall, rss_kib, rc = proc.stdout.split()[-3:]
    return float(wall), int(rss_kib) / 1024, int(rc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=72)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--nodes", default="1,2,4", help="comma-separated node counts to analyse")
    ap.add_argument("--keep", type=Path, help="write the soak directories here (default: a temporary one)")
    args = ap.parse_args()
    print(f"# SYNTHESISED from real H200 rows ({REAL.relative_to(ROOT)}), repeated with shifted timestamps; "
          f"{os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}, load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(dir=args.keep) as tmp:
        for n in (int(x) for x in args.nodes.split(",")):
            t = time.perf_counter()
            soak, sizes = write_soak(Path(tmp) / f"soak-{n}", args.hours, args.gpus, n)
            written = time.perf_counter() - t
            gpu_hours = args.hours * args.gpus * n
            wall, rss, rc = analyse(soak, Path(tmp) / f"reports-{n}")
            rows = int(args.hours * 3600) * args.gpus * n
            total = sizes["telemetry"] + sizes["throughput"]
            print(f"{args.hours:g} h x {args.gpus} GPUs x {n} nodes: {rows:,} telemetry rows, "
                  f"telemetry {sizes['telemetry'] / gpu_hours / 1e3:.1f} kB/GPU-hour, throughput "
                  f"{sizes['throughput'] / gpu_hours / 1e3:.1f} kB/GPU-hour ({total / 1e6:.0f} MB in all, written "
                  f"in {written:.0f} s); analyze {wall:.1f} s, peak RSS {rss:,.0f} MiB, exit {rc}",
                  flush=True)
            for path in Path(tmp).glob(f"soak-{n}/*.csv"):
                path.unlink()  # keep the disk for the next size


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    main()
