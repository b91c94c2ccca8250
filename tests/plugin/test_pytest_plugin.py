"""The pytest plugin, run by pytest's own `pytester` against bundles built from corpus outputs.

The plugin reaches users through the `pytest11` entry point of the installed package
(`pip install -e .`); the inert-run and xdist tests load it that way, the others name it with
`-p` so that unrelated installed plugins stay out of the inner runs.
"""

from __future__ import annotations

import re
import shutil
import xml.etree.ElementTree as ET
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from derived import CORPUS, h200_node_xml
from test_cli import write_bundle

from preflight.app.cli import main

pytest_plugins = ["pytester"]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "acceptance" / "test_cluster_acceptance.py"
A100_8GPU = CORPUS / "nccl-tests" / "a100-sxm4-40gb-8gpu-allreduce-old-format-validation0.txt"
# Pinned so that checks added later do not change the item count; connectivity and probes
# findings come with every reachable host.
CHECKS = "gpu-inventory,persistence-mode,fleet-consistency"


@pytest.fixture
def fleet(tmp_path) -> Path:
    """Seven hosts: two healthy, one a 1-GPU VM (inventory not applicable: skip), one with 7 of
    8 GPUs (fail), one on another driver (fleet-consistency fail), one without nvidia-smi and
    one unreachable (errors). nvidia-smi outputs: tests/derived.py from the real H200 capture."""
    return write_bundle(tmp_path / "bundle", {
        "gpu01": {"nvidia-smi-q-x": h200_node_xml(8)},
        "gpu02": {"nvidia-smi-q-x": h200_node_xml(8)},
        "gpu03": {"nvidia-smi-q-x": h200_node_xml(1)},
        "gpu04": {"nvidia-smi-q-x": h200_node_xml(7)},
        "gpu05": {"nvidia-smi-q-x": h200_node_xml(8, driver="570.195.03")},
        "gpu06": {"nvidia-smi-q-x": {"command": ["nvidia-smi", "-q", "-x"], "exit_code": 127,
                                     "stderr": "sh: 1: nvidia-smi: not found"}},
        "gpu07": {"nvidia-smi-q-x": {"command": ["nvidia-smi", "-q", "-x"], "exit_code": None,
                                     "error": "connection refused: [Errno 111] Unable to connect to port 22"}},
    })


@pytest.fixture(scope="module", autouse=True)
def _imports_before_pytester(tmp_path_factory) -> None:
    """One analysis before any in-process run. pytester removes from sys.modules whatever was
    first imported during its run, and extension modules refuse a second import in one process
    (numpy, which the CLI's soak analysis pulls in, says "cannot load module more than once").
    Module scope: set up before the function-scoped pytester takes its snapshot."""
    bundle = write_bundle(tmp_path_factory.mktemp("warm") / "b", {"gpu01": {"nvidia-smi-q-x": h200_node_xml(8)}})
    main(["analyze", str(bundle), "--out", str(tmp_path_factory.mktemp("warm-out")), "-q"])


@pytest.fixture
def run_pytest(pytester, monkeypatch):
    """pytester.runpytest with this plugin named on the command line and no entry-point plugins.

    Other plugins installed here (hypothesis, benchmark, ...) would load and cost each inner run
    most of a second; the entry point itself is exercised by test_registered_as_a_pytest11_plugin,
    test_inert_without_its_options and the xdist run."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    # The outer session has imported the plugin already (its entry point), so the inner one
    # cannot rewrite its asserts and says so: a warning about the test set-up, not a result.
    return lambda *args: pytester.runpytest("-p", "preflight.pytest.plugin",
                                            "-W", "ignore::pytest.PytestAssertRewriteWarning", *args)


def bundle_args(bundle: Path, out: Path, *extra: str) -> list[str]:
    # OPTION=VALUE: pytest picks its rootdir before plugin options are known, and would take a
    # path given as a separate word for a test path (see the plugin's docstring).
    return [f"--preflight-bundle={bundle}", f"--preflight-checks={CHECKS}", f"--preflight-out={out}", *extra]


def junit_outcomes(path: Path) -> dict[str, str]:
    """testcase name -> passed | failure | error | skipped, from a JUnit file."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        out[case.get("name")] = kinds[0] if kinds else "passed"
    return out


def item(host: str, check: str) -> str:
    return f"test_preflight[{host}-{check}]"


def test_items_follow_the_verdicts(run_pytest, pytester, fleet, tmp_path):
    result = run_pytest(*bundle_args(fleet, tmp_path / "out"), "--junitxml=junit.xml", "-rfEs")
    # 6 reachable hosts x (connectivity, probes, 2 host checks, fleet-consistency) + gpu07's
    # connectivity, its one item (the host checks it could not run are named in it, not items
    # of their own); fleet-consistency compares the 6 reachable ones.
    result.assert_outcomes(passed=24, failed=2, skipped=1, errors=3)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "preflight: 7 hosts (2 errors, 2 fail, 3 pass); reports in *",
        "*_ test_preflight[[]gpu04-gpu-inventory[]] _*",
        "7 of 8 GPUs visible (driver 580.159.04, CUDA 13.0)",
        "cause: gpu-missing (high confidence): Fewer GPUs than the platform has",
        "action: Look for Xid 79 *",
        "evidence [[]nvidia-smi-q-x[]]:",
        "    <attached_gpus>7</attached_gpus>",
    ])
    result.stdout.fnmatch_lines([
        "*- preflight diagnoses -*",
        "driver-version-drift (high) on gpu05: move gpu05 to driver 580.159.04 *",
        "*short test summary info*",
        "ERROR preflight::test_preflight[[]gpu06-gpu-inventory[]] - PreflightError: *",
        "SKIPPED [[]1[]] *report.json: 1 x NVIDIA H200 *no GPU count to compare with*",
    ], consecutive=False)

    outcomes = junit_outcomes(pytester.path / "junit.xml")
    assert len(outcomes) == 30
    assert {name for name, kind in outcomes.items() if kind != "passed"} == {
        item("gpu03", "gpu-inventory"), item("gpu04", "gpu-inventory"), item("gpu05", "fleet-consistency"),
        item("gpu06", "gpu-inventory"), item("gpu06", "persistence-mode"),
        item("gpu07", "connectivity"),
    }
    assert outcomes[item("gpu04", "gpu-inventory")] == "failure"
    assert outcomes[item("gpu05", "fleet-consistency")] == "failure"
    assert outcomes[item("gpu03", "gpu-inventory")] == "skipped"
    assert outcomes[item("gpu07", "connectivity")] == outcomes[item("gpu06", "gpu-inventory")] == "error"

    root = ET.parse(pytester.path / "junit.xml").getroot()
    drift = root.find(f".//testcase[@name='{item('gpu05', 'fleet-consistency')}']")
    assert drift.get("classname") == "preflight"
    message = drift.find("failure").get("message")
    assert message.startswith("driver 570.195.03, the fleet runs 580.159.04")
    assert "cause: driver-version-drift (high confidence)" in message and "action: move gpu05 to driver" in message
    props = {p.get("name"): p.get("value") for p in drift.iter("property")}
    assert props == {"preflight_host": "gpu05", "preflight_check": "fleet-consistency", "preflight_status": "fail"}
    down = root.find(f".//testcase[@name='{item('gpu07', 'connectivity')}']/error")
    assert down.get("message").startswith('failed on setup with "PreflightError: not checked: connection refused')
    assert "2 checks not run: gpu-inventory, persistence-mode" in down.get("message")
    # The run's own reports are there too, written once.
    [run_dir] = (tmp_path / "out").iterdir()
    assert (run_dir / "report.json").is_file() and (run_dir / "junit.xml").is_file()


def test_k_selects_one_host(run_pytest, pytester, fleet, tmp_path):
    result = run_pytest(*bundle_args(fleet, tmp_path / "out"), "-k", "gpu04", "-v")
    result.assert_outcomes(passed=4, failed=1, deselected=25)
    result.stdout.fnmatch_lines(["preflight::test_preflight[[]gpu04-gpu-inventory[]] FAILED*"])
    assert "gpu01" not in "".join(line for line in result.outlines if "PASSED" in line)


def test_x_stops_at_the_first_failure(run_pytest, pytester, fleet, tmp_path):
    result = run_pytest(*bundle_args(fleet, tmp_path / "out"), "-x")
    # Hosts in inventory order: gpu01-gpu03 (14 passed, gpu03's inventory skipped), then gpu04's
    # connectivity and probes pass and its gpu-inventory is the first failure.
    result.assert_outcomes(passed=16, skipped=1, failed=1)
    result.stdout.fnmatch_lines(["*stopping after 1 failures*"])


def test_warn_passes_with_a_warning(run_pytest, pytester, tmp_path):
    # Derived: the real H200 capture with persistence mode turned off on every GPU.
    off = h200_node_xml(8).replace("<persistence_mode>Enabled</persistence_mode>",
                                   "<persistence_mode>Disabled</persistence_mode>")
    assert off != h200_node_xml(8)
    bundle = write_bundle(tmp_path / "b", {"gpu01": {"nvidia-smi-q-x": off}})
    result = run_pytest(*bundle_args(bundle, tmp_path / "out"), "-k", "persistence")
    result.assert_outcomes(passed=1, deselected=3, warnings=1)
    result.stdout.fnmatch_lines(["*PreflightWarning: gpu01 persistence-mode: persistence mode off on 8 of 8 GPUs*"])


def test_registered_as_a_pytest11_plugin():
    [ep] = [ep for ep in entry_points(group="pytest11") if ep.name == "preflight"]
    assert ep.value == "preflight.pytest.plugin"


def test_inert_without_its_options(pytester):
    """Loaded through its entry point, as users get it, and adding nothing to the run."""
    pytester.makepyfile(test_plain="def test_one():\n    assert True\n")

    def lines(*args: str) -> list[str]:
        return [re.sub(r"in [\d.]+s", "in Ts", line) for line in pytester.runpytest("-v", "-rA", *args).outlines]

    def plugin_list(lines: list[str]) -> str:
        return next(line for line in lines if line.startswith("plugins:"))

    with_plugin, without = lines(), lines("-p", "no:preflight")
    assert "preflight" in plugin_list(with_plugin) and "preflight" not in plugin_list(without)
    # pytest's own list of installed plugins is the only line that differs.
    assert [line for line in with_plugin if line != plugin_list(with_plugin)] == \
        [line for line in without if line != plugin_list(without)]
    assert "collecting ... collected 1 item" in with_plugin
    assert any(line.startswith("test_plain.py::test_one PASSED") for line in with_plugin)
    assert not (pytester.path / "reports").exists()


def test_fixtures_skip_without_its_options(run_pytest, pytester):
    pytester.makepyfile(test_contract="def test_contract(preflight_report):\n    assert False\n")
    result = run_pytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([("SKIPPED [[]1[]] test_contract.py:1: needs --preflight-hosts FILE, "
                                  "--preflight-bundle DIR or --preflight-local")])


def test_fixtures_give_the_session_run(run_pytest, pytester, fleet, tmp_path):
    pytester.makepyfile(test_contract="""
        def test_contract(preflight_run, preflight_report):
            assert (preflight_run.run_dir / "report.json").is_file()
            assert preflight_run.data["format"] == "preflight-report/1"
            assert preflight_report is preflight_run.report
            assert preflight_report.host("gpu01").passed
            assert preflight_report.host("gpu04").status == "fail"
            assert [d.hosts for d in preflight_report.diagnoses(cause="gpu-missing")] == [("gpu04",)]
    """)
    result = run_pytest(*bundle_args(fleet, tmp_path / "out"), "-k", "not test_preflight")
    result.assert_outcomes(passed=1, deselected=30)


@pytest.mark.parametrize("extra, message", [
    (["--preflight-local"], "--preflight-bundle and --preflight-local: give only one of them"),
    (["--preflight-identity=key"], "--preflight-identity: only with --preflight-hosts"),
    (["--preflight-profile=hgx-h999"], "preflight: --profile: unknown profile 'hgx-h999'*"),
])
def test_bad_options_are_usage_errors(run_pytest, pytester, fleet, tmp_path, extra, message):
    result = run_pytest(*bundle_args(fleet, tmp_path / "out"), *extra)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])
    assert not (tmp_path / "out").exists()


def test_missing_bundle_is_a_usage_error(run_pytest, pytester, tmp_path):
    result = run_pytest(f"--preflight-bundle={tmp_path / 'nowhere'}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: preflight: *nowhere*"])


def test_local_run_on_this_machine(run_pytest, tmp_path):
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has nvidia-smi: the verdicts below are for one without")
    from preflight.collect.local import local_host_name

    result = run_pytest("--preflight-local", "--preflight-checks=gpu-inventory", f"--preflight-out={tmp_path}", "-rE")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines([f"ERROR preflight::test_preflight[[]{local_host_name()}-gpu-inventory[]] - "
                                 "PreflightError: *"])
    [run_dir] = tmp_path.iterdir()
    assert (run_dir / "bundle" / "bundle.json").is_file()


def test_xdist_runs_preflight_once(pytester, fleet, tmp_path):
    pytest.importorskip("xdist")
    result = pytester.runpytest_subprocess(*bundle_args(fleet, tmp_path / "out"), "-n", "2",
                                           "--junitxml=junit.xml")
    result.assert_outcomes(passed=24, failed=2, skipped=1, errors=3)
    # One analysis, by the controller; the two workers only read its report.
    assert len(list((tmp_path / "out").iterdir())) == 1
    outcomes = junit_outcomes(pytester.path / "junit.xml")
    assert outcomes[item("gpu04", "gpu-inventory")] == "failure"
    assert outcomes[item("gpu07", "connectivity")] == "error"


def test_example_acceptance_suite(run_pytest, pytester, tmp_path):
    """The example suite over two healthy H200 nodes whose nccl-all-reduce output is the real
    8 x A100 run (busbw 235.3 GB/s at 8 GiB, below the 475 of hgx-h200)."""
    shutil.copy(EXAMPLE, pytester.path / EXAMPLE.name)
    probes = {"nvidia-smi-q-x": h200_node_xml(8), "nccl-all-reduce": A100_8GPU.read_text()}
    bundle = write_bundle(tmp_path / "b", {"gpu01": probes, "gpu02": probes})
    result = run_pytest(f"--preflight-bundle={bundle}", f"--preflight-out={tmp_path / 'out'}",
                                "--preflight-checks=gpu-inventory,nccl-all-reduce",
                                "-k", "not test_preflight", "-rA")
    result.assert_outcomes(passed=2, failed=5, deselected=8)
    result.stdout.fnmatch_lines(["PASSED test_cluster_acceptance.py::test_every_host_checked",
                                 "PASSED test_cluster_acceptance.py::test_all_gpus_present"], consecutive=True)
    text = result.stdout.str()
    # Not checked is not accepted: nvlink and the NIC check did not run here.
    assert "{'gpu01': None, 'gpu02': None}" in text
    assert "'gpu01': '235.3 < 475 GB/s'" in text
    # Both soak criteria fail for want of soak data (how often pytest repeats the message
    # depends on its output settings, so the short summary lines are what is checked).
    result.stdout.fnmatch_lines([
        "FAILED test_cluster_acceptance.py::test_soak_one_hour_without_thermal_slowdown*",
        "FAILED test_cluster_acceptance.py::test_soak_throughput_decay_under_5_percent*",
    ])
    assert "AssertionError: no soak results in this report" in text


def test_example_acceptance_suite_names_the_missing_gpu(run_pytest, pytester, fleet, tmp_path):
    shutil.copy(EXAMPLE, pytester.path / EXAMPLE.name)
    result = run_pytest(*bundle_args(fleet, tmp_path / "out"), "-k", "all_gpus_present")
    result.assert_outcomes(failed=1, deselected=36)
    result.stdout.fnmatch_lines(["*'gpu04': 'fail'*"])


@pytest.mark.root
def test_simulated_cluster_fails_exactly_the_faulty_items(run_pytest, pytester, sim_cluster, tmp_path):
    from simcluster import SimHost
    from test_e2e_run import gpu_node

    cluster = sim_cluster([gpu_node("gpu01"), gpu_node("gpu02"), gpu_node("gpu03"),
                           SimHost("gpu04", down=True), gpu_node("gpu05", gpus=7),
                           gpu_node("gpu06", driver="570.195.03")])
    result = run_pytest(
        f"--preflight-hosts={cluster.hosts_file}", f"--preflight-ssh-config={cluster.ssh_config}",
        f"--preflight-known-hosts={cluster.known_hosts}", f"--preflight-identity={cluster.identity}",
        f"--preflight-checks={CHECKS}", f"--preflight-out={tmp_path / 'out'}", "--junitxml=junit.xml")
    outcomes = junit_outcomes(pytester.path / "junit.xml")
    assert {name: kind for name, kind in outcomes.items() if kind != "passed"} == {
        item("gpu04", "connectivity"): "error",
        item("gpu05", "gpu-inventory"): "failure", item("gpu06", "fleet-consistency"): "failure",
    }
    # 5 reachable hosts x 5 items + the unreachable one's one: its connectivity, naming the
    # checks it could not run.
    result.assert_outcomes(passed=23, failed=2, errors=1)
    down = ET.parse(pytester.path / "junit.xml").getroot().find(f".//testcase[@name='{item('gpu04', 'connectivity')}']")
    assert "2 checks not run: gpu-inventory, persistence-mode" in down.find("error").get("message")
    [run_dir] = (tmp_path / "out").iterdir()
    assert (run_dir / "bundle" / "hosts" / "gpu05" / "nvidia-smi-q-x.txt").read_text() == h200_node_xml(7)


def test_a_soak_whose_agent_died_is_not_a_pass_in_pytest_either(run_pytest, pytester, tmp_path):
    # The real five-minute H200 soak (examples/h200-soak-5min) with its agent recorded as died.
    import json
    import shutil

    soak = tmp_path / "soak"
    shutil.copytree(Path(__file__).resolve().parents[2] / "examples" / "h200-soak-5min", soak,
                    ignore=shutil.ignore_patterns("*.png", "*.md"))
    meta = json.loads((soak / "soak.json").read_text())
    meta["agents"]["vm"].update(outcome="died", note="the agent is gone without finishing (killed?)")
    (soak / "soak.json").write_text(json.dumps(meta))
    result = run_pytest(f"--preflight-bundle={soak}", f"--preflight-out={tmp_path / 'out'}", "-p", "no:cacheprovider",
                        "-k", "soak-telemetry", "-rE")
    result.assert_outcomes(errors=1, deselected=6)  # the burn soak's other checks, soak-sdc among them
    result.stdout.fnmatch_lines(["*soak incomplete: agent died*"])
