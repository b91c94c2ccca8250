"""Bad input to the store's commands (issue 31): exit 2 with a message naming the option or
file, never a traceback, and nothing changed. Durations that reach before 1970, numbers that
are not finite or not positive, a store URL with a broken IPv6 host, a folder with no report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from preflight.app import cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "h200-fleet"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv, message", [
    (["history", "--fleet", "--since", "999999d"], "--since: '999999d' reaches back before 1970-01-01"),
    (["history", "--fleet", "--since", "99999999999999999999999w"], "--since: '99999999999999999999999w' reaches"),
    (["history", "--fleet", "--since", "1969-12-31"], "--since: '1969-12-31' reaches back before 1970-01-01"),
    (["lifecycle", "gpu1", "--rma", "--since", "999999d"], "--since: '999999d' reaches back"),
    (["history", "--fleet", "--since", "9999-12-31T23:59:59-12:00"], "past the last date a time can be written"),
    (["history", "prune", "--keep", "999999d"], "--keep: '999999d' reaches back before 1970-01-01"),
    (["history", "--fleet", "--sigmas", "nan"], "argument --sigmas: must be a finite number"),
    (["history", "--fleet", "--sigmas", "-1"], "argument --sigmas: must be positive"),
    (["history", "--fleet", "--sigmas", "inf"], "argument --sigmas: must be a finite number"),
    (["lifecycle", "--watch", "--interval", "inf"], "argument --interval: must be a finite number"),
    (["lifecycle", "--watch", "--interval", "nan"], "argument --interval: must be a finite number"),
    (["lifecycle", "--watch", "--interval", "-1"], "argument --interval: must be positive"),
    (["lifecycle", "--watch", "--interval", "1e9"], "argument --interval: must be at most"),
    (["history", "--fleet", "--db", "postgresql://pf@[::1/preflight"], "--db / $PREFLIGHT_DB: 'postgresql://pf@[::1/"),
    (["history", "--fleet", "--db", "postgresql://pf@[fe80::1%eth0/preflight"], "Invalid IPv6 URL"),
])
def test_bad_store_input_is_refused_with_the_option_named(argv, message, capsys):
    code, out, err = run(capsys, *argv)
    assert code == 2 and message in " ".join(err.split()), err
    assert "Traceback" not in out + err


def test_prune_with_an_age_before_1970_deletes_nothing(store_url, tmp_path, capsys):
    code, _, _ = run(capsys, "analyze", str(EXAMPLE), "--out", str(tmp_path / "r"), "-q", "--no-html", "--db", store_url)
    assert code == 1
    code, _, err = run(capsys, "history", "prune", "--keep", "999999d", "--db", store_url)
    assert code == 2 and "--keep" in err
    code, out, _ = run(capsys, "history", "gpu007", "--since", "3650d", "--json", "--db", store_url)
    assert code == 0 and len(json.loads(out)["runs"]) == 1


def test_an_import_of_a_folder_without_a_report_is_refused(store_url, tmp_path, capsys):
    empty, runs = tmp_path / "empty", tmp_path / "runs"
    (empty / "not-a-run").mkdir(parents=True)
    run(capsys, "analyze", str(EXAMPLE), "--out", str(runs), "-q", "--no-html", "--no-db")
    code, out, err = run(capsys, "history", "import", str(runs), str(empty), "--db", store_url)
    assert code == 2 and f"history import: {empty}: no report.json" in err and "recorded" not in out
    # Refused before anything is written: the good folder named beside it was not recorded either.
    code, _, err = run(capsys, "history", "gpu007", "--since", "3650d", "--db", store_url)
    assert code == 2  # the store holds no run (or was never made)
