"""Cluster acceptance as a pytest suite: what a new cluster must show before it serves traffic.

Run it against the cluster, or offline against the evidence a run saved (a customer's bundle):

    pytest examples/acceptance --preflight-hosts=hosts.txt [--preflight-profile=hgx-h200]
    pytest examples/acceptance --preflight-bundle=examples/h200-fleet

preflight runs once for the session (the preflight pytest plugin); the tests below read its
report through the ``preflight_report`` fixture (``preflight.pytest.acceptance.Report``). pytest also
lists every host x check preflight judged as ``test_preflight[<host>-<check>]``; add
``-k "not test_preflight"`` to keep only the criteria. A criterion whose evidence is missing
fails rather than skips: "not measured" does not meet a contract.

The criteria, one test each:
- every host was reached and checked;
- all GPUs present: ``gpu-inventory`` passes on every host (the platform profile's count and
  model), and nothing diagnosed a missing or fallen-off GPU;
- NVLink NV18 everywhere: the ``nvlink`` check passes on every host (all links active at full
  speed, every GPU pair at the profile's ``nvlink.pair_topology``, NV18 on HGX boards);
- NIC firmware matches the driver: ``nic-fw-driver-mismatch`` passes on every host;
- all_reduce bus bandwidth at or above the profile's ``nccl.all_reduce_busbw_gbs`` on every
  host, at the largest message size;
- one hour of soak without thermal slowdown, and throughput decay under 5 %.
"""

from preflight.knowledge.profiles import load_profiles
from preflight.pytest.acceptance import MissingResult

# The contract's numbers: a site edits these, not the tests.
SOAK_MIN_S = 3600
MAX_THROUGHPUT_DECAY = 0.05
# This contract's ceiling. NVIDIA publishes slowdown limits as margins, not absolute degrees,
# for H100/H200/B200, so the figure is the buyer's choice, not a hardware limit.
MAX_SOAK_TEMPERATURE_C = 85
# Of the profile's all_reduce figure. The figures are measured peaks; a contract may settle
# lower (preflight's nccl check itself warns only below 0.85 of them).
BUSBW_FRACTION = 1.0
THERMAL_REASONS = {"sw_thermal_slowdown", "hw_thermal_slowdown"}


def not_passing(report, check):
    """{host: status} for each host where ``check`` did not pass; None: it never reported there."""
    statuses = {name: report.host(name).status_of(check) for name in report.hosts}
    return {name: status.value if status else None for name, status in statuses.items() if status != "pass"}


def soak_results(report):
    assert report.soak.ran, "no soak results in this report: run `preflight soak --hours 1` on the cluster"
    return report.soak


def test_every_host_checked(preflight_report):
    assert [name for name in preflight_report.hosts if not preflight_report.host(name).reachable] == []


def test_all_gpus_present(preflight_report):
    assert not_passing(preflight_report, "gpu-inventory") == {}
    assert preflight_report.diagnoses(cause=["gpu-missing", "gpu-fallen-off-bus"]) == ()


def test_nvlink_nv18_everywhere(preflight_report):
    assert not_passing(preflight_report, "nvlink") == {}
    assert preflight_report.diagnoses(cause=["nvlink-down", "fabric-manager-down"]) == ()


def test_nic_firmware_matches_driver(preflight_report):
    assert not_passing(preflight_report, "nic-fw-driver-mismatch") == {}


def test_all_reduce_busbw_at_profile(preflight_report):
    profiles = load_profiles()
    short = {}
    for name in preflight_report.hosts:
        profile = profiles.get(preflight_report.host(name).profile)
        expected = profile.get("nccl.all_reduce_busbw_gbs") if profile else None
        if expected is None:
            short[name] = f"profile {preflight_report.host(name).profile} has no all_reduce figure"
            continue
        try:
            busbw = preflight_report.busbw("all_reduce", hosts=name)
        except MissingResult as exc:
            short[name] = str(exc)
            continue
        if busbw < BUSBW_FRACTION * expected:
            short[name] = f"{busbw:.1f} < {BUSBW_FRACTION * expected:g} GB/s"
    assert short == {}


def test_soak_one_hour_without_thermal_slowdown(preflight_report):
    soak = soak_results(preflight_report)
    assert soak.duration_s >= SOAK_MIN_S
    assert THERMAL_REASONS & set(soak.throttle_reasons_seen) == set()
    assert preflight_report.diagnoses(cause=["thermal-throttling", "throughput-cliff"]) == ()
    assert soak.max_temperature is not None and soak.max_temperature < MAX_SOAK_TEMPERATURE_C


def test_soak_throughput_decay_under_5_percent(preflight_report):
    soak = soak_results(preflight_report)
    assert soak.throughput_decay is not None, "the soak recorded no throughput"
    assert soak.throughput_decay < MAX_THROUGHPUT_DECAY
