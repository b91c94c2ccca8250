"""The check loader: marked functions found in checks folders, helpers beside a check importable,
bad checks refused at load with the file, the function and the reason, and every probe a check
needs derived from the facts it names."""

from __future__ import annotations

import textwrap

import pytest
from ctx import make_host
from nodes import h200_node_xml

from preflight.app.cli import main
from preflight.collect.probes import PROBES
from preflight.judge.facts import FACTS, probes_of
from preflight.judge.loader import CheckLoadError, load_checks, load_dir

HELPER = """\
    PINNED = "580."

    def pinned(version):
        return version.startswith(PINNED)
"""
CHECK = """\
    from preflight.check import fail, host_check, ok

    from ._pin import pinned

    @host_check("driver-pin", facts=["smi"], summary="the site's pinned driver")
    def driver_pin(host):
        v = host.smi.driver_version
        if pinned(v):
            return ok(f"driver {v}")
        return fail(f"driver {v} is not the pinned branch", symptoms=["driver-version-drift"],
                    action="install driver 580.126.20, reboot")
"""


def write(folder, files):
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(textwrap.dedent(text))
    return folder


def test_a_check_imports_the_helper_beside_it_and_runs(tmp_path):
    d = write(tmp_path / "mychecks", {"_pin.py": HELPER, "driver_pin.py": CHECK})
    [check] = load_dir(d, "preflight_test_checks_sibling")
    assert (check.id, check.scope, check.facts) == ("driver-pin", "host", ("smi",))
    assert check.probes == ("nvidia-smi-q-x", "nvidia-smi-q")  # from the fact, in catalogue order
    assert check.origin.endswith("driver_pin.py: driver_pin()")
    good = check.func(make_host({"nvidia-smi-q-x": h200_node_xml(8)}))
    bad = check.func(make_host({"nvidia-smi-q-x": h200_node_xml(8, driver="570.1")}))
    assert good.status.value == "pass" and bad.status.value == "fail"
    assert bad.action == "install driver 580.126.20, reboot" and bad.data == {}


def test_the_cli_runs_a_checks_dir_check_with_a_helper(tmp_path):
    from test_cli import read_report, write_bundle

    d = write(tmp_path / "mychecks", {"_pin.py": HELPER, "driver_pin.py": CHECK})
    b = write_bundle(tmp_path / "b", {"a": {"nvidia-smi-q-x": h200_node_xml(8)},
                                      "b": {"nvidia-smi-q-x": h200_node_xml(8, driver="570.1")}})
    assert main(["analyze", str(b), "--checks-dir", str(d), "--checks", "driver-pin",
                 "--out", str(tmp_path / "out"), "-q"]) == 1
    findings = [f for f in read_report(tmp_path / "out")["findings"] if f["check"] == "driver-pin"]
    assert [(f["host"], f["status"]) for f in findings] == [("a", "pass"), ("b", "fail")]
    assert findings[1]["data"] == {"action": "install driver 580.126.20, reboot"}


def test_loading_twice_or_importing_a_check_declares_nothing_twice(tmp_path):
    d = write(tmp_path / "c", {"_pin.py": HELPER, "driver_pin.py": CHECK,
                               "reexport.py": "from .driver_pin import driver_pin\n"})
    assert [c.id for c in load_dir(d, "preflight_test_twice")] == ["driver-pin"]
    assert [c.id for c in load_dir(d, "preflight_test_twice")] == ["driver-pin"]


@pytest.mark.parametrize("body, reason", [
    ('@host_check("x", facts=["smy"], summary="s")\ndef x(host): pass\n', "reads unknown fact(s) smy"),
    ('@host_check("x", probes=["nvidia-smi-qq"], summary="s")\ndef x(host): pass\n',
     "needs unknown probe(s) nvidia-smi-qq"),
    ('@host_check("x", facts=["smi"], summary="s")\ndef x(): pass\n', "a check takes one argument"),
    ('raise RuntimeError("boom")\n', "RuntimeError: boom"),
])
def test_a_bad_check_is_refused_at_load_naming_the_file_and_why(tmp_path, body, reason):
    d = write(tmp_path / "bad", {"broken.py": "from preflight.check import host_check\n" + body})
    with pytest.raises(CheckLoadError) as exc:
        load_dir(d, f"preflight_test_bad_{abs(hash(body))}")
    assert str(d / "broken.py") in str(exc.value) and reason in str(exc.value)


def test_a_duplicate_id_is_refused_naming_both_places(tmp_path):
    d = write(tmp_path / "dup", {"gpu.py": (
        "from preflight.check import host_check\n"
        "@host_check('gpu-inventory', facts=['smi'], summary='mine')\ndef mine(host): pass\n")})
    with pytest.raises(CheckLoadError) as exc:
        load_checks([d], use_entry_points=False)
    assert "check id 'gpu-inventory' defined twice" in str(exc.value)
    assert "checks/gpu_inventory.py" in str(exc.value) and str(d / "gpu.py") in str(exc.value)


def test_a_bad_checks_dir_is_a_usage_error(tmp_path, capsys):
    d = write(tmp_path / "bad", {"broken.py": "import no_such_module_anywhere\n"})
    assert main(["checks", "--checks-dir", str(d)]) == 2
    err = "".join(capsys.readouterr().err.split())  # the console wraps long lines, even mid-word
    assert f"{d / 'broken.py'}:ModuleNotFoundError:Nomodulenamed'no_such_module_anywhere'" in err


def test_every_fact_is_reachable_from_probes_and_every_probe_is_in_the_catalogue():
    for name, fact in FACTS.items():
        assert set(fact.needs) <= FACTS.keys(), name
        assert probes_of([name]) <= PROBES.keys(), name
    assert probes_of(["nics"]) == {"ibv-devinfo", "ibstat", "ib-sysfs", "ethtool-i", "mlxfwmanager"}


def test_built_in_checks_read_only_the_facts_they_declare():
    """Run every built-in host check over the example fleet's hosts (healthy and faulty) and
    record which facts it asks for: each must be among the facts it declared, or those they
    build on, so the probes the run collects for it are the ones it needs."""
    from pathlib import Path

    from preflight.evidence.bundle import read_bundle
    from preflight.judge.context import HostContext
    from preflight.knowledge.profiles import load_profiles

    bundle = read_bundle(Path(__file__).resolve().parents[2] / "examples" / "h200-fleet")
    profile = load_profiles()["hgx-h200"].chosen("test")
    asked: list[str] = []
    original = HostContext.__getattr__

    def spy(self, name):
        asked.append(name)
        return original(self, name)

    checked = 0
    for check in load_checks(use_entry_points=False):
        if check.scope != "host":
            continue
        closure, stack = set(check.facts), list(check.facts)
        while stack:
            declared = FACTS[stack.pop()]
            for need in declared.needs + declared.reads:
                if need not in closure:
                    closure.add(need)
                    stack.append(need)
        for host in bundle.hosts:
            asked.clear()
            HostContext.__getattr__ = spy
            try:
                check.func(HostContext(host, bundle.probes_of(host), profile))
            except Exception:  # noqa: BLE001 - a missing fact ends the check; what it asked is recorded
                pass
            finally:
                HostContext.__getattr__ = original
            undeclared = {a for a in asked if a in FACTS} - closure
            assert not undeclared, f"{check.id} on {host} reads undeclared fact(s) {sorted(undeclared)}"
            checked += bool(asked)
    assert checked > 50


def test_facts_command_lists_each_fact_with_its_probes(capsys):
    assert main(["facts"]) == 0
    out = capsys.readouterr().out
    [nics] = [line.split("\t") for line in out.splitlines() if line.startswith("nics\t")]
    assert nics[2].startswith("`Nic` records")  # the docstring's RST quotes made plain (issue 34)
    assert nics[1] == "ibv-devinfo,ibstat,mlxfwmanager,ib-sysfs,ethtool-i"  # catalogue order
    assert "smi_evidence" not in out
