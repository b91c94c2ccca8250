"""Issue 16 end to end over real SSH: DCGM diagnostics and IB error counters on the simulated
cluster (tests/simcluster.py, nodes of tests/nodes.py).

- gpu01 is healthy: dcgmi answers the real passing level-1 table, its counters do not move.
- gpu02's dcgmi answers the real Deployment error "GPU 3 has uncorrectable memory errors and row
  remappings are pending" (corpus dcgm/dcgmi-diag-r3-...-excerpt.txt), and while it runs the
  counters of mlx5_3 port 1 grow (constructed: symbol_error 0 -> 500, link_downed 0 -> 2 in the
  sysfs files, the capture otherwise as it was): the second reading shows the growth.
- gpu03's diagnostic hangs (dcgmi sleeps past --dcgm-timeout): a result, not a stuck run; its
  health watches report a volatile DBE on GPU 0 and a thermal warning on GPU 2 (the constructed
  report of tests/fixtures/recorded, provenance in MANIFEST.tsv). gpu01 and gpu02 report the real
  Healthy of DCGM issue 263.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
from nodes import CORPUS, DCGM_DIAG, DCGM_HEALTH_CHECK, healthy_h200, nic_counters
from simcluster import Reply

from preflight.app.cli import main

root = pytest.mark.root
CHECKS = "dcgm-diag,dcgm-hostengine,dcgm-health,ib-counters,ib-port-down"
INCIDENTS = (Path(__file__).parents[1] / "fixtures" / "recorded"
             / "dcgmi-health-c-j-failure-dbe-gpu0-thermal-warning-gpu2-constructed.txt")


def _run(cluster, tmp_path: Path, *extra: str) -> tuple[int, dict, float]:
    out = tmp_path / "reports"
    started = time.monotonic()
    code = main(["run", "--hosts", str(cluster.hosts_file), "--ssh-config", str(cluster.ssh_config),
                 "--known-hosts", str(cluster.known_hosts), "--identity", str(cluster.identity),
                 "--out", str(out), "--run-id", "r", "-q", "--checks", CHECKS, *extra])
    return code, json.loads((out / "r" / "report.json").read_text()), time.monotonic() - started


def _with_diag(node, reply: Reply):
    return replace(node, commands={**node.commands, DCGM_DIAG: reply})


def _with_health(node, reply: Reply):
    return replace(node, commands={**node.commands, DCGM_HEALTH_CHECK: reply})


def _finding(report, host: str, check: str) -> dict:
    [f] = [f for f in report["findings"] if f["host"] == host and f["check"] == check]
    return f


@root
def test_dcgm_failure_hang_and_counter_growth_come_out_per_host(sim_cluster, tmp_path):
    grown = nic_counters({3: {"symbol_error": "500", "link_downed": "2"}})
    writes = tuple((path, content) for path, content in grown.items() if "/mlx5_3/" in path)
    remap = CORPUS / "dcgm" / "dcgmi-diag-r3-deployment-error-row-remap-pending-excerpt.txt"
    cluster = sim_cluster([
        healthy_h200("gpu01"),
        _with_diag(healthy_h200("gpu02"), Reply(remap, exit_code=226, sysfs_writes=writes)),
        _with_health(_with_diag(healthy_h200("gpu03"), Reply("", sleep_s=60)), Reply(INCIDENTS)),
    ])
    code, report, elapsed = _run(cluster, tmp_path, "--dcgm-timeout", "3")
    assert code == 1 and elapsed < 60
    assert {h: v["status"] for h, v in report["hosts"].items()} == {"gpu01": "pass", "gpu02": "fail", "gpu03": "fail"}

    healthy = {f["check"]: f for f in report["findings"] if f["host"] == "gpu01"}
    assert healthy["dcgm-diag"]["status"] == "pass" and "1 pass" in healthy["dcgm-diag"]["summary"]
    assert healthy["dcgm-hostengine"]["status"] == "pass"
    assert healthy["dcgm-health"]["status"] == "pass" and "overall Healthy, no incident" in \
        healthy["dcgm-health"]["summary"]
    assert healthy["ib-counters"]["status"] == "pass"
    assert "8 active port(s): no error counter grew over" in healthy["ib-counters"]["summary"]

    diag = _finding(report, "gpu02", "dcgm-diag")
    assert diag["status"] == "fail" and "DCGM_FR_PENDING_ROW_REMAP (85" in diag["summary"]
    counters = _finding(report, "gpu02", "ib-counters")
    assert counters["status"] == "fail"
    assert "mlx5_3 port 1 link_downed +2 (0 -> 2" in counters["summary"]
    assert "mlx5_3 port 1 symbol_error +500 (0 -> 500" in counters["summary"]
    assert any("mlx5_3/ports/1/counters/symbol_error:500" in e["excerpt"] for e in counters["evidence"])

    hang = _finding(report, "gpu03", "dcgm-diag")
    assert hang["status"] == "fail" and "dcgmi diag -r 1 did not finish within 3 s" in hang["summary"]
    # The hung diagnostic did not stop the run: the counters' second reading still came.
    assert _finding(report, "gpu03", "ib-counters")["status"] == "pass"
    health = _finding(report, "gpu03", "dcgm-health")
    assert health["status"] == "fail" and "GPU 0 Memory system Failure: DCGM_FR_VOLATILE_DBE_DETECTED" in \
        health["summary"]
    assert "GPU 2 Thermal system Warning: DCGM_FR_CLOCKS_EVENT_THERMAL" in health["summary"]

    by_host: dict[str, set[str]] = {}
    for d in report["diagnoses"]:
        for h in d["hosts"]:
            by_host.setdefault(h, set()).add(d["cause"])
    assert by_host == {"gpu02": {"gpu-row-remap", "ib-link-flapping", "ib-link-errors"},
                       "gpu03": {"dcgm-diag-hang", "gpu-ecc-uncorrectable", "thermal-throttling"}}
