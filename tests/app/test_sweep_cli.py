"""``preflight sweep``'s command lines: what the pass writes for the node is what the node's
``sweep --job`` accepts, the steps it runs there are ``run``'s and ``soak``'s own options, the
job's script quotes every word, bad usage exits 2 naming what is wrong, and the shipped systemd
unit's ExecStart is a command line the CLI accepts."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from preflight.app import sweep_cli
from preflight.app.cli import build_parser, main
from preflight.collect import slurm_sweep
from preflight.lifecycle.sweep_policy import SweepPolicy

ROOT = Path(__file__).resolve().parents[2]
SYSTEMD = ROOT / "examples" / "systemd"


def test_what_the_pass_writes_for_the_node_is_what_the_node_accepts():
    policy = SweepPolicy(partition="sweep", dcgm_level=3, checks=("dcgm-diag", "nccl-all-reduce"), burn_min=5,
                         budget_min=20, run_args=("--nccl-reps=2", "--nccl-timeout=120"), python="/opt/pf/bin/python3")
    argv = sweep_cli.node_argv(policy, "sweep-gpu01-20261203T130000.000")
    assert argv[:3] == ["/opt/pf/bin/python3", "-m", "preflight"]
    args = build_parser().parse_args(argv[3:])
    assert (args.command, args.job, args.dcgm_level, args.checks, args.burn_minutes, args.budget_minutes) == (
        "sweep", "sweep-gpu01-20261203T130000.000", 3, "dcgm-diag,nccl-all-reduce", 5.0, 20.0)
    steps = dict(sweep_cli.job_steps(args))
    run, soak = build_parser().parse_args(steps["checks"][3:]), build_parser().parse_args(steps["burn"][3:])
    assert (run.command, run.local, run.run_id, run.checks, run.dcgm_level, run.nccl_reps, run.nccl_timeout) == (
        "run", True, args.job, "dcgm-diag,nccl-all-reduce", 3, 2, 120.0)
    assert (soak.command, soak.local, soak.engine, soak.minutes, soak.run_id) == (
        "soak", True, "burn", 5.0, f"{args.job}.burn")


def test_no_burn_step_when_the_site_sets_none():
    args = build_parser().parse_args(sweep_cli.node_argv(SweepPolicy(partition="s", burn_min=0), "sweep-n1-x")[3:])
    assert [name for name, _ in sweep_cli.job_steps(args)] == ["checks"]


def test_the_job_script_quotes_every_word_and_runs_one_srun_step():
    body = slurm_sweep.script(["/opt/my python/bin/python3", "-m", "preflight", "--out", "$(reboot)"],
                              "sweep-n1-x", "n1")
    last = body.splitlines()[-1]
    assert last.startswith("exec srun --nodes=1 --ntasks=1 --kill-on-bad-exit=1 ")
    assert shlex.split(last)[5:] == ["/opt/my python/bin/python3", "-m", "preflight", "--out", "$(reboot)"]
    argv = slurm_sweep.sbatch_argv("n1", "sweep-n1-x", 21, 42, "sweep", None, "ops")
    assert {"--exclusive", "--no-requeue", "--nodelist=n1", "--partition=sweep", "--account=ops", "--time=21",
            "--deadline=now+42minutes", "--comment=sweep-n1-x", "--job-name=preflight-sweep"} <= set(argv)


@pytest.mark.parametrize("argv, message", [
    (["sweep"], "sweep: --slurm"),
    (["sweep", "--slurm"], "sweep --slurm: --site FILE"),
    (["sweep", "--slurm", "--site", "/nonexistent/sweep.yaml"], "/nonexistent/sweep.yaml: no such file"),
    (["sweep", "--job", "retest-n1-x"], "--job retest-n1-x: not a sweep's run id"),
    (["sweep", "--job", "sweep-n1-x", "--slurm"], "--job runs on the node, alone"),
])
def test_bad_usage_exits_2_naming_it(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_the_pass_needs_a_store_the_nodes_share(tmp_path, capsys):
    site = tmp_path / "sweep.yaml"
    site.write_text("format: preflight-sweep/1\npartition: sweep\n")
    assert main(["sweep", "--slurm", "--site", str(site), "--db", f"sqlite:///{tmp_path}/s.sqlite"]) == 2
    assert "the store must be PostgreSQL" in capsys.readouterr().err
    assert not (tmp_path / "s.sqlite").exists()


def test_one_pass_at_a_time(tmp_path, capsys, pg):
    """Another pass holds the store's lock: this one does nothing, not even ask Slurm (there is
    none here: asking would exit 2), and says who holds it."""
    from preflight.app.store_cli import open_store
    from preflight.store import lifecycle as kept
    from preflight.store.location import parse

    url = pg.create_database("sweep_lock")
    with open_store(parse(url), create=True) as store:
        assert kept.take_lock(store, "sweep", "ctl01:4242", 600)
    site = tmp_path / "sweep.yaml"
    site.write_text("format: preflight-sweep/1\npartition: sweep\n")
    assert main(["sweep", "--slurm", "--site", str(site), "--db", url]) == 0
    assert "another sweep pass holds the store's lock (ctl01:4242): nothing done" in capsys.readouterr().out


def test_a_bad_site_file_exits_2_naming_file_and_field(tmp_path, capsys):
    site = tmp_path / "sweep.yaml"
    site.write_text("format: preflight-sweep/1\npartition: sweep\nmax_share: 2\n")
    assert main(["sweep", "--slurm", "--site", str(site)]) == 2
    assert f"{site}: max_share: from 0 to 1, not 2" in capsys.readouterr().err


def _exec_start(unit: Path) -> list[str]:
    lines = [line for line in unit.read_text().splitlines() if line.startswith("ExecStart=")]
    assert len(lines) == 1, unit
    return shlex.split(lines[0][len("ExecStart="):])


def test_the_systemd_units_exec_start_is_a_command_line_the_cli_accepts():
    argv = _exec_start(SYSTEMD / "preflight-sweep.service")
    assert argv[0] == "/opt/preflight/bin/preflight"  # where docs/nodes.md installs it
    args = build_parser().parse_args(argv[1:])
    assert args.command == "sweep" and args.slurm and args.site and not args.job and not args.dry_run
    timer = (SYSTEMD / "preflight-sweep.timer").read_text()
    assert "Unit=preflight-sweep.service" in timer and "OnCalendar=" in timer


def test_the_job_records_nothing_it_cannot_name(monkeypatch, capsys):
    """A store URL that cannot name a store is refused before any step runs."""
    monkeypatch.setenv("PREFLIGHT_DB", "mysql://nope/x")
    ran = []
    monkeypatch.setattr(sweep_cli, "_run_child", lambda *a: ran.append(a) or 0)
    assert main(["sweep", "--job", "sweep-n1-20261203T130000.000"]) == 2
    assert ran == [] and "PREFLIGHT_DB" in capsys.readouterr().err


