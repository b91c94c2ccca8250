"""The user's guide as a site: `mkdocs build --strict` passes (so a broken link, a missing page or a
page left out of the nav fails the tests, and CI), and the built site works in a real headless
Chromium: every page of the nav loads with its heading, no image is broken, and the search, driven
through the page's own search box code, finds a page.

Skipped without mkdocs (`pip install -e '.[test]'` brings it) or, for the browser, without Debian's
chromium, as tests/report/test_report_html.py is.
"""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import subprocess
import sys
import threading
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

pytest.importorskip("mkdocs", reason="mkdocs not installed (pip install -e '.[test]')")

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BROWSER_S = 90  # the search worker builds its index in the page: ~15 s on a 2-core machine


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          capture_output=True, text=True, timeout=300)


def nav_pages(config: Path = ROOT / "mkdocs.yml") -> list[str]:
    def walk(items):
        for item in items:
            for value in (item.values() if isinstance(item, dict) else [item]):
                if isinstance(value, list):
                    yield from walk(value)
                else:
                    yield value

    return list(walk(yaml.safe_load(config.read_text())["nav"]))


def page_url(md: str) -> str:
    """Where mkdocs puts a page (use_directory_urls): bring-up.md -> bring-up/, index.md -> ./"""
    stem = md.removesuffix(".md")
    return "./" if stem == "index" else ("" if stem.endswith("/index") else f"{stem}/")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site") / "site"
    done = build(ROOT / "mkdocs.yml", out)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}{done.stderr}"
    return out


def _checkout_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "checkout"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    return copy


def test_the_site_builds_strict_with_every_nav_page(site):
    for md in nav_pages():
        assert (site / page_url(md) / "index.html").is_file(), md
    index = json.loads((site / "search" / "search_index.json").read_text())
    located = {doc["location"].split("#")[0] for doc in index["docs"]}
    assert {page_url(md).removeprefix("./") for md in nav_pages()} <= located


@pytest.mark.parametrize("damage, said", [
    ("link", "nope.md"),
    ("page", "troubleshooting.md"),
    ("anchor", "#no-such-section"),
    ("image", "images/missing.png"),
])
def test_a_broken_link_or_a_missing_page_fails_the_build(tmp_path, damage, said):
    copy = _checkout_copy(tmp_path)
    page = copy / "docs" / "bring-up.md"
    if damage == "link":
        page.write_text(page.read_text() + "\nSee [nothing](nope.md).\n")
    elif damage == "page":
        (copy / "docs" / "troubleshooting.md").unlink()
    elif damage == "anchor":
        page.write_text(page.read_text() + "\nSee [nothing](slurm.md#no-such-section).\n")
    else:
        page.write_text(page.read_text() + "\n![gone](images/missing.png)\n")
    done = build(copy / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0 and said in done.stdout + done.stderr


class _Images(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.srcs: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.srcs.append(dict(attrs).get("src") or "")


def test_every_image_a_page_shows_is_in_the_site(site):
    shown = 0
    for page in site.rglob("index.html"):
        parser = _Images()
        parser.feed(page.read_text())
        for src in parser.srcs:
            assert not src.startswith(("http:", "https:", "//")), f"{page}: {src} is fetched from outside"
            assert (page.parent / src).resolve().is_file(), f"{page.relative_to(site)}: {src}"
            shown += 1
    assert shown >= 1  # the report picture of bring-up.md


# ---- a real browser ------------------------------------------------------------------------------

HARNESS = """<!DOCTYPE html><html><body><script>
// Loads each page in a same-origin frame: its title, heading and images; then drives the search as
// a reader does (index.html?q=...: the theme fills its search box and asks the search worker).
const pages = PAGES, query = QUERY, out = {pages: {}, search: null, query: null};
function load(url) {
  return new Promise(resolve => {
    const f = document.createElement("iframe");
    f.style.width = "1200px"; f.style.height = "800px";
    f.onload = () => resolve(f);
    f.src = url;
    document.body.appendChild(f);
  });
}
async function main() {
  for (const p of pages) {
    const f = await load(p), d = f.contentDocument, imgs = [...d.images];
    await Promise.all(imgs.map(i => i.complete ? null : new Promise(r => { i.onload = i.onerror = r; })));
    out.pages[p] = {title: d.title, h1: (d.querySelector("h1") || {}).textContent || null,
                    images: imgs.length, broken: imgs.filter(i => !i.naturalWidth).map(i => i.src)};
    f.remove();
  }
  const f = await load("index.html?q=" + encodeURIComponent(query));
  const results = () => f.contentDocument.getElementById("mkdocs-search-results");
  // until the worker has answered: articles, or the theme's "No results found"
  while (!(results() && results().firstElementChild)) await new Promise(r => setTimeout(r, 200));
  out.query = f.contentDocument.getElementById("mkdocs-search-query").value;
  out.search = [...results().querySelectorAll("article h3 a")].map(a => a.getAttribute("href"));
}
main().catch(e => { out.error = String(e); }).finally(() =>
  fetch("/_result", {method: "POST", body: JSON.stringify(out)}));
</script></body></html>
"""


def _serve(root: Path, received: dict):
    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the harness posts what it saw
            received["result"] = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (Debian: apt-get install -y chromium)")
def test_the_site_in_headless_chromium(site, tmp_path):
    served = tmp_path / "served"
    shutil.copytree(site, served)  # the harness page goes beside the site, not into it
    pages = [page_url(md) for md in nav_pages()]
    # A control: a copy of one page with an image that is not there, which the browser must report.
    control = served / "control"
    control.mkdir()
    (control / "index.html").write_text((served / "index.html").read_text().replace(
        "<h1", '<img src="../images/not-there.png" alt="x"><h1', 1).replace('href="./', 'href="../'))
    pages.append("control/")
    # A word of the Slurm page (what Slurm does to a job whose prolog fails).
    (served / "_check.html").write_text(
        HARNESS.replace("PAGES", json.dumps(pages)).replace("QUERY", json.dumps("requeues")))
    received: dict = {}
    server = _serve(served, received)
    url = f"http://127.0.0.1:{server.server_address[1]}/_check.html"
    browser = subprocess.Popen([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                                f"--user-data-dir={tmp_path / 'profile'}", url],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + BROWSER_S
        while "result" not in received and time.monotonic() < deadline and browser.poll() is None:
            time.sleep(0.2)
    finally:
        browser.terminate()
        browser.wait(timeout=30)
        server.shutdown()
    got = received.get("result")
    assert got is not None, f"the browser reported nothing within {BROWSER_S} s"
    assert "error" not in got, got.get("error")
    titles = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert titles["site_name"] == "preflight"
    assert [src.rsplit("/", 1)[1] for src in got["pages"]["control/"]["broken"]] == ["not-there.png"]
    for page in pages[:-1]:
        seen = got["pages"][page]
        assert seen["h1"], f"{page}: no heading"
        assert seen["title"].endswith("preflight"), seen
        assert seen["broken"] == [], f"{page}: broken images {seen['broken']}"
    assert got["pages"]["bring-up/"]["images"] >= 1
    assert got["query"] == "requeues"
    assert any(href.startswith("./slurm/") for href in got["search"]), got["search"]
