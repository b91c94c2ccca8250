"""What a check can answer, read from its code (preflight/app/check_scan.py), on checks written for the
test: the statuses and symptoms of the functions, constants and helper modules it reaches, and only
those (two checks in one file keep their own words)."""

from __future__ import annotations

from preflight.app.check_scan import check_words
from preflight.diagnose.engine import load_knowledge
from preflight.judge.loader import load_dir

HELPER = '''
from preflight.check import warn

def slow_links(host):
    return warn("links slow", symptoms=["ib-link-degraded"])
'''

CHECKS = '''
from preflight.check import error, fail, host_check, ok, skip

from ._links import slow_links

DOWN = ["nvlink-down"]


def _judge(host):
    if host.name == "x":
        return fail("links down", symptoms=DOWN)
    return ok("fine")


@host_check("scan-one", facts=["smi"], summary="one")
def one(host):
    if host.name == "y":
        return skip("not here")
    return _judge(host)


@host_check("scan-two", facts=["smi"], summary="two")
def two(host):
    if host.name == "z":
        return error("cannot tell", symptoms=["probe-unreadable"])
    return slow_links(host)
'''


def test_each_check_gets_the_words_of_the_code_it_reaches(tmp_path):
    folder = tmp_path / "scanchecks"
    folder.mkdir()
    (folder / "_links.py").write_text(HELPER)
    (folder / "links.py").write_text(CHECKS)
    kb = load_knowledge()
    found = {c.id: check_words(c, kb) for c in load_dir(folder, "preflight_scan_test_checks")}
    one, two = found["scan-one"], found["scan-two"]
    assert one.statuses == ("pass", "fail", "skip") and one.symptoms == ("nvlink-down",)
    assert "nvlink-down" in one.causes
    assert two.statuses == ("warn", "error") and two.symptoms == ("ib-link-degraded", "probe-unreadable")
    assert {"ib-link-degraded", "probe-unreadable"} <= set(two.causes)
