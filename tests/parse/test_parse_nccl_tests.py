"""nccl-tests text/JSON parsing and NCCL log signatures, on the recorded corpus outputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from preflight.parse import ParseError
from preflight.parse.nccl_signatures import nccl_signatures
from preflight.parse.nccl_tests import (
    bus_bandwidth_factor,
    largest_row,
    parse_nccl_tests,
)
from preflight.parse.nccl_tests_json import parse_nccl_json

CORPUS = Path(__file__).parents[1] / "fixtures" / "corpus"
NOT_MPI_NOTE = "nccl-tests not built with MPI: ranks ran as independent jobs"
FOOTER_NOTE = "run stopped before its 'Avg bus bandwidth' footer"


def nccl(name: str) -> str:
    return (CORPUS / "nccl-tests" / name).read_text()


def h200(name: str) -> str:
    return (CORPUS / "h200-vm" / name).read_text()


def only_run(text: str):
    output = parse_nccl_tests(text)
    assert len(output.runs) == 1
    return output.runs[0]


# --------------------------------------------------------------------------- text tables


def test_old_layout_allreduce_with_info_line_inside_table():
    run = only_run(nccl("a100-sxm4-40gb-8gpu-allreduce-old-format-validation0.txt"))
    assert run.complete and run.nranks == 8 and run.validation is False
    assert (run.nthreads, run.ngpus, run.min_bytes, run.max_bytes, run.iters) == (
        1,
        8,
        1,
        8589934592,
        20,
    )
    assert [d.rank for d in run.devices] == list(range(8))
    assert {(d.name, d.bus_id, d.group, d.host) for d in run.devices} == {
        ("A100-SXM4-40GB", "0x00", None, "localhost")
    }
    # "NCCL INFO Launch mode Parallel" sits between the header and the first row.
    assert len(run.rows) == 34 and [r.size_bytes for r in run.rows[:3]] == [0, 0, 4]
    big = largest_row(run)
    assert big.size_bytes == 8589934592 and big.root is None and big.redop == "sum"
    assert (big.out_of_place.algbw, big.out_of_place.busbw, big.in_place.busbw) == (
        134.44,
        235.26,
        235.03,
    )
    assert big.out_of_place.time_us == 63896.0
    # validation: 0 prints N/A in the old "error" column.
    assert big.out_of_place.wrong is None and big.out_of_place.max_error is None
    assert run.avg_busbw == 68.4048 and run.out_of_bounds == 0
    assert big.out_of_place.busbw == pytest.approx(
        big.out_of_place.algbw * bus_bandwidth_factor("all_reduce", 8), abs=0.01
    )
    assert nccl_signatures(nccl("a100-sxm4-40gb-8gpu-allreduce-old-format-validation0.txt")) == ()


def test_old_layout_alltoall_with_empty_redop_cells():
    run = only_run(nccl("a100-sxm4-40gb-8gpu-alltoall-old-format-empty-redop.txt"))
    assert (
        len(run.rows) == 34
        and {r.redop for r in run.rows} == {""}
        and {r.type for r in run.rows} == {"float"}
    )
    assert run.rows[5].size_bytes == 32 and run.rows[5].out_of_place.time_us == 89.00
    big = largest_row(run)
    assert (big.count, big.out_of_place.algbw, big.out_of_place.busbw, big.in_place.time_us) == (
        268435456,
        256.36,
        224.31,
        33234.0,
    )
    assert big.out_of_place.busbw == pytest.approx(
        big.out_of_place.algbw * bus_bandwidth_factor("alltoall", 8), abs=0.01
    )
    assert run.avg_busbw == 58.6481 and run.complete


def test_old_build_float_error_column_and_cut_table():
    output = parse_nccl_tests(nccl("allreduce-128gpu-old-format-error-column-float-1e-06.txt"))
    run = output.runs[0]
    assert len(output.runs) == 1 and len(run.rows) == 6
    assert {
        (r.out_of_place.max_error, r.in_place.max_error, r.in_place.wrong) for r in run.rows
    } == {(1e-06, 1e-06, None)}
    assert run.rows[-1].size_bytes == 131072 and run.rows[-1].in_place.busbw == 2.22
    # The excerpt ends inside the table: no footer, and no device lines to count ranks from.
    assert not run.complete and run.avg_busbw is None and run.nranks is None
    assert any(FOOTER_NOTE in note for note in output.notes)


def test_binary_without_mpi_prints_one_header_per_rank():
    output = parse_nccl_tests(nccl("allreduce-2node-v100-not-built-with-mpi-duplicate-headers.txt"))
    assert len(output.runs) == 1
    run = output.runs[0]
    assert run.independent_ranks
    assert f"run 1: {NOT_MPI_NOTE}" in output.notes and NOT_MPI_NOTE in run.notes
    assert [(d.rank, d.host, d.pid) for d in run.devices] == [
        (0, "ip-172-31-20-228", 1320),
        (0, "ip-172-31-22-230", 2066),
    ]
    assert (
        run.nranks == 1 and run.min_bytes == run.max_bytes == 1310720000 and run.validation is True
    )
    assert run.rows == () and largest_row(run) is None and not run.complete


def test_single_gpu_alltoall_absurd_algbw_and_na_in_place():
    output = parse_nccl_tests(nccl("alltoall-1gpu-rtx5090-inplace-na-absurd-algbw.txt"))
    (run,) = output.runs
    (row,) = run.rows
    assert run.nranks == 1 and run.devices[0].name == "NVIDIA GeForce RTX 5090"
    assert (run.devices[0].group, run.devices[0].host, run.devices[0].bus_id) == (
        0,
        "GENOA-01",
        "0x01",
    )
    assert (row.redop, row.root, row.out_of_place.wrong, row.in_place.wrong) == (
        "none",
        -1,
        0,
        None,
    )
    assert (row.out_of_place.algbw, row.in_place.algbw, row.in_place.busbw) == (
        1715.44,
        43046.10,
        0.0,
    )
    assert run.avg_busbw == 0.0 and run.complete
    assert any(note.startswith("run 1: single rank") and "43046.1" in note for note in output.notes)


def test_indented_excerpt_starting_with_nccl_info_and_na_wrong():
    run = only_run(nccl("gcp-a3-high-h100-multinode-allgather-tcpx-wrong-na.txt"))
    assert len(run.rows) == 10 and run.rows[0].size_bytes == 1048576
    assert {r.out_of_place.wrong for r in run.rows} == {None} and {r.root for r in run.rows} == {-1}
    big = largest_row(run)
    assert (big.size_bytes, big.out_of_place.busbw, big.in_place.busbw) == (536870912, 70.90, 71.35)
    assert (
        run.avg_busbw == 30.9622 and run.complete and run.nranks is None and run.collective is None
    )


def test_indented_allgather_with_double_space_wrong_header():
    run = only_run(nccl("gcp-a3-mega-h100-2node-allgather-tcpxo-indented.txt"))
    assert len(run.rows) == 31 and {r.in_place.wrong for r in run.rows} == {0}
    big = largest_row(run)
    assert (
        big.size_bytes,
        big.out_of_place.time_us,
        big.out_of_place.busbw,
        big.in_place.busbw,
    ) == (
        8589934592,
        42668.7,
        188.73,
        188.90,
    )
    assert run.avg_busbw == 53.8932 and run.out_of_bounds == 0


def test_healthy_h200_roce_allgather_matches_sixteen_rank_factor():
    run = only_run(nccl("gcp-a3-ultra-h200-2node-allgather-rdma-healthy.txt"))
    assert len(run.rows) == 24 and run.rows[0].size_bytes == 1024
    big = largest_row(run)
    assert (big.out_of_place.algbw, big.out_of_place.busbw, big.in_place.busbw) == (
        350.77,
        328.85,
        335.67,
    )
    # 2 nodes x 8 GPUs: the busbw printed is algbw x 15/16.
    assert big.out_of_place.busbw == pytest.approx(
        big.out_of_place.algbw * bus_bandwidth_factor("all_gather", 16), abs=0.01
    )
    assert run.avg_busbw == 120.248


def test_cross_socket_pair_low_busbw():
    run = only_run(nccl("v100-2gpu-cross-socket-allreduce-32mb-low-busbw.txt"))
    assert [(d.rank, d.bus_id) for d in run.devices] == [(0, "0x06"), (1, "0x89")]
    assert run.nranks == 2 and run.iters == 100 and run.validation is False
    (row,) = run.rows
    assert (row.size_bytes, row.out_of_place.busbw, row.in_place.busbw, row.out_of_place.wrong) == (
        33554432,
        5.63,
        5.75,
        None,
    )
    assert (
        bus_bandwidth_factor("all_reduce", 2) == 1.0
        and row.out_of_place.busbw == row.out_of_place.algbw
    )
    assert run.avg_busbw == 5.68719


def test_l40_excerpt_with_one_device_line_and_bare_nccl_version():
    text = nccl("l40-2node-roce-irdma-nccl-info-init-excerpt.txt")
    run = only_run(text)
    (device,) = run.devices
    assert (device.rank, device.host, device.bus_id, device.name) == (
        1,
        "ai-worker03",
        "0x61",
        "NVIDIA L40",
    )
    assert run.nranks == 2 and run.nccl_version == "2.21.5"
    assert run.rows == () and not run.complete
    assert nccl_signatures(text) == ()


def test_h200_single_gpu_new_header_and_g_format_numbers():
    output = parse_nccl_tests(h200("all_reduce_1gpu.txt"))
    (run,) = output.runs
    assert (run.collective, run.tests_version, run.nccl_version) == (
        "all_reduce",
        "2.19.6",
        "2.28.9",
    )
    assert (run.min_bytes, run.max_bytes, run.validation) == (8, 4294967296, True)
    assert run.devices[0].bus_id == "0000:00:06" and run.devices[0].name == "NVIDIA H200"
    assert len(run.rows) == 15 and {r.in_place.wrong for r in run.rows} == {0}
    big = largest_row(run)
    # "2e+06": the in-place algbw outgrew its 6-character column.
    assert (big.size_bytes, big.out_of_place.algbw, big.in_place.algbw, big.in_place.busbw) == (
        2147483648,
        2145.9,
        2e6,
        0.0,
    )
    assert run.complete and run.avg_busbw == 0.0 and run.nranks == 1
    assert any("single rank" in note for note in output.notes)


def test_h200_debug_run_with_nccl_info_around_the_table():
    text = h200("all_reduce_1gpu_debug.txt")
    run = only_run(text)
    (row,) = run.rows
    assert (row.size_bytes, row.out_of_place.time_us, row.in_place.algbw) == (
        1073741824,
        505.33,
        5e6,
    )
    assert run.complete and run.nccl_version == "2.28.9" and run.nranks == 1
    (signature,) = nccl_signatures(text)
    assert (signature.symptom, signature.line_number, signature.level, signature.host) == (
        "nccl-no-ib-device",
        13,
        "INFO",
        "vm",
    )


def test_concatenated_runs_are_split_at_their_headers():
    output = parse_nccl_tests(h200("all_reduce_1gpu.txt") + h200("all_reduce_1gpu_debug.txt"))
    assert [len(run.rows) for run in output.runs] == [15, 1]
    assert [run.max_bytes for run in output.runs] == [4294967296, 1073741824]
    assert all(run.complete and not run.independent_ranks for run in output.runs)
    old = parse_nccl_tests(
        nccl("a100-sxm4-40gb-8gpu-allreduce-old-format-validation0.txt")
        + nccl("a100-sxm4-40gb-8gpu-alltoall-old-format-empty-redop.txt")
    )
    assert [(run.avg_busbw, len(run.devices)) for run in old.runs] == [(68.4048, 8), (58.6481, 8)]


def test_run_cut_by_a_hang_then_a_fresh_run():
    # Synthetic: the real A100 capture cut after its 1 MiB row (as a hang would leave it),
    # followed by the real V100 capture.
    lines = nccl("a100-sxm4-40gb-8gpu-allreduce-old-format-validation0.txt").splitlines(
        keepends=True
    )
    cut = next(i for i, line in enumerate(lines) if line.strip().startswith("1048576 "))
    output = parse_nccl_tests(
        "".join(lines[: cut + 1]) + nccl("v100-2gpu-cross-socket-allreduce-32mb-low-busbw.txt")
    )
    first, second = output.runs
    assert not first.complete and largest_row(first).size_bytes == 1048576 and len(first.rows) == 21
    assert second.complete and second.nranks == 2 and second.avg_busbw == 5.68719
    assert f"run 1: {FOOTER_NOTE} (hang, crash or cut capture)" in output.notes


def test_mpirun_tag_output_prefix():
    # Synthetic: the real V100 capture with the "[1,0]<stdout>:" tag mpirun --tag-output adds.
    text = nccl("v100-2gpu-cross-socket-allreduce-32mb-low-busbw.txt")
    tagged = "".join(f"[1,0]<stdout>:{line}" for line in text.splitlines(keepends=True))
    assert parse_nccl_tests(tagged) == parse_nccl_tests(text)


def test_failure_lines_are_kept_as_errors():
    # The real RTX 5090 header of nccl-tests#287 followed by the failure its 2-GPU run printed
    # in the same issue (quoted from NVIDIA/nccl-tests#287).
    header = "".join(
        nccl("alltoall-1gpu-rtx5090-inplace-na-absurd-algbw.txt").splitlines(keepends=True)[:8]
    )
    nccl_failure = (
        "GENOA-06: Test NCCL failure common.cu:392 "
        "'unhandled cuda error (run with NCCL_DEBUG=INFO for details) / '"
    )
    test_failure = ".. GENOA-06 pid 5068: Test failure common.cu:590"
    run = only_run(f"{header}{nccl_failure}\n {test_failure}\n")
    assert run.errors == (nccl_failure, test_failure)
    assert run.rows == () and not run.complete


def test_nccl_log_without_a_table_gives_no_runs():
    output = parse_nccl_tests(nccl("roce-nccl-info-gpu-direct-rdma-disabled-for-hca.txt"))
    assert output.runs == ()
    assert output.notes == ("no nccl-tests header or results table found (NCCL log lines only)",)


@pytest.mark.parametrize(
    "text",
    ["", "  \n", "bash: all_reduce_perf: command not found\n", '{"version": 3}'],
)
def test_not_nccl_tests_text(text):
    with pytest.raises(ParseError):
        parse_nccl_tests(text)


# --------------------------------------------------------------------------- JSON


def test_json_report():
    output = parse_nccl_json(h200("all_reduce.json"))
    (run,) = output.runs
    assert (run.collective, run.nccl_version, run.tests_version) == ("all_reduce", "2.28.9", None)
    assert (run.min_bytes, run.max_bytes, run.iters, run.validation, run.nthreads, run.ngpus) == (
        67108864,
        1073741824,
        20,
        True,
        1,
        1,
    )
    assert [(d.rank, d.group, d.pid, d.host, d.bus_id, d.name) for d in run.devices] == [
        (0, 0, 1209, "vm", "0000:00:06", "NVIDIA H200")
    ]
    assert [r.size_bytes for r in run.rows] == [2**26, 2**27, 2**28, 2**29, 2**30]
    first = run.rows[0]
    assert (first.count, first.type, first.redop, first.root) == (16777216, "float", "sum", -1)
    assert (first.out_of_place.time_us, first.out_of_place.algbw, first.out_of_place.wrong) == (
        34.56015,
        1941.798979,
        0,
    )
    assert largest_row(run).in_place.algbw == 2674992.087693
    assert run.complete and run.avg_busbw == 0.0 and run.out_of_bounds == 0 and run.errors == ()
    assert run.nranks == 1 and any("single rank" in note for note in output.notes)


def test_json_cut_between_results():
    # Synthetic: the real report cut where its 4th result starts, as a killed run leaves it.
    text = h200("all_reduce.json")
    output = parse_nccl_json(text[: text.index('"size": 536870912')])
    (run,) = output.runs
    assert [r.size_bytes for r in run.rows] == [2**26, 2**27, 2**28]
    assert not run.complete and run.avg_busbw is None
    assert "JSON report is truncated: read up to its last complete value" in output.notes


def test_json_cut_inside_a_result():
    # Synthetic: the real report cut inside the in_place object of its 4th result.
    text = h200("all_reduce.json")
    output = parse_nccl_json(text[: text.index('"alg_bw": 1581357.620029')])
    assert len(output.runs[0].rows) == 3
    assert "run 1: results[3]: incomplete result record skipped" in output.notes


@pytest.mark.parametrize("text", ["", "# nThread 1 nGpus 1\n", "{}", "[1, 2]"])
def test_not_a_json_report(text):
    with pytest.raises(ParseError):
        parse_nccl_json(text)


# --------------------------------------------------------------------------- signatures


def test_ib_retry_exceeded_wrapped_warn():
    (signature,) = nccl_signatures(nccl("azure-ib-error12-retry-exceeded-nccl-warn.txt"))
    assert (signature.symptom, signature.line_number, signature.level, signature.host) == (
        "nccl-ib-retry-exceeded",
        1,
        "WARN",
        "node-2",
    )
    assert signature.line.endswith("with error 12, opcode 0, len")


def test_ib_completion_status_formats():
    line = nccl("azure-ib-error12-retry-exceeded-nccl-warn.txt").splitlines()[0]
    # Synthetic: the same WARN in the status=NAME(N) form of newer NCCL (net_ib/p2p.cc).
    newer = line.replace(
        "with error 12, opcode 0, len", "with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_SEND(0)"
    )
    # Synthetic: the real line with the status changed to 13 (RNR retry exceeded).
    rnr = line.replace("error 12", "error 13")
    assert [s.symptom for s in nccl_signatures(newer + "\n" + rnr)] == [
        "nccl-ib-retry-exceeded",
        "nccl-ib-completion-error",
    ]


def test_libibverbs_missing_only_flags_the_warn():
    signatures = nccl_signatures(nccl("hgx-a100-nccl-info-libibverbs-missing-socket-fallback.txt"))
    assert [(s.symptom, s.line_number, s.level, s.host) for s in signatures] == [
        ("nccl-no-ibverbs", 3, "WARN", "node2")
    ]


def test_timestamped_nccl_2_27_warn():
    (signature,) = nccl_signatures(
        nccl("hgx-nccl2.27-ibv-modify-qp-110-timeout-init-rtr-timestamped.txt")
    )
    assert signature.symptom == "nccl-ib-qp-timeout"
    assert (signature.timestamp, signature.host, signature.level) == (
        "2026-03-13 22:26:02",
        "host-01.example.com",
        "WARN",
    )
    assert "curr state INIT, next state RTR" in signature.line


def test_socket_connect_refused():
    (signature,) = nccl_signatures(nccl("jean-zay-nccl-warn-socket-connect-refused.txt"))
    assert (signature.symptom, signature.host, signature.timestamp) == (
        "nccl-socket-refused",
        "r11i6n2",
        None,
    )


def test_gdr_disabled_per_hca():
    signatures = nccl_signatures(nccl("roce-nccl-info-gpu-direct-rdma-disabled-for-hca.txt"))
    assert [(s.symptom, s.line_number, s.level) for s in signatures] == [
        ("nccl-gdr-disabled", 5, "INFO"),
        ("nccl-gdr-disabled", 6, "INFO"),
    ]
    assert signatures[1].line.endswith("'mlx5_1'")


# --------------------------------------------------------------------------- helpers


@pytest.mark.parametrize(
    ("collective", "nranks", "factor"),
    [
        ("all_reduce", 8, 1.75),
        ("all_reduce_perf", 2, 1.0),
        ("AllReduce", 1, 0.0),
        ("reduce_scatter", 4, 0.75),
        ("alltoall", 8, 0.875),
        ("broadcast", 8, 1.0),
        ("sendrecv", 16, 1.0),
    ],
)
def test_bus_bandwidth_factor(collective, nranks, factor):
    assert bus_bandwidth_factor(collective, nranks) == factor


@pytest.mark.parametrize(("collective", "nranks"), [("all_reduce", 0), ("all_to_everyone", 8)])
def test_bus_bandwidth_factor_rejects(collective, nranks):
    with pytest.raises(ValueError):
        bus_bandwidth_factor(collective, nranks)
