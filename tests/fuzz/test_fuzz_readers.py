"""Property-based fuzzing of the bundle and soak readers: whatever a bundle's or a soak
directory's files hold, the reader returns its record or raises its own error (``BundleError``,
``SoakDataError``: exit 2 with file and field), and a soak it accepts is judged without a crash
into strict JSON. Seeds: examples/h200-fleet's gpu001 and the real five-minute H200 soak of
examples/h200-soak-5min (cut to its first rows, so each example stays fast)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from preflight.evidence.bundle import BundleError, read_bundle
from preflight.model import Status
from preflight.report.json_report import strict
from preflight.soak.analysis import analyze
from preflight.soak.data import SoakDataError, read_soak

ROOT = Path(__file__).resolve().parents[2]
NODE = ROOT / "examples" / "h200-fleet" / "hosts" / "gpu001"
SOAK = ROOT / "examples" / "h200-soak-5min"
EXAMPLES = int(os.environ.get("PREFLIGHT_FUZZ_EXAMPLES", "25"))
FUZZ = settings(max_examples=EXAMPLES, deadline=5000, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
                    max_leaves=10)
META_KEYS = st.sampled_from(["command", "exit_code", "stderr", "started", "duration_s", "timed_out", "error"])
HEADER_KEYS = st.sampled_from(["format", "created", "hosts", "probes", "run_id"])


def _bundle(root: Path, header: dict, meta: dict) -> Path:
    (root / "hosts" / "gpu001").mkdir(parents=True)
    for probe in ("nvidia-smi-q-x", "kernel-log", "ibstat"):
        shutil.copy(NODE / f"{probe}.txt", root / "hosts" / "gpu001")
    (root / "hosts" / "gpu001" / "nvidia-smi-q-x.json").write_text(json.dumps(meta))
    (root / "bundle.json").write_text(json.dumps(header))
    return root


@FUZZ
@given(header=st.dictionaries(HEADER_KEYS, JSON), meta=st.dictionaries(META_KEYS, JSON),
       keep_format=st.booleans())
def test_the_bundle_reader_raises_only_bundle_error(header, meta, keep_format):
    if keep_format:
        header = {**header, "format": "preflight-bundle/1"}
        header.setdefault("hosts", ["gpu001"])
    with tempfile.TemporaryDirectory() as tmp:
        try:
            bundle = read_bundle(_bundle(Path(tmp), header, meta))
        except BundleError:
            return
    assert isinstance(bundle.hosts, tuple) and all(isinstance(h, str) for h in bundle.hosts)
    for result in (r for h in bundle.hosts for r in bundle.probes_of(h).values()):
        assert isinstance(result.timed_out, bool) and isinstance(result.stderr, str)
        assert result.exit_code is None or (isinstance(result.exit_code, int) and not isinstance(result.exit_code, bool))
        assert all(isinstance(a, str) for a in result.command)


def _soak(root: Path, rows: int, cell: tuple[int, int, str] | None, meta_changes: dict) -> Path:
    shutil.copytree(SOAK, root, ignore=shutil.ignore_patterns("*.png", "*.md"))
    lines = (root / "telemetry.csv").read_text().split("\n")[: rows + 1]
    if cell is not None:
        row, column, value = cell
        cells = lines[1 + row % rows].split(",")
        cells[column % len(cells)] = value
        lines[1 + row % rows] = ",".join(cells)
    (root / "telemetry.csv").write_text("\n".join(lines) + "\n")
    meta = json.loads((root / "soak.json").read_text())
    meta.update(meta_changes)
    (root / "soak.json").write_text(json.dumps(meta))
    return root


CELL = st.one_of(st.text(max_size=12), st.floats().map(repr), st.integers().map(str),
                 st.sampled_from(["inf", "-inf", "nan", "1e20", "-0", "0x4", "N/A", "", "\ufeff", "\"", "a,b"]))


@FUZZ
@example(rows=5, cell=None, meta={"engine": "vllm", "hosts": ["vm", "cpu1"], "no_telemetry": ["cpu1"],
                                  "planned_s": None, "agents": None})
@example(rows=5, cell=None, meta={"agents": {"vm": "died"}, "planned_s": float("inf")})
@given(rows=st.integers(3, 40), cell=st.none() | st.tuples(st.integers(0, 100), st.integers(0, 30), CELL),
       meta=st.dictionaries(st.sampled_from(["engine", "started", "hosts", "planned_s", "interval_s", "agents",
                                              "missing", "no_telemetry", "gpus"]), JSON, max_size=3))
def test_the_soak_reader_raises_only_soak_data_error_and_judges_what_it_accepts(rows, cell, meta):
    with tempfile.TemporaryDirectory() as tmp:
        try:
            data = read_soak(_soak(Path(tmp) / "soak", rows, cell, meta))
        except SoakDataError:
            return
        result = analyze(data)
    assert all(isinstance(f.status, Status) for f in result.findings)
    # The built-in soak checks judge whatever the reader accepted; none of them crashes on it.
    assert not [f.summary for f in result.findings if "check-crashed" in f.symptoms]
    json.dumps(strict(result.soak_section()), allow_nan=False)
    json.dumps(strict([f.to_dict() for f in result.findings]), allow_nan=False)
