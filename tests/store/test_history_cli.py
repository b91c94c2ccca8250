"""``preflight history`` and the recording of every run-like command, through the real command
line on both engines: backfill and idempotence, the contract's JSON keys, and bad input: a URL
that names no store, a store that is down, locked, not a database, a ``--since`` that does not
parse. Recording never changes a run's exit code or costs its reports."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from preflight.app import cli, store_cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "h200-fleet"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_analyze_records_and_history_reads(store_url, tmp_path, capsys):
    code, _, err = run(capsys, "analyze", str(EXAMPLE), "--out", str(tmp_path), "-q", "--no-html", "--db", store_url)
    assert code == 1 and "warning" not in err
    code, out, _ = run(capsys, "history", "gpu007", "--since", "3650d", "--json", "--db", store_url)
    assert code == 0
    h = json.loads(out)
    assert set(h) >= {"node", "runs", "events"} and h["node"] == "gpu007"
    (r,) = h["runs"]
    assert set(r) >= {"run_id", "kind", "started", "status", "causes", "figures"}
    assert [c["cause"] for c in r["causes"]] == ["nvlink-down"]
    code, out, _ = run(capsys, "history", "--fleet", "--since", "3650d", "--json", "--db", store_url)
    f = json.loads(out)
    assert code == 0 and set(f) >= {"repeat_offenders", "flapping", "degrading", "rates"}
    assert {"check", "failures", "runs", "mtbf_h"} <= set(next(x for x in f["rates"] if "check" in x))
    # A second analysis of the same evidence is the same reading of the nodes: nothing added.
    run(capsys, "analyze", str(EXAMPLE), "--out", str(tmp_path / "again"), "-q", "--no-html", "--db", store_url)
    code, out, _ = run(capsys, "history", "gpu007", "--since", "3650d", "--json", "--db", store_url)
    assert len(json.loads(out)["runs"]) == 1
    code, out, _ = run(capsys, "history", "gpu007", "--since", "3650d", "--db", store_url)
    assert "FAIL" in out and "nvlink-down" in out


def test_history_import_backfills_a_reports_folder_once(store_url, tmp_path, capsys):
    reports = tmp_path / "reports"
    for i in range(3):
        bundle = tmp_path / f"b{i}"
        shutil.copytree(EXAMPLE, bundle)
        header = json.loads((bundle / "bundle.json").read_text())
        header["run_id"] = f"site-run-{i}"
        (bundle / "bundle.json").write_text(json.dumps(header))
        run(capsys, "analyze", str(bundle), "--out", str(reports / f"batch{i}"), "-q", "--no-html", "--no-db")
    folders = [str(reports / f"batch{i}") for i in range(3)]
    code, out, _ = run(capsys, "history", "import", *folders, "--db", store_url)
    assert code == 0 and "recorded 3 run(s)" in out
    code, out, _ = run(capsys, "history", "import", *folders, "--db", store_url)
    assert code == 0 and "recorded 0 run(s)" in out and "3 already there" in out
    code, out, _ = run(capsys, "history", "gpu006", "--since", "3650d", "--json", "--db", store_url)
    assert [r["run_id"] for r in json.loads(out)["runs"]] == ["site-run-0", "site-run-1", "site-run-2"]


def test_the_embedded_default_and_no_db(tmp_path, capsys, monkeypatch):
    state = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    run(capsys, "analyze", str(EXAMPLE), "--out", str(tmp_path / "r"), "-q", "--no-html")
    db = state / "preflight" / "history.sqlite"
    assert db.is_file() and oct(db.stat().st_mode & 0o777) == "0o600"
    code, out, _ = run(capsys, "history", "gpu001", "--since", "3650d", "--json")
    assert code == 0 and json.loads(out)["runs"][0]["figures"] == {"busbw_gbs": 475.0}
    db.unlink()
    run(capsys, "analyze", str(EXAMPLE), "--out", str(tmp_path / "r2"), "-q", "--no-html", "--no-db")
    monkeypatch.setenv("PREFLIGHT_DB", "")
    run(capsys, "analyze", str(EXAMPLE), "--out", str(tmp_path / "r3"), "-q", "--no-html")
    assert not db.exists()


def test_a_locked_store_costs_a_warning_not_the_verdict(tmp_path, capsys, monkeypatch):
    path = tmp_path / "s.sqlite"
    url = f"sqlite:///{path}"
    run(capsys, "history", "import", str(tmp_path / "none"), "--db", url)  # exit 2, nothing
    monkeypatch.setattr(store_cli, "WRITE_TIMEOUT_S", 0.5)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA journal_mode = WAL")
    holder.execute("CREATE TABLE other (x)")
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the lock
    try:
        code, _, err = run(capsys, "analyze", str(EXAMPLE), "--out", str(tmp_path / "r"), "-q", "--no-html",
                           "--db", url)
    finally:
        holder.rollback()
        holder.close()
    assert code == 1  # what the analysis says, as without a store
    assert next((tmp_path / "r").glob("*/report.json")).is_file()
    assert "warning: results store" in err and str(path) in err and "locked" in err
    assert "preflight history import" in err


def test_a_file_that_is_not_a_database(tmp_path, capsys):
    bad = tmp_path / "notes.sqlite"
    bad.write_text("these are not the rows you are looking for\n" * 10)
    code, _, err = run(capsys, "history", "--fleet", "--db", f"sqlite:///{bad}")
    assert code == 2 and f"{bad} is not a SQLite database" in err
    code, _, err = run(capsys, "analyze", str(EXAMPLE), "--out", str(tmp_path / "r"), "-q", "--no-html",
                       "--db", f"sqlite:///{bad}")
    assert code == 1 and "not a SQLite database" in err
    assert bad.read_text().startswith("these are not")  # left as it was


def test_an_unreachable_postgresql_keeps_its_password(tmp_path, capsys, monkeypatch):
    pytest.importorskip("psycopg")
    monkeypatch.setattr(store_cli, "WRITE_TIMEOUT_S", 1.0)
    url = f"postgresql://pf:hunter2-secret@/preflight?host={tmp_path}&port=1"
    code, out, err = run(capsys, "history", "--fleet", "--db", url)
    assert code == 2 and "pf:***@" in err and "hunter2" not in out + err
    out_dir = tmp_path / "r"
    code, out, err = run(capsys, "analyze", str(EXAMPLE), "--out", str(out_dir), "--no-html", "--db", url)
    assert code == 1 and "warning: results store" in err and "hunter2" not in out + err
    written = "".join(p.read_text(errors="replace") for p in out_dir.rglob("*") if p.is_file())
    assert "hunter2" not in written


@pytest.mark.parametrize("argv, message", [
    (["history", "--fleet", "--since", "3 fortnights"], "--since: '3 fortnights' is neither a duration"),
    (["history"], "name one NODE, or give --fleet"),
    (["history", "gpu1", "--fleet"], "a NODE or --fleet, not both"),
    (["history", "gpu1", "--html", "x.html"], "--html: the fleet page comes with --fleet"),
    (["history", "--fleet", "--db", "mysql://db/pf"], "unknown store; use sqlite:///PATH"),
    (["history", "--fleet", "--db", "sqlite://relative.db"], "three slashes"),
    (["history", "--fleet", "--db", "postgresql://u:pw@db01"], "name the database"),
    (["history", "import"], "name the run directories"),
])
def test_bad_history_input_exits_2(argv, message, capsys):
    code, _, err = run(capsys, *argv)
    assert code == 2 and message in err
    assert ":pw@" not in err


def test_a_bad_db_url_refuses_the_run_before_anything_is_written(tmp_path, capsys):
    code, _, err = run(capsys, "analyze", str(EXAMPLE), "--out", str(tmp_path / "r"), "-q", "--db", "sqlite:x")
    assert code == 2 and "--db" in err and not (tmp_path / "r").exists()


def test_history_of_a_store_that_does_not_exist(tmp_path, capsys):
    code, _, err = run(capsys, "history", "--fleet", "--db", f"sqlite:///{tmp_path}/nothing.sqlite")
    assert code == 2 and "does not exist" in err and not (tmp_path / "nothing.sqlite").exists()


def test_a_damaged_database_is_named(tmp_path, capsys):
    """A real store whose pages were overwritten (a disk fault, a copy cut short): the history
    command names the file and exits 2; a run warns and keeps its verdict."""
    path = tmp_path / "h.sqlite"
    url = f"sqlite:///{path}"
    run(capsys, "analyze", str(EXAMPLE), "--out", str(tmp_path / "r"), "-q", "--no-html", "--db", url)
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    with open(path, "r+b") as fh:
        fh.seek(4096)
        fh.write(b"\xff" * 8192)
    code, _, err = run(capsys, "history", "--fleet", "--db", url)
    assert code == 2 and f"{path} is not a SQLite database or is damaged (database disk image is malformed)" in err
    code, _, err = run(capsys, "analyze", str(EXAMPLE), "--out", str(tmp_path / "r2"), "-q", "--no-html", "--db", url)
    assert code == 1 and "damaged" in err and next((tmp_path / "r2").glob("*/report.json")).is_file()


def test_history_prune_on_the_command_line(tmp_path, capsys):
    url = f"sqlite:///{tmp_path}/h.sqlite"
    run(capsys, "analyze", str(EXAMPLE), "--out", str(tmp_path / "r"), "-q", "--no-html", "--db", url)
    code, out, _ = run(capsys, "history", "prune", "--keep", "3650d", "--db", url)
    assert code == 0 and "forgot 0 run(s)" in out
    code, out, _ = run(capsys, "history", "prune", "--keep", "1h", "--db", url)  # the example is from November
    assert code == 0 and "forgot 1 run(s)" in out
    code, _, err = run(capsys, "history", "prune", "--db", url)
    assert code == 2 and "--keep AGE" in err
