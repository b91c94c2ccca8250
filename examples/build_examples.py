"""Rebuild the example bundles under examples/ from the real captures in tests/fixtures/corpus.

    python examples/build_examples.py

Each host of an example is a real capture (or one derived from a real capture, see
tests/derived.py); examples/<name>/SOURCES.tsv says which file each probe output came from.
The bundles are committed so that `preflight analyze examples/<name>` works on a fresh
install with no cluster; this script exists so they can be re-made and reviewed.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from derived import CORPUS, h200_node_xml  # noqa: E402

CREATED = "2026-11-29T09:30:00+00:00"


def corpus(rel: str) -> tuple[bytes, str]:
    return (CORPUS / rel).read_bytes(), f"tests/fixtures/corpus/{rel}"


def derived(gpus: int = 8, driver: str | None = None) -> tuple[bytes, str]:
    what = f"tests/derived.py h200_node_xml(gpus={gpus}, driver={driver!r}) from h200-vm/smi-q.xml"
    return h200_node_xml(gpus, driver).encode(), what


# host -> probe id -> (bytes, source) for a clean run, or a dict: the probe's .json alone.
H200_FLEET = {
    "gpu001": {"nvidia-smi-q-x": derived()},
    "gpu002": {"nvidia-smi-q-x": derived()},
    "gpu003": {"nvidia-smi-q-x": derived()},
    "gpu004": {"nvidia-smi-q-x": derived(gpus=7)},
    "gpu005": {"nvidia-smi-q-x": derived(driver="570.195.03")},
    "gpu006": {"nvidia-smi-q-x": {"command": ["nvidia-smi", "-q", "-x"], "exit_code": 127,
                                  "stderr": "sh: 1: nvidia-smi: not found", "timed_out": False}},
    "gpu007": {"nvidia-smi-q-x": {"command": ["nvidia-smi", "-q", "-x"], "exit_code": None, "timed_out": False,
                                  "error": "connection refused: [Errno None] Unable to connect to port 22 on gpu007"}},
    "h200-vm": {"nvidia-smi-q": corpus("h200-vm/smi-q.txt")},
}


def build(name: str, hosts: dict) -> None:
    root = HERE / name
    shutil.rmtree(root, ignore_errors=True)
    (root / "hosts").mkdir(parents=True)
    (root / "bundle.json").write_text(json.dumps(
        {"format": "preflight-bundle/1", "created": CREATED, "hosts": list(hosts),
         "example": f"built by examples/build_examples.py; sources in SOURCES.tsv"}, indent=2) + "\n")
    sources = ["host\tprobe\tsource"]
    for host, probes in hosts.items():
        d = root / "hosts" / host
        d.mkdir()
        for probe, content in probes.items():
            if isinstance(content, dict):
                (d / f"{probe}.json").write_text(json.dumps(content, indent=2) + "\n")
                sources.append(f"{host}\t{probe}\t(no output: {content.get('error') or content.get('stderr')})")
            else:
                data, source = content
                (d / f"{probe}.txt").write_bytes(data)
                sources.append(f"{host}\t{probe}\t{source}")
    (root / "SOURCES.tsv").write_text("\n".join(sources) + "\n")


if __name__ == "__main__":
    build("h200-fleet", H200_FLEET)
    print("wrote", HERE / "h200-fleet")
