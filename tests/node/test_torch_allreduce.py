"""The torch all_reduce fallback: its nccl-tests-shaped output, read back by the nccl-tests
parser and judged by the check like all_reduce_perf's own; and, where torch and a GPU are,
the program itself.

The formatting is pure and runs here without torch. The rows fed to it are the real 8-GPU
A100 all_reduce capture's in-place sizes and times (corpus nccl-tests/a100-sxm4-40gb-8gpu-
allreduce-old-format-validation0.txt), so the figures recomputed from them can be compared
with what nccl-tests printed for the same measurement.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ctx import make_host, run_check

from preflight.collect.nccl import FALLBACK_SOURCE, PROBE_ID, NcclOptions, with_options
from preflight.model import Status
from preflight.node import torch_allreduce as ta
from preflight.parse.nccl_probe import parse_probe_output
from preflight.parse.nccl_tests import parse_nccl_tests

CORPUS = Path(__file__).parents[1] / "fixtures" / "corpus"
A100 = CORPUS / "nccl-tests" / "a100-sxm4-40gb-8gpu-allreduce-old-format-validation0.txt"
OPTS = ta.Options(min_bytes=8, max_bytes=8 << 30, factor=2, ngpus=8, check=True, iters=20, warmup=5)


def a100_in_place() -> list[tuple[int, float, float]]:
    """(size, in-place time in us, in-place busbw) of the A100 capture's rows from 8 bytes up."""
    rows = []
    for line in A100.read_text().splitlines():
        t = line.split()
        if len(t) == 12 and t[0].isdigit() and int(t[0]) >= 8:
            rows.append((int(t[0]), float(t[8]), float(t[10])))
    return rows


def fallback_text(nranks: int = 8, wrong_at: int | None = None, complete: bool = True) -> str:
    devices = [ta.Device(r, 4242 + r, "node1", r, f"0000:{0x18 + r:02x}:00", "NVIDIA A100-SXM4-40GB")
               for r in range(nranks)]
    rows = [ta.measure(size, us / 1e6, nranks, 1 if size == wrong_at else 0) for size, us, _ in a100_in_place()]
    lines = ta.preamble(OPTS) + [ta.torch_line("2.11.0+cu130")] + ta.devices_block(devices) + ta.table_header()
    lines += [ta.row_line(r) for r in (rows if complete else rows[:5])]
    return "\n".join(lines + (ta.footer(rows) if complete else [])) + "\n"


def test_the_parser_reads_the_fallback_output_as_an_all_reduce_run():
    [run] = parse_nccl_tests(fallback_text()).runs
    assert run.collective == "all_reduce" and run.nranks == 8
    assert (run.ngpus, run.min_bytes, run.max_bytes, run.iters, run.validation) == (1, 8, 8 << 30, 20, True)
    assert run.devices[7].bus_id == "0000:1f:00" and run.devices[7].name == "NVIDIA A100-SXM4-40GB"
    assert run.complete and run.out_of_bounds == 0 and run.errors == ()
    assert [r.size_bytes for r in run.rows] == ta.sizes(8, 8 << 30, 2) == [8 << i for i in range(31)]
    last = run.rows[-1]
    assert last.out_of_place is None and last.redop == "sum" and last.in_place.wrong == 0
    assert last.in_place.time_us == 63959.0
    # busbw recomputed from the capture's own time: within rounding of what nccl-tests printed.
    assert last.in_place.busbw == pytest.approx(235.03, abs=0.02)


def test_formatting_matches_nccl_tests_columns_and_footer():
    text = fallback_text()
    assert text.splitlines()[0] == ta.FIRST_LINE == "# preflight torch all_reduce fallback"
    assert "#  Rank  3 Group  0 Pid   4245 on      node1 device  3 [0000:1b:00] NVIDIA A100-SXM4-40GB" in text
    row = ta.row_line(ta.Row(2147483648, 1000.74, 2145.9, 2145900.0, 0))
    assert row == "  2147483648     536870912     float     sum      -1  1000.74  2145.9   2e+06       0"
    assert ta.row_line(ta.Row(8, 6.7, 0.0, 0.0, None)).endswith("0.00     N/A")
    avg = sum(ta.measure(s, us / 1e6, 8, 0).busbw for s, us, _ in a100_in_place()) / 31
    assert f"# Avg bus bandwidth    : {avg:g} " in text and "# Out of bounds values : 0 OK" in text


def test_pure_helpers():
    assert ta.bus_factor(8) == 1.75 and ta.bus_factor(1) == 0
    assert ta.sizes(8, 100, 2) == [8, 16, 32, 64] and ta.sizes(10, 40, 4) == [8, 40]
    assert ta.measure(1 << 30, 0.0, 2, 0).algbw == 0
    opts = ta.parse_args(["-b", "8", "-e", "8G", "-f", "2", "-g", "4", "-c", "1", "-n", "20"])
    assert opts == ta.Options(8, 8 << 30, 2, 4, True, 20, 5)
    with pytest.raises(SystemExit):
        ta.parse_args(["-b", "1G", "-e", "8"])


def test_the_check_judges_fallback_output_like_all_reduce_perf():
    marked = f"# preflight: tool=torch-fallback gpus=8 repetitions=1\n{fallback_text()}# preflight: repetition 1 exit=0 seconds=30\n"
    [f] = run_check("nccl-all-reduce", make_host({PROBE_ID: marked}, profile="hgx-h200"))
    assert (f.status, f.symptoms) == (Status.FAIL, ("nccl-low-bandwidth",))  # A100 figures, H200 profile
    assert f.summary.startswith("low bandwidth: busbw 235.0 GB/s at 8 GiB on 8 GPUs") and f.data["tool"] == "torch-fallback"
    wrong = fallback_text(wrong_at=1 << 20)
    [f] = run_check("nccl-all-reduce", make_host({PROBE_ID: wrong}, profile="generic"))
    assert (f.status, f.symptoms) == (Status.FAIL, ("nccl-data-corruption",))
    assert "1 wrong values at 1 MiB" in f.summary
    [f] = run_check("nccl-all-reduce", make_host({PROBE_ID: fallback_text(nranks=1)}, profile="hgx-h200"))
    assert f.status is Status.SKIP and f.summary.startswith(
        "the run used 1 GPU where a NVIDIA HGX H200 8-GPU has 8 (gpu-inventory judges the count): bandwidth not judged")
    assert parse_probe_output(fallback_text(complete=False)).repetitions[0].runs[0].complete is False


def test_the_program_needs_neither_preflight_nor_torch_to_start():
    tree = ast.parse(FALLBACK_SOURCE)
    top = {a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    top |= {n.module.split(".")[0] for n in tree.body if isinstance(n, ast.ImportFrom) and n.module}
    assert top <= {"__future__", "argparse", "os", "re", "socket", "sys", "time", "dataclasses"}
    # Run as the probe runs it, `python3 -c SOURCE`, here where torch is absent.
    proc = subprocess.run([sys.executable, "-c", FALLBACK_SOURCE, "--help"], check=False, capture_output=True, text=True)
    assert proc.returncode == 0 and "all_reduce over torch.distributed" in proc.stdout


# --------------------------------------------------------------------------- on a GPU


def _gpus() -> int:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    return torch.cuda.device_count()


@pytest.mark.gpu
def test_fallback_runs_all_reduce_on_the_gpus():
    n = _gpus()
    env = {**os.environ, "NCCL_DEBUG": "WARN"}  # as the probe runs it: NCCL then prints its version
    proc = subprocess.run([sys.executable, "-u", "-c", FALLBACK_SOURCE, "-b", "8", "-e", "64M", "-g", str(n)],
                          check=False, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [run] = parse_nccl_tests(proc.stdout).runs
    assert run.complete and run.nranks == n and run.out_of_bounds == 0 and run.nccl_version
    assert [r.size_bytes for r in run.rows] == ta.sizes(8, 64 << 20, 2)
    assert all(r.in_place.wrong == 0 for r in run.rows)
    assert (run.rows[-1].in_place.busbw > 0) == (n > 1)


@pytest.mark.gpu
def test_probe_script_with_the_fallback_on_this_node(tmp_path):
    n = _gpus()
    probe = with_options(NcclOptions(reps=2, max_bytes=1 << 30, timeout_s=240, cooldown_s=1,
                                                       tests_dir=str(tmp_path)))  # no all_reduce_perf there
    proc = subprocess.run(probe.argv, check=False, capture_output=True, text=True, timeout=probe.timeout_s)
    assert proc.returncode == 0, proc.stderr
    out = parse_probe_output(proc.stdout)
    assert out.tool == "torch-fallback" and out.gpus == n
    assert [r.exit_code for r in out.repetitions] == [0, 0]
    [f] = run_check("nccl-all-reduce", make_host({PROBE_ID: proc.stdout}, profile="generic"))
    assert f.status is (Status.SKIP if n == 1 else Status.PASS), f.summary
