"""Property-based fuzzing of every parser of ``preflight/parse/``: on any text, a parser returns
its record or raises ``ParseError``, nothing else (a check then says "unreadable output", not
"check crashed"), and what it returns is well-typed.

Inputs are real captures (tests/fixtures, examples/h200-fleet; provenance in their MANIFEST.tsv
and SOURCES.tsv) damaged the ways evidence gets damaged: cut anywhere, a span replaced with
arbitrary text, lines duplicated or dropped, bytes flipped; plus arbitrary text outright.
Bounded (``max_examples``, ``deadline``) so the whole module stays within seconds on 2 cores.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from preflight.parse import ParseError, ibverbs, kernel_log, lspci, mlnx, nvidia_smi, nvlink, topo
from preflight.parse.dcgm import DcgmDiag, parse_dcgmi_diag
from preflight.parse.dcgm_health import DcgmHealth, parse_dcgmi_health
from preflight.parse.ib_counters import CounterSnapshot, parse_ib_counters
from preflight.parse.nccl_probe import NcclProbeOutput, parse_probe_output
from preflight.parse.nccl_tests import NcclOutput, parse_nccl_tests
from preflight.parse.nccl_tests_json import parse_nccl_json
from preflight.parse.smi_text import TextNode, read_sections
from preflight.parse.versions import Version, parse_version

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "fixtures" / "corpus"
RECORDED = ROOT / "tests" / "fixtures" / "recorded"
NODE = ROOT / "examples" / "h200-fleet" / "hosts" / "gpu001"

FUZZ = settings(max_examples=int(os.environ.get("PREFLIGHT_FUZZ_EXAMPLES", "30")), deadline=2000, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _texts(*patterns: str) -> list[str]:
    files = sorted({p for pattern in patterns for p in ROOT.glob(pattern) if p.is_file()})
    assert files, patterns
    return [p.read_text(errors="replace") for p in files]


@st.composite
def damaged(draw, seeds: list[str]) -> str:
    """A real capture, damaged: cut, spliced with arbitrary text, lines shuffled, bytes flipped."""
    text = draw(st.sampled_from(seeds))
    for _ in range(draw(st.integers(1, 3))):
        n = len(text)
        how = draw(st.sampled_from(["cut", "splice", "lines", "flip", "repeat"]))
        a = draw(st.integers(0, n))
        b = draw(st.integers(a, min(n, a + 400)))
        if how == "cut":
            text = text[:a]
        elif how == "splice":
            text = text[:a] + draw(st.text(max_size=60)) + text[b:]
        elif how == "lines":
            lines = text.split("\n")
            i = draw(st.integers(0, max(0, len(lines) - 1)))
            lines[i:i] = draw(st.lists(st.sampled_from(lines), max_size=4))
            text = "\n".join(lines)
        elif how == "flip" and n:
            text = text[:a] + chr(draw(st.integers(0, 0x2FF))) + text[a + 1:]
        else:
            text = text[:a] + text[a:b] * draw(st.integers(2, 4)) + text[b:]
    return text


def _well_typed(value: object, expected: type | tuple[type, ...]) -> None:
    """The record has the parser's type, and every dataclass field below it holds a value
    (no half-built record): walked a few levels deep."""
    assert isinstance(value, expected), type(value)

    def walk(v: object, depth: int) -> None:
        if depth > 4:
            return
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            for f in dataclasses.fields(v):
                walk(getattr(v, f.name), depth + 1)
        elif isinstance(v, (tuple, list)):
            for item in v[:50]:
                walk(item, depth + 1)
        elif isinstance(v, float):
            assert v == v or True  # NaN may mean "not reported"; it is still a float

    walk(value, 0)


def _only_parse_error(parse: Callable[[str], object], text: str, expected) -> None:
    try:
        result = parse(text)
    except ParseError:
        return
    _well_typed(result, expected)


def _tuple_of(kind):
    class _Check(type):
        def __instancecheck__(cls, value):
            return isinstance(value, tuple) and all(isinstance(v, kind) for v in value)

    return _Check("TupleOf", (), {})


# parser, what it returns, the real captures its inputs are made from
PARSERS = {
    "smi_xml": (nvidia_smi.parse_smi_xml, nvidia_smi.SmiReport,
                ["tests/fixtures/corpus/h200-vm/smi-q.xml", "examples/h200-fleet/hosts/gpu00[15]/nvidia-smi-q-x.txt"]),
    "smi_text": (nvidia_smi.parse_smi_text, nvidia_smi.SmiReport,
                 ["tests/fixtures/corpus/h200-vm/smi-q.txt", "tests/fixtures/corpus/smi-q/*.txt"]),
    "smi_sections": (read_sections, TextNode, ["tests/fixtures/corpus/h200-vm/smi-q.txt"]),
    "topo": (topo.parse_topo, topo.TopoMatrix, ["tests/fixtures/corpus/topo/*.txt", "tests/fixtures/corpus/h200-vm/topo.txt"]),
    "nvlink_status": (nvlink.parse_nvlink_status, nvlink.NvlinkStatus, ["tests/fixtures/corpus/nvlink/*-s*.txt"]),
    "nvlink_errors": (nvlink.parse_nvlink_errors, nvlink.NvlinkErrors,
                      ["tests/fixtures/corpus/nvlink/*-e-*.txt", "examples/h200-fleet/hosts/gpu001/nvidia-smi-nvlink-errors.txt"]),
    "ibv_devinfo": (ibverbs.parse_ibv_devinfo, ibverbs.IbInventory,
                    ["tests/fixtures/corpus/ibv/ibv-devinfo-*.txt", "tests/fixtures/recorded/ibv-devinfo-*.txt"]),
    "ibstat": (ibverbs.parse_ibstat, ibverbs.IbInventory, ["tests/fixtures/corpus/ibv/ibstat-*.txt"]),
    "ibstatus": (ibverbs.parse_ibstatus, ibverbs.IbInventory, ["tests/fixtures/corpus/ibv/ibstatus-*.txt"]),
    "ib_sysfs": (ibverbs.parse_ib_sysfs, ibverbs.IbInventory, ["examples/h200-fleet/hosts/gpu00*/ib-sysfs.txt"]),
    "kernel_log": (kernel_log.parse_kernel_log, kernel_log.KernelLog,
                   ["tests/fixtures/corpus/kernel-log/*.txt", "examples/h200-fleet/hosts/gpu002/kernel-log.txt"]),
    "lspci": (lspci.parse_lspci, _tuple_of(lspci.PciDevice), ["tests/fixtures/corpus/lspci/*.txt"]),
    "ethtool_i": (mlnx.parse_ethtool_i, _tuple_of(mlnx.EthtoolInfo),
                  ["tests/fixtures/corpus/driver/ethtool-*.txt", "tests/fixtures/recorded/ethtool-*.txt"]),
    "modinfo": (mlnx.parse_modinfo, mlnx.ModInfo, ["tests/fixtures/recorded/modinfo-*.txt"]),
    "ofed_info": (mlnx.parse_ofed_info, mlnx.OfedInfo, ["tests/fixtures/recorded/ofed-info-*.txt"]),
    "mlxfwmanager": (mlnx.parse_mlxfwmanager, mlnx.FirmwareQuery,
                     ["tests/fixtures/recorded/mlxfwmanager-*.txt", "tests/fixtures/recorded/mlxup-*.txt",
                      "tests/fixtures/corpus/mlxfw/*.txt"]),
    "nccl_tests": (parse_nccl_tests, NcclOutput, ["tests/fixtures/corpus/nccl-tests/*.txt"]),
    "nccl_json": (parse_nccl_json, NcclOutput, ["tests/fixtures/corpus/h200-vm/all_reduce.json"]),
    "nccl_probe": (parse_probe_output, NcclProbeOutput,
                   ["tests/fixtures/h200-device/probe-*.txt", "examples/h200-fleet/hosts/gpu00[12]/nccl-all-reduce.txt"]),
    "version": (parse_version, (Version, type(None)), ["examples/h200-fleet/hosts/gpu001/ofed-info.txt"]),
    "dcgm_diag": (parse_dcgmi_diag, DcgmDiag, ["tests/fixtures/corpus/dcgm/*diag*"]),
    # The real health reports only (the Failure/Warning one in recorded/ is constructed).
    "dcgm_health": (parse_dcgmi_health, DcgmHealth, ["tests/fixtures/recorded/dcgmi-health-*dcgm-263.txt"]),
    "ib_counters": (parse_ib_counters, CounterSnapshot, ["tests/fixtures/corpus/ibcounters/*.txt"]),
}


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_a_parser_raises_only_its_parse_error_on_damaged_captures(name):
    parse, expected, patterns = PARSERS[name]
    seeds = _texts(*patterns)

    @FUZZ
    @given(damaged(seeds))
    def fuzz(text):
        _only_parse_error(parse, text, expected)

    fuzz()


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_a_parser_raises_only_its_parse_error_on_arbitrary_text(name):
    parse, expected, _ = PARSERS[name]

    @FUZZ
    @given(st.text(max_size=300) | st.binary(max_size=300).map(lambda b: b.decode("utf-8", "replace")))
    def fuzz(text):
        _only_parse_error(parse, text, expected)

    fuzz()


# What the fuzzing found, kept as plain examples so they stay covered whatever hypothesis draws.
FOUND = [
    ("ibv_devinfo", "hca_id: mlx5_0\n        phys_port_cnt:09b8\n"),  # int("09", 0) raised ValueError
    ("mlxfwmanager", "<0"),  # the XML pull parser raised ET.ParseError while its events were read
    ("ibv_devinfo", "hca_id: mlx5_0\n        phys_port_cnt: " + "9" * 5000 + "\n"),  # int() digit limit
    # "[\d.]+" numbers: float(".") and float("26.26.562") raised ValueError
    ("ibstatus", "Infiniband device 'mlx5_0' port 1 status:\n        state:  4: ACTIVE\n        rate:.  100 Gb/sec\n"),
    ("nvlink_status", "GPU 0: NVIDIA H200 (UUID: GPU-0)\n\t Link 0: 26.26.562 GB/s\n\t Link 1: 26.562 GB/s\n"),
    ("lspci", "01:00.0 3D controller: NVIDIA\n\tLnkCap: Port #0, Speed 3.2.0GT/s, Width x16\n"),
]


@pytest.mark.parametrize(("name", "text"), FOUND, ids=[f"{n}-{i}" for i, (n, _) in enumerate(FOUND)])
def test_what_the_fuzzing_found(name, text):
    parse, expected, _ = PARSERS[name]
    _only_parse_error(parse, text, expected)
