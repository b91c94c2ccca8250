"""The site-baseline statistics (preflight/knowledge/site_profile.py), pure: samples in, lines out.

The sample values are busbw figures read from real captures (tests/fixtures/baseline/MANIFEST.tsv):
the A100 capture's rows, and the two MI350X runs of one node with the A100's 8 GiB figure.
"""

from __future__ import annotations

import pytest
import yaml

from preflight.knowledge.profiles import ProfileError, load_profile_file, load_profiles
from preflight.knowledge.site_profile import (
    CAP,
    FLOOR,
    BaselineError,
    Context,
    RunSource,
    Sample,
    derive,
    site_profile,
)

# Out-of-place busbw of the A100 capture from 256 MiB to 8 GiB (GB/s).
A100_ROWS = [222.40, 223.68, 230.29, 231.76, 234.37, 235.26]
A100_8G = 235.26
MI350X_G8, MI350X_MPIRUN = 367.51, 289.27  # in-place busbw at 8 GiB, the higher half of each row


def test_spread_is_three_scaled_mads_between_the_floor_and_the_cap():
    s = derive(A100_ROWS)
    assert s.median == pytest.approx(231.025)
    assert s.mad == pytest.approx(3.79)  # deviations 8.625 7.345 0.735 0.735 3.345 4.235
    assert s.sigma == pytest.approx(3.79 * 1.4826)
    assert s.margin == pytest.approx(3 * 3.79 * 1.4826)  # 7.3 % of the median: neither bound applies
    assert FLOOR * s.median < s.margin < CAP * s.median
    assert s.warn_below == pytest.approx(s.median - s.margin)
    assert s.fail_below == pytest.approx(s.median - 2 * s.margin)


def test_identical_runs_get_the_floor_not_a_zero_margin():
    # One capture replayed three times: MAD 0. Without the floor any noise at all would WARN.
    s = derive([A100_8G] * 3)
    assert s.mad == 0
    assert s.margin == pytest.approx(0.05 * A100_8G)
    assert s.warn_below == pytest.approx(223.497)
    assert s.fail_below == pytest.approx(211.734)


def test_a_noisy_baseline_is_capped_at_the_published_figures_margin():
    s = derive([MI350X_G8, MI350X_MPIRUN, A100_8G])
    assert s.median == MI350X_MPIRUN
    assert s.margin == pytest.approx(CAP * MI350X_MPIRUN)  # 3 x 1.4826 x 54.01 would be 240 GB/s
    assert s.fail_below == pytest.approx(MI350X_MPIRUN * 0.70)


def test_one_odd_sample_moves_neither_the_median_nor_the_lines_much():
    calm = derive([MI350X_G8] * 4)
    odd = derive([MI350X_G8] * 4 + [MI350X_MPIRUN])
    assert odd.median == calm.median and odd.warn_below == calm.warn_below


@pytest.mark.parametrize("values, words", [
    ([MI350X_G8, MI350X_MPIRUN], "2 sample(s): a baseline needs at least 3"),
    ([], "0 sample(s)"),
    ([A100_8G, A100_8G, 0.0], "0 or less"),
])
def test_too_few_or_impossible_samples_are_refused(values, words):
    with pytest.raises(BaselineError, match=words.replace("(", r"\(").replace(")", r"\)")):
        derive(values)


def _profile(base_id="hgx-b300", values=(MI350X_G8,) * 3):
    base = load_profiles()[base_id]
    runs = [RunSource(f"run-{i}", f"/runs/run-{i}", f"2026-11-2{i}T10:00:00+00:00", 1) for i in range(3)]
    samples = [Sample(v, r.run_id, r.created) for v, r in zip(values, runs, strict=True)]
    ctx = Context(base.data, "AMD Instinct MI350X", 8, 8589934592, False)
    return base, site_profile("nccl.all_reduce_busbw_gbs", samples, runs, ctx, "2026-12-01T17:00:00Z")


def test_site_profile_keeps_the_base_profile_and_adds_the_figure_with_its_source(tmp_path):
    base, data = _profile()
    assert base.get("nccl.all_reduce_busbw_gbs") is None  # what the baseline is for
    assert data["id"] == "hgx-b300" and data["match"] == base.data["match"]
    assert data["nvlink"] == base.data["nvlink"]
    assert data["nccl"] == {"all_reduce_busbw_gbs": 367.51, "all_reduce_busbw_warn_gbs": 349.13,
                            "all_reduce_busbw_fail_gbs": 330.76, "all_reduce_ranks": 8,
                            "all_reduce_bytes": 8589934592, "all_reduce_gpu_model": "AMD Instinct MI350X"}
    assert "median of 3 samples" in data["sources"]["nccl.all_reduce_busbw_gbs"]
    assert "run-0, run-1, run-2" in data["sources"]["nccl.all_reduce_busbw_gbs"]
    assert data["sources"]["nvlink.links_per_gpu"] == base.data["sources"]["nvlink.links_per_gpu"]
    fig = data["baseline"]["figures"]["nccl.all_reduce_busbw_gbs"]
    assert [s["run_id"] for s in fig["samples"]] == ["run-0", "run-1", "run-2"]
    assert [r["hosts"] for r in data["baseline"]["runs"]] == [1, 1, 1]
    # The shipped profile's own data is not touched: the site profile is a copy.
    assert load_profiles()["hgx-b300"].get("nccl.all_reduce_busbw_gbs") is None
    # And it is a profile: the loader reads it back with its schema checks.
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    loaded = load_profile_file(path)
    assert loaded.id == "hgx-b300"
    assert loaded.get("nccl.all_reduce_busbw_fail_gbs") == 330.76


def test_a_generic_base_with_no_nccl_section_gets_one():
    _, data = _profile("generic")
    assert data["nccl"]["all_reduce_busbw_gbs"] == 367.51


@pytest.mark.parametrize("nccl, words", [
    ({"all_reduce_busbw_gbs": 367.51, "all_reduce_busbw_warn_gbs": 349.13}, "go together"),
    ({"all_reduce_busbw_warn_gbs": 349.13, "all_reduce_busbw_fail_gbs": 330.76}, "go together"),
    ({"all_reduce_busbw_gbs": 367.51, "all_reduce_busbw_warn_gbs": 330.76, "all_reduce_busbw_fail_gbs": 349.13},
     "must be below"),
    ({"all_reduce_busbw_gbs": 300.0, "all_reduce_busbw_warn_gbs": 349.13, "all_reduce_busbw_fail_gbs": 330.76},
     "at most"),
])
def test_a_hand_edited_site_profile_with_lines_that_cannot_hold_is_refused(tmp_path, nccl, words):
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump({"id": "hgx-b300", "name": "site", "nccl": nccl}))
    with pytest.raises(ProfileError, match=words) as exc:
        load_profile_file(path)
    assert str(path) in str(exc.value)
