"""The nccl-all-reduce probe, its options, and the check, on real nccl-tests outputs.

Multi-repetition scenarios are derived from real captures, each derivation said where it is
made: a real run repeated with the probe's markers (the format the probe script prints, see
test_probe_script_* which run that script), one repetition replaced by a truncated copy closed
by exit=124, busbw columns scaled, a #wrong or out-of-bounds count set to 1.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from ctx import make_host, result, run_check

from preflight.app.cli import main
from preflight.app.run import probes_for
from preflight.collect.nccl import FALLBACK_SOURCE, PROBE_ID, NcclOptions, parse_size, probe_timeout, with_options
from preflight.collect.probes import PROBES
from preflight.collect.ssh import remote_command
from preflight.diagnose.engine import diagnose, load_knowledge
from preflight.judge.context import HostContext
from preflight.judge.loader import load_checks
from preflight.knowledge.profiles import Profile
from preflight.model import Finding, Status
from preflight.parse.nccl_probe import parse_probe_output

CORPUS = Path(__file__).parents[1] / "fixtures" / "corpus"
A100 = (CORPUS / "nccl-tests" / "a100-sxm4-40gb-8gpu-allreduce-old-format-validation0.txt").read_text()
H200_1GPU = (CORPUS / "h200-vm" / "all_reduce_1gpu.txt").read_text()
TOOL = "/opt/nccl-tests/build/all_reduce_perf"

# A site profile for 8 x A100-SXM4-40GB that records the A100 capture's own busbw at 8 GiB
# (235.26 GB/s, out-of-place) as its expectation: the shipped profiles have no A100 figure.
SITE_A100 = Profile("site-a100", "8 x A100-SXM4-40GB (site)",
                    {"gpu": {"count": 8}, "nccl": {"all_reduce_busbw_gbs": 235.26}}).chosen("test")


def probe_output(runs: list[tuple[str, int, int]], tool: str = TOOL, gpus: int = 8) -> str:
    """What the probe prints: its tool line, then each run closed by its marker."""
    lines = [f"# preflight: tool={tool} gpus={gpus} repetitions={len(runs)}"]
    for k, (text, code, seconds) in enumerate(runs, start=1):
        lines += [text.rstrip("\n"), f"# preflight: repetition {k} exit={code} seconds={seconds}"]
    return "\n".join(lines) + "\n"


def scale_a100_busbw(text: str, factor: float, sizes: set[int] | None = None) -> str:
    """The A100 capture with busbw scaled (columns 7 and 11 of its old layout), for every row
    or only the listed sizes; nothing else changes."""
    out = []
    for line in text.splitlines():
        tokens = line.split()
        if len(tokens) == 12 and tokens[0].isdigit() and (sizes is None or int(tokens[0]) in sizes):
            for i in (6, 10):
                tokens[i] = f"{float(tokens[i]) * factor:.2f}"
            line = "  ".join(tokens)
        out.append(line)
    return "\n".join(out) + "\n"


def truncated(text: str, rows: int) -> str:
    """A run cut after its first `rows` table rows, as a repetition killed mid-table leaves it."""
    lines, kept, seen = text.splitlines(), [], 0
    for line in lines:
        if re.match(r"^\s*\d+\s+\d+\s", line):
            seen += 1
            if seen > rows:
                break
        kept.append(line)
    return "\n".join(kept) + "\n"


def host_with(text_or_result, profile: Profile | str = SITE_A100) -> HostContext:
    if isinstance(profile, str):
        return make_host({PROBE_ID: text_or_result}, profile=profile)
    r = text_or_result if not isinstance(text_or_result, str) else result(PROBE_ID, text_or_result)
    return HostContext("node1", {PROBE_ID: r}, profile)


def judge(text_or_result, profile: Profile | str = SITE_A100) -> Finding:
    [finding] = run_check("nccl-all-reduce", host_with(text_or_result, profile))
    return finding


# --------------------------------------------------------------------------- real captures

# Every corpus file the check may be handed: (file, status, symptoms, words in the summary).
CORPUS_CASES = [
    ("nccl-tests/a100-sxm4-40gb-8gpu-allreduce-old-format-validation0.txt", "pass", (),
     "busbw 235.3 GB/s at 8 GiB on 8 GPUs; profile generic has no all_reduce figure"),
    ("nccl-tests/a100-sxm4-40gb-8gpu-alltoall-old-format-empty-redop.txt", "pass", (),
     "busbw 226.2 GB/s at 8 GiB on 8 GPUs; a non-reduction (redop empty) run"),
    # Cut by the excerpt before its footer, with no timeout recorded: incomplete, not a hang
    # (issue 15, item 6; a hang needs a limit that was hit, see the tests below).
    ("nccl-tests/allreduce-128gpu-old-format-error-column-float-1e-06.txt", "error", ("nccl-incomplete",),
     "ended after 6 result rows (up to 131072 B) without its 'Avg bus bandwidth' footer, and no timeout "
     "was recorded"),
    ("nccl-tests/allreduce-2node-v100-not-built-with-mpi-duplicate-headers.txt", "error", ("nccl-incomplete",),
     "incomplete evidence, not a hang: 1 of 1 repetitions ended without their results (#1: ended after "
     "the device list (2 ranks), before any result row"),
    ("nccl-tests/alltoall-1gpu-rtx5090-inplace-na-absurd-algbw.txt", "skip", (),
     "single GPU: bandwidth not applicable"),
    ("nccl-tests/azure-ib-error12-retry-exceeded-nccl-warn.txt", "fail", ("nccl-ib-retry-exceeded",),
     "IB/RoCE transport retry counter exceeded"),
    ("nccl-tests/gcp-a3-high-h100-multinode-allgather-tcpx-wrong-na.txt", "pass", (),
     "busbw 71.3 GB/s at 512 MiB; a non-reduction (redop none) run"),
    ("nccl-tests/gcp-a3-mega-h100-2node-allgather-tcpxo-indented.txt", "pass", (),
     "busbw 188.9 GB/s at 8 GiB"),
    ("nccl-tests/gcp-a3-ultra-h200-2node-allgather-rdma-healthy.txt", "pass", (),
     "busbw 335.7 GB/s at 8 GiB"),
    ("nccl-tests/hgx-a100-nccl-info-libibverbs-missing-socket-fallback.txt", "error", ("nccl-no-ibverbs",),
     "no all_reduce result in the output; NCCL: libibverbs could not be loaded"),
    ("nccl-tests/hgx-nccl2.27-ibv-modify-qp-110-timeout-init-rtr-timestamped.txt", "fail", ("nccl-ib-qp-timeout",),
     "queue-pair connection timed out"),
    ("nccl-tests/jean-zay-nccl-warn-socket-connect-refused.txt", "fail", ("nccl-socket-refused",),
     "a TCP connection to a peer was refused"),
    ("nccl-tests/l40-2node-roce-irdma-nccl-info-init-excerpt.txt", "error", ("nccl-incomplete",),
     "ended after the device list (1 rank), before any result row"),
    ("nccl-tests/roce-nccl-info-gpu-direct-rdma-disabled-for-hca.txt", "error", ("nccl-gdr-disabled",),
     "GPUDirect RDMA is off between a GPU and this NIC (2 lines)"),
    ("nccl-tests/v100-2gpu-cross-socket-allreduce-32mb-low-busbw.txt", "pass", (),
     "busbw 5.8 GB/s at 32 MiB on 2 GPUs; largest size below 1 GiB: a connectivity run"),
    ("h200-vm/all_reduce_1gpu.txt", "skip", (), "single GPU: bandwidth not applicable (1 of 1"),
    ("h200-vm/all_reduce_1gpu_debug.txt", "skip", (), "single GPU: bandwidth not applicable"),
    # Three real 8 GiB runs on the lent H200, saved with a shell loop's own "# rep N" lines.
    ("../h200-device/ar_1gpu_3reps.txt", "skip", (), "single GPU: bandwidth not applicable (3 of 3"),
    ("../h200-device/ar_json_run.txt", "skip", (), "single GPU: bandwidth not applicable (1 of 1"),
]


@pytest.mark.parametrize("name, status, symptoms, words", CORPUS_CASES, ids=[Path(c[0]).name for c in CORPUS_CASES])
def test_every_corpus_output(name, status, symptoms, words):
    f = judge((CORPUS / name).read_text(), "generic")
    assert (f.status.value, f.symptoms) == (status, symptoms)
    assert words in f.summary


def test_corpus_covers_every_nccl_tests_file():
    names = {c[0] for c in CORPUS_CASES}
    assert {f"nccl-tests/{p.name}" for p in (CORPUS / "nccl-tests").iterdir()} <= names


def test_single_gpu_h200_debug_notes_no_ib_device_but_does_not_warn():
    f = judge((CORPUS / "h200-vm" / "all_reduce_1gpu_debug.txt").read_text(), "hgx-h200")
    assert f.status is Status.SKIP and f.data["nranks"] == 1
    assert f.data["noted_signatures"] == ["nccl-no-ib-device"] and not f.symptoms


def test_fatal_signature_evidence_is_the_warn_line():
    f = judge((CORPUS / "nccl-tests" / "azure-ib-error12-retry-exceeded-nccl-warn.txt").read_text(), "generic")
    assert "with error 12, opcode 0" in f.evidence[0].excerpt


# --------------------------------------------------------------------------- derived repetitions


def test_five_healthy_repetitions_pass_with_their_figures():
    f = judge(probe_output([(A100, 0, 41)] * 5))
    assert f.status is Status.PASS and not f.symptoms
    assert f.summary.startswith("busbw 235.3 GB/s at 8 GiB on 8 GPUs (median of 5, CV 0.0%), 100.0% of the "
                                "235.26 GB/s site-a100 expects")
    assert f.data["busbw_gbs"] == {1: 235.26, 2: 235.26, 3: 235.26, 4: 235.26, 5: 235.26}
    assert f.data["largest_bytes"] == 8589934592 and f.data["nranks"] == 8 and f.data["cv"] == 0
    assert f.data["tool"] == TOOL and f.data["passed"] == [1, 2, 3, 4, 5]
    assert f.evidence and f.evidence[0].excerpt.startswith("8589934592")


def test_busbw_scaled_to_70_percent_warns_and_to_40_percent_fails():
    low = judge(probe_output([(scale_a100_busbw(A100, 0.7), 0, 41)] * 3))
    assert (low.status, low.symptoms) == (Status.WARN, ("nccl-low-bandwidth",))
    assert low.summary.startswith("low bandwidth: busbw 164.7 GB/s at 8 GiB") and "70.0% of the" in low.summary
    bad = judge(probe_output([(scale_a100_busbw(A100, 0.4), 0, 41)] * 3))
    assert (bad.status, bad.symptoms) == (Status.FAIL, ("nccl-low-bandwidth",))
    assert "40.0% of the 235.26 GB/s" in bad.summary


def test_one_slow_repetition_raises_the_variation_above_tolerance():
    slow = scale_a100_busbw(A100, 0.8, sizes={8589934592})
    f = judge(probe_output([(A100, 0, 41), (A100, 0, 41), (slow, 0, 41), (A100, 0, 41)]))
    assert (f.status, f.symptoms) == (Status.WARN, ("nccl-unstable",))
    assert f.summary.startswith("busbw varies between repetitions: CV 10.5% > 5% (#1 235.3, #2 235.3, #3 188.2")
    assert f.data["cv"] == pytest.approx(0.1053, abs=1e-3)


def test_a_hung_repetition_fails_as_hang_and_intermittent():
    runs = [(A100, 0, 41), (A100, 0, 40), (truncated(A100, 20), 124, 300), (A100, 0, 41), (A100, 0, 41)]
    f = judge(probe_output(runs))
    assert f.status is Status.FAIL and f.symptoms == ("nccl-hang", "nccl-unstable")
    assert f.summary.startswith("1 of 5 repetitions hung (#3: stopped by its timeout after 300 s (exit 124)); "
                                "intermittent: 4 of 5 repetitions passed")
    assert "# preflight: repetition 3 exit=124 seconds=300" in f.evidence[0].excerpt
    assert f.data["hung"] == [3] and list(f.data["busbw_gbs"]) == [1, 2, 4, 5]


def test_every_repetition_hung_is_a_hang_not_instability():
    f = judge(probe_output([(truncated(A100, 3), 137, 310)] * 2))
    assert (f.status, f.symptoms) == (Status.FAIL, ("nccl-hang",))
    assert "2 of 2 repetitions hung" in f.summary and "exit 137" in f.summary


def test_a_crashed_repetition_is_a_failure():
    # The A100 run cut after 10 rows, then nccl-tests' own failure line (its format, as the
    # parser's _TEST_FAILURE reads it) and exit 1.
    crash = truncated(A100, 10) + "localhost: Test NCCL failure common.cu:1005 'unhandled system error'\n"
    f = judge(probe_output([(A100, 0, 41), (crash, 1, 3)]))
    assert f.status is Status.FAIL and f.symptoms == ("nccl-failed", "nccl-unstable")
    assert "1 of 2 repetitions failed (#2: exit 1: localhost: Test NCCL failure" in f.summary


def test_probe_cut_by_its_own_timeout_reads_as_a_hang():
    # Two repetitions closed, the third still printing when the probe's overall limit hit.
    text = probe_output([(A100, 0, 41)] * 2) + truncated(A100, 5)
    f = judge(result(PROBE_ID, text, exit_code=None, timed_out=True))
    assert f.status is Status.FAIL and f.symptoms == ("nccl-hang", "nccl-unstable")
    assert "#3: still running when the probe's own timeout stopped it" in f.summary


def test_one_wrong_value_fails_even_on_a_single_gpu():
    # The real 1-GPU H200 run with its in-place #wrong at 2 GiB set to 1.
    row = "  2147483648     536870912     float     sum      -1  1000.74  2145.9    0.00       0     0.97   2e+06    0.00       0"
    assert row in H200_1GPU
    f = judge(probe_output([(H200_1GPU.replace(row, row[:-1] + "1"), 0, 9)], gpus=1), "hgx-h200")
    assert (f.status, f.symptoms) == (Status.FAIL, ("nccl-data-corruption",))
    assert f.summary.startswith("wrong results: 1 wrong values at 2 GiB in repetition(s) 1; the run used 1 GPU "
                                "where a NVIDIA HGX H200 8-GPU has 8")
    assert f.evidence[0].excerpt.startswith("2147483648")


def test_out_of_bounds_values_fail():
    text = H200_1GPU.replace("# Out of bounds values : 0 OK", "# Out of bounds values : 1 FAILED")
    f = judge(text, "hgx-h200")
    assert (f.status, f.symptoms) == (Status.FAIL, ("nccl-data-corruption",))
    assert "1 out-of-bounds values" in f.summary and "Out of bounds values : 1" in f.evidence[0].excerpt


def test_rank_count_unlike_the_profile_is_reported_not_judged():
    four_gpu = Profile("site-4", "4-GPU site", {"gpu": {"count": 4}, "nccl": {"all_reduce_busbw_gbs": 400}}).chosen("t")
    f = judge(probe_output([(A100, 0, 41)]), four_gpu)
    assert f.status is Status.PASS
    assert "8 ranks, but the 400 GB/s of site-4 is for 4 GPUs: not judged" in f.summary


def test_h200_profile_judges_an_8_rank_run_against_475():
    f = judge(probe_output([(A100, 0, 41)]), "hgx-h200")
    assert (f.status, f.symptoms) == (Status.FAIL, ("nccl-low-bandwidth",))
    assert "49.5% of the 475 GB/s hgx-h200 expects" in f.summary and f.data["threshold_gbs"] == 475 * 0.85


# --------------------------------------------------------------------------- missing evidence


def test_not_run_is_skipped():
    [f] = run_check("nccl-all-reduce", make_host({}, profile="hgx-h200"))
    assert f.status is Status.SKIP and f.summary.startswith("not run: an active test")


def test_tool_missing_says_what_the_script_looked_for():
    r = result(PROBE_ID, "", exit_code=127, stderr="all_reduce_perf not found (in PATH) and python3 cannot import torch\n")
    f = judge(r)
    assert (f.status, f.symptoms) == (Status.ERROR, ("tool-missing",))
    assert f.summary == "cannot judge: all_reduce_perf not found (in PATH) and python3 cannot import torch"


def test_no_gpu_listed_is_a_failed_probe():
    f = judge(result(PROBE_ID, "", exit_code=1, stderr="nvidia-smi -L lists no GPU\n"))
    assert (f.status, f.symptoms) == (Status.ERROR, ("probe-failed",))
    assert "nvidia-smi -L lists no GPU" in f.evidence[0].excerpt


def test_output_that_is_not_nccl_tests_is_unreadable():
    f = judge("sh: 1: all_reduce_perf: Permission denied\n")
    assert (f.status, f.symptoms) == (Status.ERROR, ("probe-unreadable",))


# --------------------------------------------------------------------------- diagnosis


def _causes(*findings: Finding) -> dict[str, tuple[str, str]]:
    return {d.cause: (d.confidence, d.action) for d in diagnose(list(findings), load_knowledge())}


def test_nic_firmware_mismatch_explains_the_hang_and_the_instability():
    runs = [(A100, 0, 41), (truncated(A100, 20), 124, 300)]
    nccl = judge(probe_output(runs))
    fw = Finding("nic-firmware", "node1", Status.FAIL, "CX7 fw 28.39 older than the driver expects",
                 ("nic-fw-driver-mismatch",))
    causes = _causes(nccl, fw)
    assert list(causes) == ["nic-fw-driver-mismatch"] and causes["nic-fw-driver-mismatch"][0] == "high"
    assert set(_causes(nccl)) == {"nccl-hang", "nccl-unstable"}


def test_signatures_diagnose_their_causes_with_actions():
    corpus = CORPUS / "nccl-tests"
    retry = judge((corpus / "azure-ib-error12-retry-exceeded-nccl-warn.txt").read_text(), "generic")
    assert "perfquery" in _causes(retry)["nccl-ib-retry-exceeded"][1]
    port = Finding("ib-ports", "node1", Status.FAIL, "mlx5_1 Down", ("ib-port-down",))
    assert list(_causes(retry, port)) == ["ib-port-down"]
    gdr = judge((corpus / "roce-nccl-info-gpu-direct-rdma-disabled-for-hca.txt").read_text(), "generic")
    assert "modprobe nvidia-peermem" in _causes(gdr)["nccl-gdr-disabled"][1]
    verbs = judge((corpus / "hgx-a100-nccl-info-libibverbs-missing-socket-fallback.txt").read_text(), "generic")
    assert "rdma-core" in _causes(verbs)["nccl-no-ibverbs"][1]


# --------------------------------------------------------------------------- probe and options


def test_parse_size_accepts_suffixes_and_refuses_the_rest():
    assert [parse_size(s) for s in ("8G", "512M", "1024", "8")] == [8 << 30, 512 << 20, 1024, 8]
    for bad in ("8X", "", "-1G", "4"):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_probes_for_builds_the_nccl_probe_with_the_run_options():
    checks = [c for c in load_checks(use_entry_points=False) if c.id == "nccl-all-reduce"]
    opts = NcclOptions(reps=2, max_bytes=1 << 20, timeout_s=60, tests_dir="/opt/nccl tests; reboot")
    [probe] = probes_for(checks, {PROBE_ID: opts})
    assert probe.argv[-8:] == ("2", "1048576", "60", "/opt/nccl tests; reboot", "5", FALLBACK_SOURCE, "30", "120")
    # The setup's limits are the run's --timeout (default 30 s) and 4 x it for the torch import.
    assert probe.timeout_s == probe_timeout(opts) == 2 * (60 + 10 + 5) + (30 + 120 + 2 * 5 + 30) and probe.active
    # The options travel quoted: the remote command line splits back into the same argv.
    assert shlex.split(remote_command(probe.argv, probe.timeout_s))[4:] == list(probe.argv)
    assert PROBES[PROBE_ID].argv == probe.argv[:4]


def test_cli_passes_the_active_test_options_and_quick_leaves_them_out(tmp_path, monkeypatch):
    seen = []
    nothing = SimpleNamespace(failed=False, hosts={}, findings=[])  # what -q's one line reads
    monkeypatch.setattr("preflight.app.run_output.execute",
                        lambda req, progress=None: seen.append(req.plan.probes) or (tmp_path, nothing))
    argv = ["run", "--local", "-q", "--out", str(tmp_path), "--checks", "nccl-all-reduce,gpu-inventory"]
    assert main(argv + ["--nccl-reps", "3", "--nccl-max-bytes", "512M", "--nccl-timeout", "90",
                        "--nccl-tests-dir", "/opt/nccl-tests/build"]) == 0
    nccl = next(p for p in seen[0] if p.id == PROBE_ID)
    assert nccl.argv[-8:-3] == ("3", str(512 << 20), "90", "/opt/nccl-tests/build", "5")
    # No inner limit of the script is fixed: --timeout bounds its nvidia-smi -L and torch import.
    assert main(argv + ["--timeout", "10"]) == 0
    nccl = next(p for p in seen[1] if p.id == PROBE_ID)
    assert nccl.argv[-2:] == ("10", "40") and nccl.timeout_s == 5 * (300 + 10 + 5) + (10 + 40 + 2 * 5 + 30)
    assert main(argv + ["--quick"]) == 0
    assert [p.id for p in seen[2]] == ["nvidia-smi-q-x", "nvidia-smi-q"]


def test_cli_refuses_a_bad_size_naming_the_option(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--local", "--out", str(tmp_path / "out"), "--nccl-max-bytes", "8X"])
    assert exc.value.code == 2
    assert "argument --nccl-max-bytes: not a size: '8X'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- the script, for real


def _bin(tmp_path: Path, gpus: int = 8) -> Path:
    """A PATH with the few tools the script uses, a fake nvidia-smi that prints the real
    `GPU n: NAME (UUID: ...)` lines of an 8-GPU V100 capture, and nothing else."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "grep", "date", "sleep", "timeout", "cat"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    gpu_lines = [line for line in (CORPUS / "nvlink" / "v100-sxm2-8gpu-nvlink-gt-d-throughput-kib.txt")
                 .read_text().splitlines() if line.startswith("GPU ")][:gpus]
    (tmp_path / "smi-L.txt").write_text("\n".join(gpu_lines) + "\n")
    _script(bin_dir / "nvidia-smi", f'cat "{tmp_path}/smi-L.txt"')
    return bin_dir


def _script(path: Path, body: str) -> None:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def _run_probe(bin_dir: Path, opts: NcclOptions) -> subprocess.CompletedProcess:
    probe = with_options(opts)
    return subprocess.run(probe.argv, check=False, capture_output=True, text=True, env={"PATH": str(bin_dir)}, timeout=20)


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")  # a zombie waits for its reaper, it runs no more


def test_probe_script_repeats_marks_and_times_out_a_hung_run(tmp_path):
    bin_dir = _bin(tmp_path)
    # tests_dir holds shell metacharacters: it must reach the script as data, never as code.
    tests_dir = tmp_path / "nccl tests; touch PWNED"
    tests_dir.mkdir()
    (tmp_path / "run.txt").write_text(H200_1GPU)
    (tmp_path / "partial.txt").write_text(truncated(H200_1GPU, 4))
    # The fake all_reduce_perf prints the real H200 run; on its 2nd call it prints 4 rows, then
    # hangs in a child `sleep` (whose pid it records) until timeout kills the group.
    _script(tests_dir / "all_reduce_perf", f"""
cd "{tmp_path}"; n=$(cat count 2>/dev/null || echo 0); n=$((n + 1)); echo $n > count
echo "args: $*" >&2
if [ $n = 2 ]; then cat partial.txt; sleep 30 & echo $! > sleeper; wait; fi
cat run.txt""")
    proc = _run_probe(bin_dir, NcclOptions(reps=3, max_bytes=1 << 20, timeout_s=0.3, tests_dir=str(tests_dir),
                                           cooldown_s=0))
    assert proc.returncode == 0, proc.stderr
    markers = re.findall(r"(?m)^# preflight: repetition (\d) exit=(\d+) seconds=\d+$", proc.stdout)
    assert markers == [("1", "0"), ("2", "124"), ("3", "0")]
    assert proc.stdout.startswith(f"# preflight: tool={tests_dir}/all_reduce_perf gpus=8 repetitions=3\n")
    assert proc.stdout.count("args: -b 8 -e 1048576 -f 2 -g 8 -c 1 -n 20\n") == 3  # stderr merged
    assert _gone(int((tmp_path / "sleeper").read_text()))
    assert not list(tmp_path.rglob("PWNED"))
    out = parse_probe_output(proc.stdout)
    assert [(r.exit_code, len(r.runs[0].rows), r.runs[0].complete) for r in out.repetitions] == \
        [(0, 15, True), (124, 4, False), (0, 15, True)]
    f = judge(proc.stdout, "hgx-h200")
    assert f.status is Status.FAIL and f.symptoms == ("nccl-hang", "nccl-unstable")


def test_probe_script_falls_back_to_torch_then_to_127(tmp_path):
    bin_dir = _bin(tmp_path, gpus=2)
    # A python3 that "has torch" and, run as the fallback, shows the arguments it was given.
    _script(bin_dir / "python3", 'case "$2" in "import torch") exit 0;; esac\n'
            '[ "$1 $2" = "-u -c" ] && [ -n "$3" ] && shift 3 && echo "fallback $*"')
    proc = _run_probe(bin_dir, NcclOptions(reps=1, max_bytes=4096, timeout_s=5, cooldown_s=0))
    assert proc.stdout.splitlines() == ["# preflight: tool=torch-fallback gpus=2 repetitions=1",
                                        "fallback -b 8 -e 4096 -f 2 -g 2 -c 1 -n 20",
                                        "# preflight: repetition 1 exit=0 seconds=0"]
    (bin_dir / "python3").unlink()
    proc = _run_probe(bin_dir, NcclOptions(reps=1, timeout_s=5))
    assert proc.returncode == 127 and proc.stdout == ""
    assert proc.stderr == "all_reduce_perf not found (in PATH) and python3 cannot import torch\n"
    (bin_dir / "nvidia-smi").unlink()
    assert _run_probe(bin_dir, NcclOptions(reps=1, timeout_s=5)).returncode == 127


def test_probe_script_waits_for_a_hung_nvidia_smi_only_as_long_as_the_runs_timeout(tmp_path):
    """Issue 26: the script's `nvidia-smi -L` ran under a fixed 60 s limit whatever --timeout was."""
    bin_dir = _bin(tmp_path)
    _script(bin_dir / "nvidia-smi", "sleep 30")
    started = time.monotonic()
    proc = _run_probe(bin_dir, NcclOptions(reps=1, timeout_s=5, setup_timeout_s=1))
    assert time.monotonic() - started < 5
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == "nvidia-smi -L did not answer within 1 s: cannot count the GPUs\n"


# ------------------------------------------------------------ no result is not a hang (issue 15)

V100_CUT = (CORPUS / "nccl-tests" / "allreduce-2node-v100-not-built-with-mpi-duplicate-headers.txt").read_text()


def test_output_ending_after_the_device_list_with_exit_0_is_incomplete_not_a_hang():
    # The real capture ends after the device list; the probe recorded exit 0 and no timeout.
    f = judge(result(PROBE_ID, V100_CUT, exit_code=0, timed_out=False), "generic")
    assert (f.status, f.symptoms) == (Status.ERROR, ("nccl-incomplete",))
    assert "not a hang" in f.summary and "no timeout was recorded" in f.summary
    assert f.evidence[0].excerpt.splitlines()[-1].startswith("#       size")
    [d] = diagnose([f], load_knowledge())
    assert d.cause == "nccl-incomplete"


def test_the_same_output_cut_by_the_probes_limit_is_a_hang():
    f = judge(result(PROBE_ID, V100_CUT, exit_code=None, timed_out=True), "generic")
    assert (f.status, f.symptoms) == (Status.FAIL, ("nccl-hang",))
    assert "still running when the probe's own timeout stopped it" in f.summary


def test_a_marked_repetition_that_exited_0_without_a_table_is_incomplete_and_not_intermittent():
    # Two real A100 runs closed by exit=0, and a third that printed only the V100 capture's
    # header and device list before its exit=0 marker.
    f = judge(probe_output([(A100, 0, 30), (A100, 0, 30), (V100_CUT, 0, 2)]))
    assert (f.status, f.symptoms) == (Status.ERROR, ("nccl-incomplete",))
    assert "1 of 3 repetitions ended without their results (#3: exited 0 without a results table" in f.summary
    assert "intermittent" not in f.summary
