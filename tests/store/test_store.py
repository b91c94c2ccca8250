"""The results store on both engines (SQLite, and a real PostgreSQL server): recording real
reports, idempotence by run id, the node's timeline, the fleet's answers, schema versions and
migrations, hostile names, and concurrent writers."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from runs import report

from preflight.store import SchemaMismatch, Store, StoreUnavailable, parse, schema
from preflight.store.read import UnknownNode, Window, fleet, node_history
from preflight.store.rows import rows_of

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def example_report(tmp_path_factory) -> dict:
    """The real report of the shipped nine-node example (real captures, five faults)."""
    out = tmp_path_factory.mktemp("example")
    proc = subprocess.run([sys.executable, "-m", "preflight", "analyze", str(ROOT / "examples/h200-fleet"),
                           "--out", str(out), "-q", "--no-html", "--no-db"], capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    return json.loads(next(out.glob("*/report.json")).read_text())


def record(url: str, rep: dict) -> bool:
    with Store.open(parse(url)) as store:
        return store.record(rows_of(rep, started_fallback=0.0))


def test_a_real_report_is_recorded_once_and_read_back(store_url, example_report):
    assert record(store_url, example_report) is True
    assert record(store_url, example_report) is False  # idempotent by run id
    with Store.open(parse(store_url)) as store:
        assert store.rows("SELECT COUNT(*) FROM pf_runs")[0][0] == 1
        assert store.rows("SELECT COUNT(*) FROM pf_host_results")[0][0] == 9
        h = node_history(store, "gpu006", Window(0))
        f = fleet(store, Window(0))
    (run,) = h["runs"]
    assert run["run_id"] == "example" and run["kind"] == "analyze" and run["status"] == "fail"
    assert run["started"] == example_report["created"]
    assert "nic-fw-driver-mismatch" in [c["cause"] for c in run["causes"]]
    assert {f["check"] for f in run["findings"]} >= {"nic-fw-driver-mismatch", "mlx5-kernel-log"}
    healthy = node_history(Store.open(parse(store_url)), "gpu001", Window(0))["runs"][0]
    assert healthy["status"] == "pass" and healthy["figures"] == {"busbw_gbs": 475.0}
    rates = {r.get("cause"): r for r in f["rates"] if "cause" in r}
    assert rates["host-unreachable"]["failures"] == 1 and rates["host-unreachable"]["incidents"] == 1
    assert f["nodes"] == 9 and f["host_runs"] == 9


def test_a_node_never_seen_is_named_with_its_neighbours(store_url, example_report):
    record(store_url, example_report)
    with Store.open(parse(store_url)) as store, pytest.raises(UnknownNode, match="gpu0.*gpu001"):
        node_history(store, "gpu0", Window(0))


def test_names_and_summaries_are_data(store_url):
    hostile = "gpu'; DROP TABLE pf_runs; --"
    rep = report("r'1", 1, {hostile: {"fail": ["xid"], "causes": ["gpu-fallen-off-bus"]}, "gpu%_": {}})
    assert record(store_url, rep)
    with Store.open(parse(store_url)) as store:
        h = node_history(store, hostile, Window(0))
        assert h["runs"][0]["causes"][0]["cause"] == "gpu-fallen-off-bus"
        assert store.rows("SELECT COUNT(*) FROM pf_runs")[0][0] == 1
        # LIKE's wildcards in a name are matched literally in the 'did you mean' search.
        with pytest.raises(UnknownNode, match="gpu%_"):
            node_history(store, "gpu%_x", Window(0))


def test_repeat_offender_flapping_and_degrading(store_url):
    """Twelve daily runs over four nodes: n1's ECC cause comes back in three separate streaks,
    n2's nvlink check changes its mind every run, n3's busbw falls 3 % in the last three runs
    while every node's busbw wanders by about 0.2 %, n4 is diagnosed the same cause for four
    runs in a row (one incident, not a repeat offender)."""
    wobble = [0.0, 0.2, -0.1, 0.15, -0.2, 0.1, 0.0, -0.15, 0.2, -0.05, 0.1, -0.1]
    with Store.open(parse(store_url)) as store:
        for day in range(12):
            nodes = {}
            for i, name in enumerate(("n1", "n2", "n3", "n4")):
                busbw = 475 * (1 + wobble[(day + 3 * i) % 12] / 100)
                nodes[name] = {"busbw": busbw}
            if day in (1, 2, 5, 9):
                nodes["n1"] = {"fail": ["xid"], "causes": ["gpu-ecc-uncorrectable"]}
            if day % 2:
                nodes["n2"] = {"fail": ["nvlink"], "causes": ["nvlink-down"]}
            if day >= 9:
                nodes["n3"]["busbw"] = 475 * 0.97
            if 3 <= day <= 6:
                nodes["n4"] = {"fail": ["xid"], "causes": ["gpu-row-remap"]}
            store.record(rows_of(report(f"run-{day:02d}", day, nodes), started_fallback=0.0))
        f = fleet(store, Window(0))
    offenders = {(r["node"], r["cause"]): r["count"] for r in f["repeat_offenders"]}
    assert offenders[("n1", "gpu-ecc-uncorrectable")] == 3  # days 1-2, 5, 9: three incidents
    assert offenders[("n2", "nvlink-down")] == 6
    assert ("n4", "gpu-row-remap") not in offenders
    flapping = {(r["node"], r["check"]): r["transitions"] for r in f["flapping"]}
    assert flapping[("n2", "nvlink")] == 11
    assert ("n4", "xid") not in flapping  # pass, fail x4, pass: two changes
    (deg,) = [d for d in f["degrading"] if d["figure"] == "busbw_gbs"]
    assert deg["node"] == "n3" and deg["change_pct"] == pytest.approx(-3.0, abs=0.3)
    assert deg["sigmas"] > 3 and deg["spread_pct"] < 1
    rates = {r["check"]: r for r in f["rates"] if "check" in r}
    assert rates["xid"]["failures"] == 8 and rates["xid"]["incidents"] == 4
    assert rates["nvlink"]["runs"] == 48


def test_the_window_bounds_every_answer(store_url):
    with Store.open(parse(store_url)) as store:
        for day in range(6):
            store.record(rows_of(report(f"w{day}", day, {"n1": {"fail": ["xid"], "causes": ["gpu-fallen-off-bus"]}
                                                          if day % 2 == 0 else {}}), started_fallback=0.0))
        since = rows_of(report("x", 3, {}), started_fallback=0).run.started
        h = node_history(store, "n1", Window(since))
        f = fleet(store, Window(since), )
    assert [r["run_id"] for r in h["runs"]] == ["w3", "w4", "w5"]
    assert f["runs"] == 3 and not f["repeat_offenders"]


def test_an_older_schema_is_refused_until_migrated(store_url, monkeypatch):
    """A store written by this version, read by a preflight whose schema has one more
    migration: refused with both versions and the command, migrated, then read."""
    rep = report("r1", 1, {"n1": {}})
    record(store_url, rep)
    newer = (*schema.MIGRATIONS, (schema.CURRENT + 1, ("ALTER TABLE pf_runs ADD COLUMN site TEXT",)))
    monkeypatch.setattr(schema, "MIGRATIONS", newer)
    monkeypatch.setattr(schema, "CURRENT", schema.CURRENT + 1)
    with pytest.raises(SchemaMismatch, match=rf"version {schema.CURRENT - 1}; this preflight reads version "
                                             rf"{schema.CURRENT}: run `preflight history migrate"):
        Store.open(parse(store_url))
    with Store.connect(parse(store_url)) as store:
        assert store.migrate() == [schema.CURRENT]
    with Store.open(parse(store_url)) as store:
        assert store.version() == schema.CURRENT
        assert store.rows("SELECT run_id, site FROM pf_runs") == [("r1", None)]


def test_a_newer_schema_is_refused(store_url):
    record(store_url, report("r1", 1, {"n1": {}}))
    with Store.open(parse(store_url)) as store:
        store.write(lambda s: s.execute(f"INSERT INTO {schema.VERSION_TABLE} (version, applied) VALUES (?, 0)",
                                        (schema.CURRENT + 5,)))
    with pytest.raises(SchemaMismatch, match=rf"version {schema.CURRENT + 5}, newer than the version "
                                             rf"{schema.CURRENT}.*upgrade preflight"):
        Store.open(parse(store_url))


def test_writers_at_once_lose_nothing(store_url):
    """Forty single-node runs recorded at the same moment from forty threads, each with its own
    connection (healthchecks from many nodes landing together); PostgreSQL's test server allows
    40 connections, fewer than the writers plus this test's own, so some wait for a slot."""
    Store.open(parse(store_url)).close()  # the schema first, as the first healthcheck would
    errors, start = [], threading.Barrier(40)

    def write(i: int) -> None:
        try:
            start.wait()
            record(store_url, report(f"hc-{i}", 1 + i / 1000, {f"node{i:03d}": {"busbw": 470.0 + i % 5}}))
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(repr(exc))

    threads = [threading.Thread(target=write, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with Store.open(parse(store_url)) as store:
        assert store.rows("SELECT COUNT(*), COUNT(DISTINCT run_id) FROM pf_host_results") == [(40, 40)]
        assert store.rows("SELECT COUNT(*) FROM pf_figures")[0][0] == 40


def test_events_are_kept_with_who_and_why(store_url):
    record(store_url, report("r1", 1, {"n1": {"fail": ["xid"], "causes": ["gpu-fallen-off-bus"]}}))
    with Store.open(parse(store_url)) as store:
        store.add_event("n1", "drain", "alice", "preflight: gpu-fallen-off-bus", "r1", '{"why": "high"}', at=1.0e9)
        h = node_history(store, "n1", Window(0))
    assert h["events"] == [{"at": "2001-09-09T01:46:40+00:00", "kind": "drain", "actor": "alice",
                            "reason": "preflight: gpu-fallen-off-bus", "run_id": "r1", "detail": {"why": "high"}}]


def test_a_down_postgresql_is_unavailable_without_its_password(tmp_path):
    pytest.importorskip("psycopg")
    url = parse(f"postgresql://pf:s3cret-pw@/preflight?host={tmp_path}&port=1")
    with pytest.raises(StoreUnavailable) as caught:
        Store.open(url, timeout_s=1)
    assert "s3cret-pw" not in str(caught.value) and "pf:***@" in str(caught.value)


def test_prune_forgets_what_is_older_and_keeps_the_rest(store_url):
    with Store.open(parse(store_url)) as store:
        for day in range(5):
            store.record(rows_of(report(f"p{day}", day, {"n1": {"fail": ["xid"], "causes": ["gpu-fallen-off-bus"],
                                                               }, "n2": {"busbw": 470.0}}), started_fallback=0.0))
        cut = rows_of(report("x", 3, {}), started_fallback=0).run.started
        store.add_event("n1", "drain", "alice", "preflight: xid", "p1", at=cut - 86400)
        store.add_event("n1", "resume", "alice", "passes", "p4", at=cut + 86400)
        assert store.prune(cut) == 3
        assert [r["run_id"] for r in node_history(store, "n1", Window(0))["runs"]] == ["p3", "p4"]
        assert [e["kind"] for e in node_history(store, "n1", Window(0))["events"]] == ["resume"]
        for table in ("pf_host_results", "pf_findings", "pf_diagnoses", "pf_figures"):
            assert store.rows(f"SELECT MIN(started) FROM {table}")[0][0] >= cut


def test_a_version_1_store_migrates_to_the_lifecycle_tables_with_its_runs(store_url):
    """A store as the first release wrote it (schema 1), opened by this one: refused with both
    versions, then `migrate` adds the lifecycle's tables and keeps every run."""
    with Store.connect(parse(store_url)) as store:
        assert store.migrate(upto=1) == [1]

        def old_release(s: Store) -> None:  # what the schema-1 release wrote for one run
            s.execute("INSERT INTO pf_runs (run_id, kind, started, duration_s, launcher, version, command, status, "
                      "checks, hosts, recorded) VALUES ('old-1', 'run', 86400, 1.5, 'ssh', '0.1.0', 'preflight run', "
                      "'fail', '[\"xid\"]', 1, 86400)")
            s.execute("INSERT INTO pf_host_results VALUES ('old-1', 'n1', 86400, 'fail', 1, 'hgx-h200')")
            s.execute("INSERT INTO pf_diagnoses VALUES ('old-1', 'n1', 86400, 'gpu-fallen-off-bus', 'high', 'reboot')")

        store.write(old_release)
    with pytest.raises(SchemaMismatch, match=rf"version 1; this preflight reads version {schema.CURRENT}"):
        Store.open(parse(store_url))
    with Store.connect(parse(store_url)) as store:
        assert store.migrate() == list(range(2, schema.CURRENT + 1))
    with Store.open(parse(store_url)) as store:
        assert node_history(store, "n1", Window(0))["runs"][0]["causes"][0]["cause"] == "gpu-fallen-off-bus"
        assert store.rows("SELECT COUNT(*) FROM pf_node_state") == [(0,)]
        assert store.rows("SELECT run_id, report_dir FROM pf_runs") == [("old-1", None)]  # the new column, empty
