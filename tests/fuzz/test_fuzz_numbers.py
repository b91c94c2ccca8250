"""Property tests of the numbers in real captures: every numeric field of every parser, and the
checks built on them, given numerals no tool prints.

A real capture (the seeds of ``test_fuzz_parsers.PARSERS``) has one to three of its numbers
replaced by a hostile numeral: another script's digits, for which ``str.isdigit()`` is true while
``int()`` reads a number nobody printed ('٣' -> 3, '３' -> 3) or refuses it ('²', '½'); NaN and
infinity, which ``float()`` accepts; a number past float range; thousands of digits; a sign or
base prefix where a count belongs. Properties:

- a parser returns its record or raises ``ParseError``, and every float in the record is finite
  (a NaN compares false with every threshold, so it would pass any check);
- a check reading that evidence never crashes (no ``check-crashed`` finding): it judges, or says
  the evidence is unreadable.

Found by these (kept as plain examples below): '²' in ``nvidia-smi nvlink -e`` crashed
nvlink-errors (ValueError from ``int()``), '٣' there was read as 3; NaN and infinity in
all_reduce's ``#wrong`` column crashed nccl-all-reduce (``int(float('nan'))``).
"""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
from ctx import make_host, run_check
from hypothesis import given
from hypothesis import strategies as st
from test_fuzz_parsers import FUZZ, PARSERS, _texts

from preflight.collect.probes import IB_COUNTERS
from preflight.parse import ParseError

HOSTILE = ["٣", "٠", "३", "３", "²", "½", "⑦", "nan", "NaN", "-nan", "inf", "-inf", "Infinity", "1e309",
           "9" * 400, "-1", "0x1F", "1_000", "+7", "1e3"]
_NUMBER = re.compile(r"(?<![\w.])[0-9]+(?:\.[0-9]+)?(?![\w])")


@st.composite
def numbers_damaged(draw, seeds: list[str]) -> str:
    """A real capture with 1-3 of its numbers replaced by hostile numerals."""
    text = draw(st.sampled_from(seeds))
    spans = [m.span() for m in _NUMBER.finditer(text)]
    if not spans:
        return text
    for start, end in sorted(draw(st.lists(st.sampled_from(spans), min_size=1, max_size=3, unique=True)),
                             reverse=True):
        text = text[:start] + draw(st.sampled_from(HOSTILE)) + text[end:]
    return text


def _finite(value: object, path: str = "record", depth: int = 0) -> None:
    if depth > 6:
        return
    if isinstance(value, float):
        assert math.isfinite(value), f"{path} = {value!r}"
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            _finite(getattr(value, f.name), f"{path}.{f.name}", depth + 1)
    elif isinstance(value, (tuple, list, frozenset, set)):
        for i, item in enumerate(list(value)[:60]):
            _finite(item, f"{path}[{i}]", depth + 1)
    elif isinstance(value, dict):
        for k, item in list(value.items())[:60]:
            _finite(item, f"{path}[{k!r}]", depth + 1)


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_a_parser_given_hostile_numerals_raises_only_parse_error_and_keeps_floats_finite(name):
    parse, expected, patterns = PARSERS[name]
    seeds = _texts(*patterns)

    @FUZZ
    @given(numbers_damaged(seeds))
    def fuzz(text):
        try:
            record = parse(text)
        except ParseError:
            return
        assert isinstance(record, expected), type(record)
        _finite(record)

    fuzz()


# check -> (probe it reads, the parser whose captures make its input, profile)
CHECKS = {
    "nvlink-errors": ("nvidia-smi-nvlink-errors", "nvlink_errors", "generic"),
    "nvlink": ("nvidia-smi-nvlink-status", "nvlink_status", "hgx-h200"),
    "nccl-all-reduce": ("nccl-all-reduce", "nccl_probe", "hgx-h200"),
    "gpu-memory": ("nvidia-smi-q-x", "smi_xml", "hgx-h200"),
    "pcie-link": ("nvidia-smi-q", "smi_text", "hgx-h200"),
    "clock-events": ("nvidia-smi-q-x", "smi_xml", "hgx-h200"),
    "gpu-inventory": ("nvidia-smi-q", "smi_text", "hgx-h200"),
    "gpu-reset": ("nvidia-smi-q-x", "smi_xml", "hgx-h200"),
    "ib-port-down": ("ibv-devinfo", "ibv_devinfo", "hgx-h200"),
    "ib-link-degraded": ("ibstat", "ibstat", "hgx-h200"),
    "nic-fw-inconsistent": ("ibstat", "ibstat", "hgx-h200"),
    "xid": ("kernel-log", "kernel_log", "generic"),
    "mlx5-kernel-log": ("kernel-log", "kernel_log", "generic"),
    "pcie-errors": ("kernel-log", "kernel_log", "generic"),
    "gpu-nic-affinity": ("nvidia-smi-topo", "topo", "hgx-h200"),
    "dcgm-diag": ("dcgmi-diag", "dcgm_diag", "generic"),
    "ib-counters": (IB_COUNTERS, "ib_counters", "hgx-h200"),
}


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_a_check_given_hostile_numerals_judges_or_says_unreadable_never_crashes(check):
    probe, parser, profile = CHECKS[check]
    seeds = _texts(*PARSERS[parser][2])

    @FUZZ
    @given(numbers_damaged(seeds))
    def fuzz(text):
        for f in run_check(check, make_host({probe: text}, profile)):
            assert "check-crashed" not in f.symptoms, f.summary

    fuzz()


# What these properties found, kept as plain examples whatever hypothesis draws.
_NVLINK_E = "tests/fixtures/corpus/nvlink/h100-nvlink-e-error-counters-zero-excerpt.txt"
_ALL_REDUCE = "examples/h200-fleet/hosts/gpu001/nccl-all-reduce.txt"
_ROW = "  8589934592    2147483648     float     sum      -1    31647  271.44  475.00       0    31678  271.16  474.54       0"


@pytest.mark.parametrize("digit", ["٣", "²", "３"])
def test_a_unicode_digit_in_nvlink_e_is_an_unreadable_counter_not_a_count_nor_a_crash(digit):
    [text] = _texts(_NVLINK_E)
    [f] = run_check("nvlink-errors", make_host({"nvidia-smi-nvlink-errors": text.replace(
        "Replay Errors: 0", f"Replay Errors: {digit}", 1)}))
    assert f.status.value == "warn" and f.symptoms == ("probe-unreadable",), f.summary
    assert f"unreadable counter 'Replay Errors: {digit}'" in f.summary


@pytest.mark.parametrize("wrong", ["nan", "inf", "-inf", "1e309", "٣"])
def test_a_non_finite_wrong_count_in_all_reduce_is_unreadable_not_a_crash_nor_a_pass(wrong):
    [text] = _texts(_ALL_REDUCE)
    assert _ROW in text
    [f] = run_check("nccl-all-reduce", make_host({"nccl-all-reduce": text.replace(_ROW, _ROW[:-1] + wrong, 1)},
                                                 "hgx-h200"))
    assert f.status.value == "error" and "probe-unreadable" in f.symptoms, f.summary
    assert "result row(s) could not be read" in f.summary
