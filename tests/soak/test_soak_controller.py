"""The `preflight soak` controller (preflight/soak: plan, ship, follow, merge, controller) with
real agents on this machine and, marked root, over SSH on the simulated cluster.

The agents get NVML from ``FakeNvml`` (tests/fake_nvml.py: the real H200 burn replayed) through
their test hook ``--fake-nvml``, and run the ``none`` engine (no torch here); the endpoint soak
loads a port where nothing listens. What a node receives is only what ``agent_bundle`` ships:
every agent here runs from the directory the bundle was unpacked into.
"""

from __future__ import annotations

import ast
import base64
import io
import json
import os
import signal
import socket
import sys
import tarfile
import time
from pathlib import Path

import pytest
from agent_runs import AGENT, heartbeat, read_csv, wait_for
from fake_nvml import FAKE_HOOK, SAMPLES
from nodes import nic_counters, nic_sysfs
from rich.console import Console
from simcluster import SimHost

from preflight.app.cli import build_parser
from preflight.app.cli import main as cli_main
from preflight.app.soak_cli import plan_from_args
from preflight.collect.inventory import load_hosts_file
from preflight.collect.local import LocalNode
from preflight.collect.ssh import SshOptions
from preflight.node import records
from preflight.node.agent import parse_args as agent_args_of
from preflight.soak import controller
from preflight.soak.analysis import analyze_soak
from preflight.soak.follow import Mirror, node_status
from preflight.soak.merge import merge_soak
from preflight.soak.plan import SoakPlan
from preflight.soak.ship import _START, NODE_FILES, agent_bundle

NODE = AGENT.parent
SHIPPED = ["agent.py", "agent_options.py", "records.py", "sampler.py", "burn.py", "ib_snapshots.py", "vllm_engine.py",
           "vllm_log.py", "loadgen.py", "loadgen_config.py", "loadgen_bench.py", "loadgen_http.py", "loadgen_windows.py"]


def local_plan(tmp_path: Path, seconds: float, run_id: str = "run1") -> SoakPlan:
    return SoakPlan(run_id=run_id, out=tmp_path / "reports", engine="none", seconds=seconds, interval_s=0.1,
                    local_name="gpu-local", node_dir=str(tmp_path / "node"), agent_args=("--fake-nvml", FAKE_HOOK),
                    poll_s=0.1)


def quiet_console():
    return Console(file=io.StringIO(), width=200)


def test_local_soak_runs_detached_and_merges(tmp_path):
    plan = local_plan(tmp_path, seconds=0.3)
    console = quiet_console()
    started = controller.start(plan, console)
    assert started[0].ok and "agent pid" in started[0].detail
    outcome = controller.follow(plan, console, started)
    assert outcome.outcomes == {"gpu-local": ("finished", None)} and not outcome.failed
    run_dir = plan.run_dir
    node_copy = run_dir / "soak" / "gpu-local"
    # The mirror is byte for byte the node's directory.
    node_dir = tmp_path / "node" / "run1"
    for name in ("telemetry.csv", "throughput.csv", "events.csv", "heartbeat.json", "soak.json"):
        assert (node_copy / name).read_bytes() == (node_dir / name).read_bytes(), name
    meta = json.loads((run_dir / "soak.json").read_text())
    assert meta["format"] == "preflight-soak/1" and meta["hosts"] == ["gpu-local"] and meta["engine"] == "none"
    assert meta["agents"]["gpu-local"]["outcome"] == "finished"
    rows = read_csv(run_dir / "telemetry.csv")
    assert {r["host"] for r in rows} == {"gpu-local"} and {r["gpu"] for r in rows} == {"0", "1"}
    # GPU 1 replays the capture from t=7 s: the power-capped burn (0x4, ~690 W of 700 W).
    assert {r["clocks_event_reasons"] for r in rows if r["gpu"] == "1"} == {"4"}
    # The merged directory is what preflight.soak.analysis reads.
    section = analyze_soak(run_dir).soak_section()["gpu-local"]
    assert section["engine"] == "none" and section["max_temperature_c"] >= 63


def test_controller_death_then_attach_collects(tmp_path, capsys):
    plan = local_plan(tmp_path, seconds=0.3)
    controller.start(plan, quiet_console())  # ...and the controller "dies" here: nobody watches
    node_dir = tmp_path / "node" / "run1"
    wait_for(lambda: (heartbeat(node_dir) or {}).get("state") == "finished")
    code = cli_main(["soak", "--attach", "run1", "--out", str(plan.out), "-q"])
    out = capsys.readouterr().out
    assert code == 0, out
    # -q: one line, the verdicts counted and where the report is (issue 34); the agent's outcome
    # is in the soak's own record.
    assert out.splitlines() == [f"1 pass — report in {plan.run_dir}"]
    assert json.loads((plan.run_dir / "soak.json").read_text())["agents"]["gpu-local"]["outcome"] == "finished"
    assert read_csv(plan.run_dir / "telemetry.csv") and json.loads((plan.run_dir / "soak.json").read_text())["hosts"]


def test_agent_killed_mid_run_loses_at_most_one_interval(tmp_path):
    plan = local_plan(tmp_path, seconds=60)
    started = controller.start(plan, quiet_console())
    node_dir = tmp_path / "node" / "run1"
    beat = wait_for(lambda: (b := heartbeat(node_dir)) and b["ticks"] >= 3 and b)
    os.kill(beat["pid"], signal.SIGKILL)
    killed_at = time.time()
    outcome = controller.follow(plan, quiet_console(), started)
    assert outcome.outcomes["gpu-local"][0] == "died" and outcome.failed
    on_node = (node_dir / "telemetry.csv").read_text()
    assert on_node.endswith("\n")  # whole lines only
    assert (plan.run_dir / "soak" / "gpu-local" / "telemetry.csv").read_text() == on_node
    rows = read_csv(plan.run_dir / "telemetry.csv")
    last = heartbeat(node_dir)
    assert last["state"] == "running"
    # Rows go out before the heartbeat, so the file holds at least what the last heartbeat
    # counted, up to that heartbeat's own tick: only the tick in flight at the kill is lost.
    assert len(rows) >= last["rows"] >= 6 and {r["power_limit_w"] for r in rows} == {"700.0"}
    assert float(rows[-1]["time"]) >= last["now_epoch"] - 0.1
    assert killed_at - float(rows[-1]["time"]) < 1.0  # (a loose bound: this machine may be busy)


@pytest.mark.parametrize("argv, error", [
    (["--engine", "vllm"], "--engine vllm needs --model (built-in: llama-3-70b-dense"),
    (["--engine", "burn", "--model", "tiny-llama-ci"], "--model does not apply to --engine burn"),
    (["--engine", "vllm", "--model", "tiny-llama-ci", "--endpoint", "http://127.0.0.1:8000"],
     "--endpoint does not apply to --engine vllm"),
    (["--engine", "endpoint"], "--engine endpoint needs --endpoint URL"),
])
def test_cli_checks_the_serving_options(tmp_path, capsys, argv, error):
    assert cli_main(["soak", "--local", "--out", str(tmp_path), *argv]) == 2
    assert error in capsys.readouterr().err.replace("\n", "")
    assert not list(tmp_path.iterdir())


def test_plan_passes_the_serving_options_to_the_agent_as_argv():
    args = build_parser().parse_args([
        "soak", "--local", "--engine", "vllm", "--model", "tiny-llama-ci", "--vllm-python", "/venv/bin/python3",
        "--vllm-arg=--enforce-eager", "--vllm-arg", "--kv-cache-dtype fp8", "--concurrency", "16",
        "--no-skip-tokenizer-init"])
    plan = plan_from_args(args, "gpu01", "r1")
    assert plan.engine == "vllm" and plan.builtin_model == "tiny-llama-ci"
    assert plan.agent_args == ("--model=tiny-llama-ci", "--vllm-python=/venv/bin/python3", "--vllm-arg=--enforce-eager",
                               "--vllm-arg=--kv-cache-dtype fp8", "--no-skip-tokenizer-init", "--concurrency=16")
    # ... which the agent reads back, each --vllm-arg split like a shell line.
    agent_args = agent_args_of(["--engine", "vllm", *plan.agent_args])
    assert agent_args.vllm_arg == ("--enforce-eager", "--kv-cache-dtype", "fp8")
    assert (agent_args.model, agent_args.concurrency, agent_args.skip_tokenizer_init) == ("tiny-llama-ci", 16, False)
    endpoint = plan_from_args(build_parser().parse_args(["soak", "--endpoint", "http://10.0.0.5:8000"]),
                                         "gpu01", "r2")
    assert (endpoint.engine, endpoint.agent_args, endpoint.builtin_model) == (
        "endpoint", ("--endpoint=http://10.0.0.5:8000",), None)
    assert SoakPlan.from_json(plan.to_json(), plan.out) == plan


def test_plan_passes_the_ib_interval_to_the_agent():
    plan = plan_from_args(build_parser().parse_args(["soak", "--local", "--ib-interval", "60"]), "gpu01", "r1")
    assert plan.agent_args == ("--ib-interval=60.0",)
    assert agent_args_of(list(plan.agent_args)).ib_interval == 60.0
    off = plan_from_args(build_parser().parse_args(["soak", "--local", "--ib-interval", "0"]), "gpu01", "r2")
    assert agent_args_of(list(off.agent_args)).ib_interval == 0.0
    # Left out, the agent's own default applies.
    assert plan_from_args(build_parser().parse_args(["soak", "--local"]), "gpu01", "r3").agent_args == ()


def test_a_sweep_sets_the_length_and_the_slos_set_goodput():
    args = build_parser().parse_args([
        "soak", "--local", "--engine", "vllm", "--model", "tiny-llama-ci", "--sweep", "32,64,128", "--step-minutes",
        "10", "--warmup-requests", "8", "--range-ratio", "0.25", "--slo", "ttft_p99=800ms", "--slo", "ttft_p50=300ms",
        "--slo", "tpot_p99=50ms"])
    plan = plan_from_args(args, "gpu01", "r1")
    assert plan.seconds == 3 * 600
    assert plan.agent_args == ("--model=tiny-llama-ci", "--sweep=32,64,128", "--warmup-requests=8",
                               "--range-ratio=0.25", "--goodput=ttft:300", "--goodput=tpot:50")
    agent = agent_args_of(["--engine", "vllm", *plan.agent_args])
    assert (agent.sweep, agent.warmup_requests, agent.range_ratio) == ((32, 64, 128), 8, 0.25)
    assert agent.goodput == (("ttft", 300.0), ("tpot", 50.0))
    # --goodput given wins over the SLOs; a request rate goes through with its burstiness.
    args = build_parser().parse_args(["soak", "--endpoint", "http://10.0.0.5:8000", "--goodput", "e2el:2000",
                                      "--slo", "ttft_p99=1s", "--request-rate", "20", "--burstiness", "0.5"])
    assert plan_from_args(args, "gpu01", "r2").agent_args == (
        "--endpoint=http://10.0.0.5:8000", "--request-rate=20.0", "--burstiness=0.5", "--goodput=e2el:2000")


@pytest.mark.parametrize(("argv", "error"), [
    (["--sweep", "32,64", "--minutes", "5"], "--sweep sets the soak's length"),
    (["--step-minutes", "5"], "--step-minutes goes with --sweep"),
    (["--sweep", "32,64", "--request-rate", "5"], "--sweep steps the concurrency"),
    (["--sweep", "32,x"], "--sweep: expected comma-separated whole numbers"),
    (["--goodput", "itl:5"], "--goodput: expected KEY:MS"),
    (["--goodput", "ttft:5", "--goodput", "ttft:6"], "--goodput: ttft given twice"),
    (["--range-ratio", "1"], "--range-ratio: must be in [0, 1)"),
])
def test_cli_checks_the_load_options(tmp_path, capsys, argv, error):
    with pytest.raises(SystemExit) if error.startswith(("--sweep: ", "--goodput: exp", "--range")) else _no_raise():
        code = cli_main(["soak", "--local", "--out", str(tmp_path), "--endpoint", "http://127.0.0.1:9", *argv])
        assert code == 2
    assert error in capsys.readouterr().err.replace("\n", "")
    assert not list(tmp_path.iterdir())


class _no_raise:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_agent_bundle_carries_the_engines_and_the_model_and_nothing_escapes(tmp_path):
    bundle = agent_bundle("tiny-llama-ci")
    with tarfile.open(fileobj=io.BytesIO(bundle)) as tar:
        assert tar.getnames() == [*SHIPPED, "models/tiny-llama-ci.json"]
        assert tar.extractfile("agent.py").read() == AGENT.read_bytes()
        for name in tar.getnames():
            assert tar.extractfile(name).read() == (NODE / name).read_bytes(), name
    node = LocalNode("gpu-local")
    # A bundle naming a path outside the run directory is refused before anything runs.
    evil = io.BytesIO()
    with tarfile.open(fileobj=evil, mode="w") as tar:
        info = tarfile.TarInfo("../escaped.py")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    reply = node.run([sys.executable, "-c", _START, str(tmp_path / "node"), "r1", "--engine", "none"],
                     stdin=evil.getvalue(), timeout=60)
    assert reply.exit_code == 1 and "refusing '../escaped.py'" in reply.stderr
    assert not (tmp_path / "node" / "escaped.py").exists()



def _siblings_imported(path: Path) -> set[str]:
    """The files of preflight/node that ``path`` imports, by plain name or relative import."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names |= {a.name for a in node.names} if node.level and not node.module else {node.module or ""}
    return {f"{n}.py" for n in names if (NODE / f"{n}.py").is_file()}


def test_the_bundle_holds_every_sibling_a_shipped_module_imports():
    # A node has the bundle and python3, nothing else: a sibling left out of NODE_FILES would
    # only show on a node (the agent runs here from the repository, where all of them are).
    assert [name for name in SHIPPED if name != "agent.py"] == list(NODE_FILES)
    for name in SHIPPED:
        missing = _siblings_imported(NODE / name) - set(SHIPPED)
        assert not missing, f"{name} imports {missing}, which preflight soak does not ship"


def test_endpoint_soak_that_nothing_answers_fails_through_the_controller(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    plan = SoakPlan(run_id="ep1", out=tmp_path / "reports", engine="endpoint", seconds=30, interval_s=0.1,
                               local_name="gpu-local", node_dir=str(tmp_path / "node"), poll_s=0.1,
                               agent_args=("--fake-nvml", FAKE_HOOK, f"--endpoint=http://127.0.0.1:{port}"))
    console = quiet_console()
    outcome = controller.follow(plan, console, controller.start(plan, console))
    state, note = outcome.outcomes["gpu-local"]
    assert state == "failed" and note.startswith(f"load generator against http://127.0.0.1:{port}: ")
    node_dir = tmp_path / "node" / "ep1"
    assert sorted(p.name for p in node_dir.glob("*.py")) == sorted(SHIPPED)
    # The load generator's log came back with the rest.
    assert (plan.run_dir / "soak" / "gpu-local" / "loadgen.log").read_bytes() == (node_dir / "loadgen.log").read_bytes()
    assert json.loads((plan.run_dir / "soak.json").read_text())["engine"] == "endpoint"


def test_node_status_names_the_hottest_gpu_and_active_reasons():
    # Two rows of the capture: t=0.0 idle (43 C, 345 MHz, 0x0) and t=30.22 burn (65 C, 1455 MHz, 0x4).
    idle, busy = SAMPLES[0], next(s for s in SAMPLES if s["t"] == 30.22)
    rows = {0: {"temperature_c": str(idle["temp"]), "sm_clock_mhz": str(idle["sm"]), "clocks_event_reasons": "0"},
            1: {"temperature_c": str(busy["temp"]), "sm_clock_mhz": str(busy["sm"]), "clocks_event_reasons": "4"}}
    s = node_status("gpu01", "running", {"elapsed_s": 30.2, "planned_s": 3600}, rows, {"tflops": 674.0}, None)
    assert s.hottest == (1, 65.0) and s.lowest_sm == (0, 345.0) and s.reasons == ("sw_power_cap",)
    assert s.throughput == (("tflops", 674.0),)


@pytest.mark.root
def test_soak_over_ssh_on_the_simulated_cluster(tmp_path, sim_cluster):
    cluster = sim_cluster([SimHost("gpu01"), SimHost("gpu02"), SimHost("gpu03", down=True)])
    hosts = load_hosts_file(cluster.hosts_file)
    plan = SoakPlan(
        run_id="ssh1", out=tmp_path / "reports", engine="none", seconds=0.3, interval_s=0.1, hosts=tuple(hosts),
        ssh=SshOptions(ssh_config=cluster.ssh_config, identity=cluster.identity, known_hosts=cluster.known_hosts),
        python=sys.executable, agent_args=("--fake-nvml", FAKE_HOOK), poll_s=0.1)
    console = quiet_console()
    started = {s.host: s for s in controller.start(plan, console)}
    assert started["gpu01"].ok and started["gpu02"].ok
    assert not started["gpu03"].ok and "connection refused" in started["gpu03"].detail
    outcome = controller.follow(plan, console, list(started.values()))
    assert {h: o[0] for h, o in outcome.outcomes.items()} == {"gpu01": "finished", "gpu02": "finished",
                                                             "gpu03": "not started"}
    meta = json.loads((plan.run_dir / "soak.json").read_text())
    assert meta["hosts"] == ["gpu01", "gpu02"] and "gpu03" in meta["missing"]
    rows = read_csv(plan.run_dir / "telemetry.csv")
    assert {r["host"] for r in rows} == {"gpu01", "gpu02"}
    # Each node kept its files in its own home directory (~/.cache/preflight/soak/ssh1).
    assert started["gpu01"].detail.endswith("/hosts/gpu01/home/.cache/preflight/soak/ssh1")
    assert "engine none" in (plan.run_dir / "soak" / "gpu01" / "agent.log").read_text()


@pytest.mark.root
def test_a_soak_reads_each_nodes_rdma_counters_and_judges_what_grew_during_it(tmp_path, sim_cluster):
    # Every node has the real mlx5 counters of tests/nodes.py (8 NICs, /sys/class overlay); on
    # gpu02, once its agent has taken its "before" reading, mlx5_3 port 1's symbol_error goes
    # 0 -> 500 and link_downed 0 -> 1 (constructed, written into the overlay's lower layer, which
    # the node's /sys/class shows). gpu03 has no overlay: this machine's /sys/class, which holds no
    # RDMA device here.
    sysfs = {**nic_sysfs("gpu01"), **nic_counters()}
    cluster = sim_cluster([SimHost("gpu01", sysfs=sysfs), SimHost("gpu02", sysfs={**nic_sysfs("gpu02"),
                                                                                 **nic_counters()}),
                           SimHost("gpu03")])
    hosts = load_hosts_file(cluster.hosts_file)
    plan = SoakPlan(
        run_id="ib1", out=tmp_path / "reports", engine="none", seconds=3.0, interval_s=0.1, hosts=tuple(hosts),
        ssh=SshOptions(ssh_config=cluster.ssh_config, identity=cluster.identity, known_hosts=cluster.known_hosts),
        python=sys.executable, agent_args=("--fake-nvml", FAKE_HOOK, "--ib-interval=0.5"), poll_s=0.2)
    console = quiet_console()
    started = controller.start(plan, console)
    assert all(s.ok for s in started)
    node_file = cluster.workdir_of("gpu02") / "home" / ".cache" / "preflight" / "soak" / "ib1" / "ib-counters.txt"
    wait_for(lambda: node_file.exists() and "# end" in node_file.read_text())
    lower = cluster.workdir_of("gpu02") / "sysfs" / "infiniband" / "mlx5_3" / "ports" / "1" / "counters"
    (lower / "symbol_error").write_text("500\n")
    (lower / "link_downed").write_text("1\n")
    outcome = controller.follow(plan, console, started)
    assert {h: o[0] for h, o in outcome.outcomes.items()} == {"gpu01": "finished", "gpu02": "finished",
                                                             "gpu03": "finished"}
    readings = (plan.run_dir / "ib-counters.txt").read_text()
    assert "host=gpu02" in readings and "/sys/class/infiniband/mlx5_3/ports/1/counters/symbol_error:500" in readings
    assert controller.analyze_and_show(outcome, console)  # something failed
    report = json.loads((plan.run_dir / "report.json").read_text())
    found = {f["host"]: f for f in report["findings"] if f["check"] == "soak-ib-counters"}
    assert found["gpu01"]["status"] == "pass" and "8 active port(s)" in found["gpu01"]["summary"]
    assert found["gpu02"]["status"] == "fail"
    assert "mlx5_3 port 1 link_downed +1 (0 -> 1)" in found["gpu02"]["summary"]
    assert "mlx5_3 port 1 symbol_error +500 (0 -> 500" in found["gpu02"]["summary"]
    if not Path("/sys/class/infiniband").exists():  # gpu03 sees this machine's own /sys/class
        assert found["gpu03"]["status"] == "skip" and found["gpu03"]["summary"].startswith("no RDMA device")
    assert report["soak"]["gpu02"]["ib_counters"]["flaps"] == ["mlx5_3 port 1"]
    causes = {d["cause"] for d in report["diagnoses"] if "gpu02" in d["hosts"]}
    assert {"ib-link-flapping", "ib-link-errors"} <= causes
    assert not {d["cause"] for d in report["diagnoses"] if "gpu01" in d["hosts"] or "gpu03" in d["hosts"]} & {
        "ib-link-flapping", "ib-link-errors"}


def test_merge_maps_other_headers_and_drops_a_cut_last_line(tmp_path):
    # Host a: the agent's full columns; host b: the contract's twelve only (as a converted DCGM
    # dump would have), its copy cut mid-line; host c: never delivered a soak.json.
    run_dir = tmp_path / "run9"
    rows = [records.GpuSample(time=1000.0 + s["t"], host="a", gpu=0, temperature_c=s["temp"], sm_clock_mhz=s["sm"],
                                 memory_clock_mhz=s["mem"], power_w=s["power_w"], power_limit_w=700.0,
                                 utilization_pct=s["util"], clocks_event_reasons=s["reasons"], slowdown_temperature_c=89)
            for s in SAMPLES[:20]]
    for host in ("a", "b", "c"):
        (run_dir / "soak" / host).mkdir(parents=True)
    for host in ("a", "b"):
        (run_dir / "soak" / host / "soak.json").write_text(json.dumps(
            {"format": "preflight-soak/1", "engine": "burn", "started": f"2026-11-29T10:0{'ab'.index(host)}:00+00:00",
             "hosts": [host], "gpus": {host: [{"gpu": 0, "slowdown_c": 89}]}}))
    header = records.csv_text([records.TELEMETRY_COLUMNS])
    (run_dir / "soak" / "a" / "telemetry.csv").write_text(header + records.row_text(rows))
    b_lines = [",".join(line.split(",")[:12]).replace(",a,", ",b,", 1)
               for line in (header + records.row_text(rows[:5])).splitlines()]
    (run_dir / "soak" / "b" / "telemetry.csv").write_text("\n".join(b_lines) + "\n" + b_lines[-1][:17])
    meta = merge_soak(run_dir, {"a": ("finished", None), "b": ("died", "killed"),
                                           "c": ("unreachable", "connect timed out")})
    assert meta["hosts"] == ["a", "b"] and meta["started"] == "2026-11-29T10:00:00+00:00"
    assert meta["missing"] == {"c": "connect timed out"} and meta["agents"]["b"]["outcome"] == "died"
    merged = read_csv(run_dir / "telemetry.csv")
    assert len(merged) == 25 and list(merged[0]) == list(records.TELEMETRY_COLUMNS)
    b = [r for r in merged if r["host"] == "b"]
    assert [r["power_w"] for r in b] == [str(s["power_w"]) for s in SAMPLES[:5]]
    assert all(r["slowdown_temperature_c"] == "" for r in b)
    assert read_csv(run_dir / "throughput.csv") == []  # nobody wrote one: header only


def test_mirror_follows_byte_offsets_across_a_cut_line_and_a_new_controller(tmp_path):
    rows = [records.GpuSample(time=1000.0 + s["t"], host="h", gpu=0, temperature_c=s["temp"], sm_clock_mhz=s["sm"],
                                 power_w=s["power_w"], clocks_event_reasons=s["reasons"]) for s in SAMPLES[:6]]
    text = (records.csv_text([records.TELEMETRY_COLUMNS]) + records.row_text(rows)).encode()
    cut = text.index(b"\n") + 20  # inside the first data row

    def pulled(start, end):
        return {"telemetry.csv": {"offset": start, "size": end,
                                  "data": base64.b64encode(text[start:end]).decode()}}

    first = Mirror(tmp_path / "copy")
    assert first.apply(pulled(0, cut)) == {"telemetry.csv": []} and first.caught_up
    second = Mirror(tmp_path / "copy")  # the controller died; --attach starts a new one
    assert second.sizes["telemetry.csv"] == cut
    got = second.apply(pulled(cut, len(text)))["telemetry.csv"]
    assert [r["power_w"] for r in got] == [str(s["power_w"]) for s in SAMPLES[:6]]
    assert (tmp_path / "copy" / "telemetry.csv").read_bytes() == text
