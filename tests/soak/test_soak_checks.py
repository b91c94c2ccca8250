"""The soak's checks are checks like any other: marked with ``@soak_check`` in checks/soak.py, found
by the loader, listed by ``preflight checks``, run by the soak's analysis in the report's order,
and a check that breaks is an ERROR finding, not a dead analysis.

Soak directories here are the real H200 burn (tests/fixtures/corpus/h200-vm) written through the
package's own converter; the two-host run is that burn recorded under two host names.
"""

from __future__ import annotations

import pandas as pd
import soak_scenarios as S

from preflight.app.cli import main
from preflight.check import soak_check, warn
from preflight.diagnose.engine import load_knowledge
from preflight.judge.loader import load_checks
from preflight.model import Check, Status
from preflight.soak.analysis import analyze, soak_checks
from preflight.soak.data import SoakMeta, write_soak
from preflight.soak.judge import judge_soak

SOAK_CHECKS = ["soak-thermal", "soak-power", "soak-throughput", "soak-outliers", "soak-telemetry", "soak-memory",
               "soak-latency", "soak-sweep", "soak-sdc", "soak-ib-counters", "soak-vllm-server"]


def _real_soak(tmp_path, hosts=("h200-vm",), meta=None, events: str | None = None):
    tele, thr = zip(*(S.real_frames(h) for h in hosts), strict=True)
    soak = write_soak(tmp_path / "soak", SoakMeta("burn", S.START.isoformat(), tuple(hosts), meta),
                      pd.concat(tele), pd.concat(thr))
    if events is not None:
        (soak / "events.csv").write_text("time,host,gpu,event,data\n" + events)
    return soak


def test_the_loader_finds_the_soak_checks_in_checks_soak_py():
    found = [c for c in load_checks() if c.scope == "soak"]
    assert [c.id for c in found] == SOAK_CHECKS
    assert all(c.origin.split(":")[0].endswith("checks/soak.py") and c.probes == () for c in found)
    assert [c.id for c in soak_checks()] == SOAK_CHECKS


def test_preflight_checks_lists_them(capsys):
    assert main(["checks"]) == 0
    out = capsys.readouterr().out
    for check_id in SOAK_CHECKS:
        assert f"{check_id}\tsoak\t" in out


def test_the_analysis_names_the_checks_it_ran(tmp_path):
    analysis = judge_soak(_real_soak(tmp_path), load_knowledge())
    assert [c.id for c in analysis.checks] == SOAK_CHECKS
    # A burn soak: no serving windows (soak-latency), no sweep, no server log (soak-vllm-server), no
    # readings of the RDMA counters (soak-ib-counters).
    assert [f.check for f in analysis.findings] == [c for c in SOAK_CHECKS if c not in (
        "soak-latency", "soak-sweep", "soak-vllm-server", "soak-ib-counters")]


def test_findings_come_host_by_host_then_the_server_logs_in_event_order(tmp_path):
    # Two hosts with telemetry, one listed without any, one vllm host excused from it (its
    # agent found no NVIDIA driver), and server-log symptoms recorded for three of them.
    soak = _real_soak(tmp_path, hosts=("gpu01", "gpu02"),
                      events="1,gpu02,,vllm-engine-dead,5\n2,gpu01,,vllm-oom,7\n3,gpu02,,vllm-oom,\n4,gpu03,3,xid,79\n")
    meta = (soak / "soak.json").read_text().replace('"engine": "burn"', '"engine": "vllm"').replace(
        '"hosts": [', '"no_telemetry": {"cpu9": "no NVIDIA driver"}, "hosts": [').replace('"gpu02"', '"gpu02", "gpu03", "cpu9"')
    (soak / "soak.json").write_text(meta)
    thr = (soak / "throughput.csv").read_text()
    (soak / "throughput.csv").write_text(thr + "".join(line.replace(",gpu01,", ",cpu9,") + "\n"
                                                      for line in thr.splitlines()[1:] if ",gpu01," in line))
    findings = judge_soak(soak, load_knowledge()).findings
    # A vllm soak: no result checks (soak-sdc), no ib-counters.txt; the real samples' rows have no serving
    # windows, so soak-latency skips, and it is not a sweep (no soak-sweep); the server logs come last.
    per_host = [c for c in SOAK_CHECKS if c not in ("soak-sdc", "soak-sweep", "soak-vllm-server", "soak-ib-counters")]
    assert [(f.check, f.host) for f in findings] == (
        [(c, "gpu01") for c in per_host] + [(c, "gpu02") for c in per_host]
        + [("soak-telemetry", "gpu03"), ("soak-telemetry", "cpu9"), ("soak-throughput", "cpu9"),
           ("soak-latency", "cpu9")]
        + [("soak-vllm-server", "gpu02"), ("soak-vllm-server", "gpu01"), ("soak-vllm-server", "gpu02")])
    assert [f.symptoms for f in findings[-3:]] == [("vllm-engine-dead",), ("vllm-oom",), ("vllm-oom",)]
    assert findings[14].status is Status.ERROR and findings[15].status is Status.SKIP


def _boom(soak):
    raise RuntimeError("no such figure")


def test_a_soak_check_that_raises_is_an_error_finding_and_the_others_still_run(tmp_path):
    broken = Check("soak-broken", (), "always raises", _boom, "soak", "tests/soak/test_soak_checks.py: _boom()")
    analysis = judge_soak(_real_soak(tmp_path), load_knowledge(), checks=[broken, *soak_checks()])
    [crash] = [f for f in analysis.findings if f.check == "soak-broken"]
    assert (crash.host, crash.status, crash.symptoms) == (None, Status.ERROR, ("check-crashed",))
    assert crash.summary == "check crashed: RuntimeError: no such figure (tests/soak/test_soak_checks.py: _boom())"
    assert [f.check for f in analysis.findings] == [c for c in SOAK_CHECKS if c not in (
        "soak-latency", "soak-sweep", "soak-vllm-server", "soak-ib-counters")] + ["soak-broken"]
    assert analysis.failed and analysis.hosts["h200-vm"].status == "pass"


def test_a_soak_check_from_a_checks_dir_sees_the_soak_context(tmp_path):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "site_soak.py").write_text(
        "from preflight.check import soak_check, warn\n\n\n"
        "@soak_check('site-soak-length', summary='a soak runs at least two minutes')\n"
        "def site_soak_length(soak):\n"
        "    for host in soak.sampled_hosts:\n"
        "        span = max(g.last_t for g in soak.gpus[host]) - min(g.first_t for g in soak.gpus[host])\n"
        "        if span < 120:\n"
        "            yield warn(f'{span:.1f} s of telemetry', host=host)\n")
    checks = soak_checks([plugins])
    assert [c.id for c in checks] == [*SOAK_CHECKS, "site-soak-length"]
    result = analyze(S.soak_data(*S.real_frames()), checks=checks)
    [mine] = [f for f in result.findings if f.check == "site-soak-length"]
    assert (mine.host, mine.status, mine.summary) == ("h200-vm", Status.WARN, "60.7 s of telemetry")


def test_the_check_api_marks_a_soak_check():
    @soak_check("soak-example", summary="an example")
    def example(soak):
        return warn("x")

    [mark] = example.__preflight_check__
    assert (mark.id, mark.scope, mark.summary, mark.probes) == ("soak-example", "soak", "an example", ())
