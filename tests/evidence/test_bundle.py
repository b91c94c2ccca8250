import json

import pytest

from preflight.evidence.bundle import FORMAT, BundleError, BundleWriter, read_bundle
from preflight.model import ProbeResult


def _result(probe, stdout, **kw):
    base = dict(probe=probe, host="gpu01", command=("nvidia-smi", "-q"), stdout=stdout, stderr="",
                exit_code=0, started="2026-11-29T10:00:00+00:00", duration_s=0.5)
    base.update(kw)
    return ProbeResult(**base)


def test_round_trip_is_byte_for_byte(tmp_path):
    raw = b"\x1b[4mGPU0\x1b[0m\t\xff not utf-8\r\n"
    w = BundleWriter(tmp_path / "b", ["gpu01", "gpu02"], "2026-11-29T10:00:00+00:00")
    w.add(_result("nvidia-smi-topo", raw))
    w.add(_result("ibstat", b"", exit_code=127, stderr="sh: ibstat: not found"))
    w.add(_result("lspci", b"partial", exit_code=None, timed_out=True))
    header = json.loads((tmp_path / "b" / "bundle.json").read_text())
    assert header["format"] == FORMAT and header["hosts"] == ["gpu01", "gpu02"]
    assert (tmp_path / "b/hosts/gpu01/nvidia-smi-topo.txt").read_bytes() == raw
    # A missing tool leaves no .txt, only the .json that says why (bundle contract).
    assert not (tmp_path / "b/hosts/gpu01/ibstat.txt").exists()
    meta = json.loads((tmp_path / "b/hosts/gpu01/ibstat.json").read_text())
    assert meta["exit_code"] == 127 and meta["stderr"] == "sh: ibstat: not found"

    b = read_bundle(tmp_path / "b")
    r = b.probes_of("gpu01")
    assert r["nvidia-smi-topo"].stdout == raw
    assert r["ibstat"].tool_missing and r["ibstat"].stdout is None
    assert r["lspci"].timed_out and r["lspci"].stdout == b"partial" and not r["lspci"].ok
    assert b.probes_of("gpu02") == {}


def test_the_writers_view_is_what_the_reader_reads(tmp_path):
    # A run judges writer.bundle() instead of reading back what it wrote: the two must agree
    # record for record, in the reader's order, whatever a result looked like in memory.
    w = BundleWriter(tmp_path / "b", ["gpu01", "gpu02", "gpu03"], "2026-11-29T10:00:00+00:00", {"run_id": "r1"})
    w.add(_result("nvidia-smi-topo", b"\x1b[4mGPU0\x1b[0m\t\xff\n"))
    w.add(_result("ibstat", b"", exit_code=127, stderr="sh: ibstat: not found"))  # tool missing: no .txt
    w.add(_result("lspci", b"partial", exit_code=None, timed_out=True))
    w.add(_result("kernel-log", None, exit_code=None, host="gpu02", error="connection refused: [Errno 111]"))
    w.add(_result("nccl-all-reduce", b"# nThread 1\n", host="fleet-"))
    w.add(_result("lspci", b"second write wins", host="gpu01"))
    mine, theirs = w.bundle(), read_bundle(tmp_path / "b")
    assert mine == theirs
    assert list(mine.probes_of("gpu01")) == list(theirs.probes_of("gpu01")) == ["ibstat", "lspci", "nvidia-smi-topo"]
    assert mine.probes_of("gpu01")["ibstat"].stdout is None and mine.probes_of("gpu03") == {}
    assert mine.fleet["nccl-all-reduce"].stdout == b"# nThread 1\n" and mine.header["run_id"] == "r1"


def test_hand_made_bundle_with_bare_txt_files(tmp_path):
    (tmp_path / "hosts/n1").mkdir(parents=True)
    (tmp_path / "hosts/n1/nvidia-smi-q.txt").write_text("x")
    (tmp_path / "bundle.json").write_text(json.dumps({"format": FORMAT, "created": "", "hosts": ["n1"]}))
    r = read_bundle(tmp_path).probes_of("n1")["nvidia-smi-q"]
    assert r.ok and r.text == "x"


@pytest.mark.parametrize("header, message", [
    (None, "no bundle.json"),
    ("{not json", "invalid JSON"),
    (json.dumps({"format": "other/9", "hosts": []}), "field 'format' is 'other/9'"),
    (json.dumps({"format": FORMAT, "hosts": "gpu01"}), "field 'hosts' must be a list"),
    (json.dumps({"format": FORMAT, "hosts": ["../etc"]}), "cannot be used as a file name"),
    # Issue 26: objects where names belong crashed the judge (unhashable dict).
    (json.dumps({"format": FORMAT, "hosts": [], "probes": [{"id": "nvidia-smi-q-x"}]}),
     "field 'probes' must be a list of probe ids \\(strings\\), not dict {\"id\": \"nvidia-smi-q-x\"}"),
    (json.dumps({"format": FORMAT, "hosts": [], "probes": "nvidia-smi-q-x"}), "field 'probes' must be a list"),
    (json.dumps({"format": FORMAT, "hosts": [], "checks": [["xid"]]}), "field 'checks' must be a list of check ids"),
])
def test_bad_bundles_say_what_is_wrong(tmp_path, header, message):
    if header is not None:
        (tmp_path / "bundle.json").write_text(header)
    with pytest.raises(BundleError, match=message):
        read_bundle(tmp_path)
