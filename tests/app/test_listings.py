"""`preflight checks`, `facts` and `explain --list`: one record per line when piped, --json for scripts
(issue 27). capsys is not a terminal, as a pipe or a file is not."""

from __future__ import annotations

import json

from preflight.app.cli import main
from preflight.collect.probes import PROBES
from preflight.diagnose.engine import load_knowledge
from preflight.judge.facts import FACTS
from preflight.judge.loader import load_checks


def _out(capsys, argv: list[str]) -> str:
    assert main(argv) == 0
    return capsys.readouterr().out


def test_checks_piped_are_one_line_per_check_never_wrapped(capsys):
    # Before: rich wrapped each summary at 80 columns and put facts/probes on lines of their own,
    # so a line starting at column 0 was not always a check.
    lines = _out(capsys, ["checks"]).splitlines()
    checks = load_checks()
    assert [line.split("\t")[0] for line in lines] == [c.id for c in checks]
    by_id = {c.id: c for c in checks}
    for line in lines:
        cid, scope, facts, probes, summary = line.split("\t")
        c = by_id[cid]
        assert (scope, facts, probes, summary) == (c.scope, ",".join(c.facts), ",".join(c.probes), c.summary)
    assert any(len(line) > 120 for line in lines)  # long summaries stay on their line


def test_facts_piped_are_one_line_per_fact(capsys):
    lines = _out(capsys, ["facts"]).splitlines()
    public = [n for n in FACTS if not n.endswith("_evidence")]
    assert [line.split("\t")[0] for line in lines] == public
    [nics] = [line for line in lines if line.startswith("nics\t")]
    assert nics.split("\t")[1] == "ibv-devinfo,ibstat,mlxfwmanager,ib-sysfs,ethtool-i"  # catalogue order


def test_facts_read_as_text_not_as_a_docstring(capsys):
    # Issue 34: ``SmiReport`` and the docstring's indentation ("missing     only") were printed as is.
    docs = {f["name"]: f["doc"] for f in json.loads(_out(capsys, ["facts", "--json"]))}
    assert docs["topo"] == "`TopoMatrix` from `nvidia-smi topo -m`."
    for name, doc in docs.items():
        assert "``" not in doc and "  " not in doc and "\n" not in doc, name
    for line in _out(capsys, ["facts"]).splitlines():
        assert "``" not in line and "  " not in line


def test_explain_list_piped_is_id_tab_title(capsys):
    lines = _out(capsys, ["explain", "--list"]).splitlines()
    kb = load_knowledge()
    assert [tuple(line.split("\t")) for line in lines] == [(c, kb.causes[c].title) for c in sorted(kb.causes)]


def test_checks_json_has_every_check_with_what_it_reads(capsys):
    got = json.loads(_out(capsys, ["checks", "--json"]))
    assert [c["id"] for c in got] == [c.id for c in load_checks()]
    [nvlink] = [c for c in got if c["id"] == "nvlink"]
    assert nvlink == {"id": "nvlink", "scope": "host", "summary": nvlink["summary"],
                      "facts": ["nvlink_status", "topo", "gpu_census"],
                      "probes": ["nvidia-smi-q-x", "nvidia-smi-q", "nvidia-smi-topo", "nvidia-smi-nvlink-status"],
                      "source": "checks/nvlink.py"}
    assert all(p in PROBES for c in got for p in c["probes"])


def test_facts_json(capsys):
    got = {f["name"]: f for f in json.loads(_out(capsys, ["facts", "--json"]))}
    assert set(got) == {n for n in FACTS if not n.endswith("_evidence")}
    assert got["smi"]["probes"] == ["nvidia-smi-q-x", "nvidia-smi-q"] and got["smi"]["doc"]


def test_explain_list_json_carries_each_cause_in_full(capsys):
    got = json.loads(_out(capsys, ["explain", "--list", "--json"]))
    kb = load_knowledge()
    assert [c["id"] for c in got] == sorted(kb.causes)
    [fw] = [c for c in got if c["id"] == "nic-fw-driver-mismatch"]
    cause = kb.causes["nic-fw-driver-mismatch"]
    assert fw["actions"] == list(cause.actions) and fw["meaning"] == cause.meaning
    assert fw["pointed_to_by"][0] == "nic-fw-driver-mismatch reported by a check (high)"


def test_explain_one_cause_json(capsys):
    got = json.loads(_out(capsys, ["explain", "gpu-missing", "--json"]))
    assert got["id"] == "gpu-missing" and got["title"] == load_knowledge().causes["gpu-missing"].title


def test_explain_unknown_cause_json_exits_2(capsys):
    assert main(["explain", "no-such-cause", "--json"]) == 2
    assert "unknown cause 'no-such-cause'" in capsys.readouterr().err
