"""The store's integrity through the real command line (issue 31), on both engines: imports
that are all or nothing and name the file and field they refuse, history that shows what a
writer with a clock ahead recorded, names that are not UTF-8, NUL in a summary, FIFOs where a
file should be, the import hint naming the store used, and the default store made on first use
by every command that writes."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

from runs import report
from test_history_cli import EXAMPLE, run
from test_integrity import bounded

from preflight.store import Store, parse


def saved(folder: Path, *reports: dict) -> Path:
    """``reports`` saved as run directories under ``folder``, as `preflight run` leaves them."""
    for rep in reports:
        (folder / rep["run_id"]).mkdir(parents=True)
        (folder / rep["run_id"] / "report.json").write_text(json.dumps(rep))
    return folder


def runs_in(url: str) -> list[str]:
    with Store.open(parse(url)) as store:
        return [r for (r,) in store.rows("SELECT run_id FROM pf_runs ORDER BY run_id")]


def test_an_import_with_a_time_in_milliseconds_records_nothing_and_names_file_and_field(store_url, tmp_path, capsys):
    good = [report(f"r{i}", i, {"n1": {}}) for i in range(3)]
    bad = {**report("r9", 9, {"n1": {}}), "started_at": time.time() * 1000}
    folder = saved(tmp_path / "reports", *good, bad)
    code, _, err = run(capsys, "history", "import", str(folder), "--db", store_url)
    assert code == 2 and f"{folder / 'r9' / 'report.json'}: started_at: the run cannot have started at" in err
    assert runs_in(store_url) == []
    shutil.rmtree(folder / "r9")
    assert run(capsys, "history", "import", str(folder), "--db", store_url)[0] == 0
    assert runs_in(store_url) == ["r0", "r1", "r2"]


def test_history_shows_a_run_from_a_writer_whose_clock_is_ahead(store_url, tmp_path, capsys):
    """Recorded (and acted on by the lifecycle) but never shown: the window ended at the
    reader's now. It now ends at the latest run recorded."""
    ahead = {**report("ahead", 0, {"n1": {"fail": ["xid"], "causes": ["gpu-fallen-off-bus"]}}),
             "started_at": time.time() + 3 * 3600}
    assert run(capsys, "history", "import", str(saved(tmp_path / "r", ahead)), "--db", store_url)[0] == 0
    code, out, _ = run(capsys, "history", "n1", "--json", "--db", store_url)
    assert code == 0 and [r["run_id"] for r in json.loads(out)["runs"]] == ["ahead"]
    code, out, _ = run(capsys, "history", "--fleet", "--json", "--db", store_url)
    assert code == 0 and json.loads(out)["runs"] == 1


def test_names_that_are_not_utf8_and_nul_in_a_summary_are_recorded(store_url, tmp_path, capsys):
    """A report naming a host with a lone surrogate ('\\udcff' in JSON, or a name that was not
    UTF-8), and a summary carrying a probe's NUL bytes: the import ended in a traceback (and on
    PostgreSQL neither could ever be recorded)."""
    rep = report("r1", 1, {"gpu\udcff7": {"fail": ["xid"]}})
    rep["findings"][0]["summary"] = "dmesg: NVRM: Xid 79\x00"
    assert run(capsys, "history", "import", str(saved(tmp_path / "r", rep)), "--db", store_url)[0] == 0
    code, out, _ = run(capsys, "history", "gpu\udcff7", "--since", "3650d", "--json", "--db", store_url)
    (r,) = json.loads(out)["runs"]
    assert code == 0 and r["findings"][0]["summary"] == "dmesg: NVRM: Xid 79\\x00"


def test_a_run_id_that_is_not_utf8_is_recorded_live_and_its_hint_reaches_the_folder(store_url, tmp_path, capsys):
    """`--run-id` from bytes that are not UTF-8: the run's recording, then the hint it printed,
    ended in tracebacks."""
    code, _, err = run(capsys, "merge", str(EXAMPLE), "--out", str(tmp_path / "a"), "--run-id", "r\udcff", "-q",
                       "--no-html", "--db", store_url)
    assert code == 1 and "warning" not in err and runs_in(store_url) == ["r\\udcff"]
    missing = f"sqlite:///{tmp_path / 'none' / 's.sqlite'}"
    code, _, err = run(capsys, "merge", str(EXAMPLE), "--out", str(tmp_path / "b"), "--run-id", "r\udcff", "-q",
                       "--no-html", "--db", missing)
    assert code == 1 and f"`preflight history import $'{tmp_path / 'b'}/r\\xff' --db {missing}`" in err


def test_the_import_hint_names_the_store_used_and_never_its_password(tmp_path, capsys, monkeypatch):
    missing = f"sqlite:///{tmp_path / 'no dir' / 's.sqlite'}"
    code, _, err = run(capsys, "merge", str(EXAMPLE), "--out", str(tmp_path / "a"), "--run-id", "m1", "-q",
                       "--no-html", "--db", missing)
    assert code == 1 and f"`preflight history import {tmp_path / 'a' / 'm1'} --db '{missing}'`" in err
    secret = f"postgresql://pf:hunter2@/preflight?host={tmp_path}&port=1"
    code, _, err = run(capsys, "merge", str(EXAMPLE), "--out", str(tmp_path / "b"), "--run-id", "m2", "-q",
                       "--no-html", "--db", secret)
    assert code == 1 and "hunter2" not in err
    assert re.search(rf"`preflight history import {tmp_path / 'b' / 'm2'}` with \$PREFLIGHT_DB set to this "
                     r"store's URL, password included \(postgresql://pf:\*\*\*@", err)


def test_history_import_and_lifecycle_once_create_the_default_store(tmp_path, capsys):
    """As run and analyze do: $XDG_STATE_HOME/preflight/ did not exist, and both refused with
    'no such directory'. (conftest gives each test an empty XDG_STATE_HOME.)"""
    default = Path(os.environ["XDG_STATE_HOME"]) / "preflight" / "history.sqlite"
    assert run(capsys, "lifecycle", "--once")[0] == 0 and default.is_file()
    shutil.rmtree(default.parent)
    code, out, _ = run(capsys, "history", "import", str(saved(tmp_path / "r", report("r1", 1, {"n1": {}}))))
    assert code == 0 and "recorded 1 run(s)" in out and default.is_file()


def test_fifos_are_refused_not_waited_on(tmp_path, capsys):
    """A FIFO named report.json in an import folder, given as the report, or where the store's
    file should be: each blocked its open() until a writer came (for ever)."""
    folder = saved(tmp_path / "reports", report("r1", 1, {"n1": {}}))
    (folder / "r2").mkdir()
    os.mkfifo(folder / "r2" / "report.json")
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    for target in (folder, folder / "r2", folder / "r2" / "report.json"):
        out = bounded(lambda t=target: run(capsys, "history", "import", str(t), "--db", url), 20)
        code, _, err = out["value"]
        assert code == 2 and f"{folder / 'r2' / 'report.json'}: not a regular file" in err
    assert not (tmp_path / "s.sqlite").exists() or runs_in(url) == []
    os.mkfifo(tmp_path / "fifo.sqlite")
    out = bounded(lambda: run(capsys, "history", "n1", "--db", f"sqlite:///{tmp_path / 'fifo.sqlite'}"), 20)
    code, _, err = out["value"]
    assert code == 2 and f"{tmp_path / 'fifo.sqlite'} is not a regular file" in err


def test_an_import_of_two_runs_under_one_id_keeps_both_and_says_so(store_url, tmp_path, capsys):
    a = report("nightly", 1, {"n1": {}})
    b = report("nightly", 2, {"n1": {"fail": ["xid"]}})
    saved(tmp_path / "a", a)
    saved(tmp_path / "b", b)
    code, out, err = run(capsys, "history", "import", str(tmp_path / "a"), str(tmp_path / "b"), "--db", store_url)
    assert code == 0 and "recorded 2 run(s)" in out
    kept = runs_in(store_url)
    assert kept[0] == "nightly" and re.fullmatch(r"nightly~[0-9a-f]{12}", kept[1])
    assert f"another run is recorded as nightly; this one is kept as {kept[1]}" in err
    code, out, err = run(capsys, "history", "import", str(tmp_path / "b"), "--db", store_url)
    assert code == 0 and "recorded 0 run(s)" in out and "1 already there" in out and "another run" not in err
