"""Rebuild the example bundle examples/h200-fleet from the simulated nodes of tests/nodes.py.

    sudo python3 examples/build_examples.py

The example is what `preflight run` saw on a fleet of nine HGX H200 nodes: five healthy, and
one fault each from the issues the checks were built for:

    gpu006  ConnectX-7 firmware older than its DOCA driver ships, mlx5 command timeouts in the
            kernel log, and an all_reduce that hangs every other run (the field lesson)
    gpu007  one NVLink of GPU2 inactive
    gpu008  another GPU driver than the rest of the fleet
    gpu009  down: SSH connection refused

It is made the way a real one is: the nodes run in a simulated cluster (tests/simcluster.py:
network namespaces with a real sshd each, answering every probe with the node's recorded
outputs) and `preflight run --hosts` writes the bundle over SSH, with preflight's own bundle
writer. That needs what the end-to-end tests need: root, iproute2 and openssh-server. Each
node's outputs are real captures or derivations of them (tests/nodes.py, tests/derived.py);
examples/h200-fleet/SOURCES.tsv names, per host and probe, the capture and every fault edit.
The bundle is committed so that `preflight analyze examples/h200-fleet` works on a fresh
install with no cluster; this script exists so it can be re-made and reviewed.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The simulated nodes live with the tests; this script builds the example from them.
sys.path.insert(0, str(HERE.parent / "tests"))

import nodes  # noqa: E402 - after the sys.path line above
from simcluster import SimCluster, SimHost  # noqa: E402 - after the sys.path line above

from preflight.app.cli import main  # noqa: E402 - after the sys.path line above
from preflight.collect.probes import PROBES  # noqa: E402 - after the sys.path line above

OLD_FW = "28.45.1020"  # what DOCA 3.0.0 ships; the nodes run DOCA 3.1.0 (28.46.1006)
# host -> the faults applied to its healthy node, in order: (function, keyword arguments)
FLEET: dict[str, list[tuple]] = {
    **{f"gpu00{i}": [] for i in range(1, 6)},
    "gpu006": [(nodes.nic_firmware, {"firmware": OLD_FW}), (nodes.mlx5_timeouts, {"nic": 0}),
               (nodes.nccl_flaky, {})],
    "gpu007": [(nodes.nvlink_inactive, {"gpu": 2, "link": 5})],
    "gpu008": [(nodes.gpu_driver, {"version": "570.195.03"})],
}
DOWN = "gpu009"
RUN = ["--nccl-reps", "3", "--nccl-timeout", "5", "--nccl-max-bytes", "8G"]
# Which recorded command lines (tests/nodes.py) each probe's output comes from.
PROBE_LINES = {**{pid: [" ".join(p.argv)] for pid, p in PROBES.items() if p.argv[0] != "sh"},
               "ib-sysfs": ["sysfs"], "ethtool-i": [nodes.ETHTOOL], "kernel-log": [nodes.DMESG],
               "nccl-all-reduce": [nodes.SMI_L, "all_reduce_perf"]}


def build_node(name: str, faults: list[tuple]) -> tuple[SimHost, dict[str, list[str]]]:
    """The node, and per recorded command line the faults that changed its output."""
    node = nodes.healthy_h200(name)
    edits: dict[str, list[str]] = {}
    for fault, kwargs in faults:
        before = node
        node = fault(node, **kwargs)
        label = f"{fault.__name__}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
        changed = [line for line in node.commands if node.commands[line] != before.commands.get(line)]
        changed += ["sysfs"] if node.sysfs != before.sysfs else []
        for line in changed:
            edits.setdefault(_key(line), []).append(label)
    return node, edits


def _key(line: str) -> str:
    return "all_reduce_perf" if line.startswith("all_reduce_perf ") else line


def sources(host: str, probe: str, edits: dict[str, list[str]]) -> str:
    parts = []
    for line in PROBE_LINES.get(probe, []):
        origin = nodes.ORIGIN[_key(line)]
        faults = edits.get(_key(line))
        parts.append(origin + (f"; then {' + '.join(faults)} (tests/nodes.py)" if faults else ""))
    return " | ".join(parts) or "(no recorded command)"


def build(target: Path) -> None:
    built = {name: build_node(name, faults) for name, faults in FLEET.items()}
    hosts = [node for node, _ in built.values()] + [SimHost(DOWN, down=True)]
    with tempfile.TemporaryDirectory(prefix="h200-fleet-") as work:
        work = Path(work)
        with SimCluster(hosts, work) as cluster:
            code = main(["run", "--hosts", str(cluster.hosts_file), "--ssh-config", str(cluster.ssh_config),
                         "--known-hosts", str(cluster.known_hosts), "--identity", str(cluster.identity),
                         "--out", str(work / "reports"), "--run-id", "example", "-q", "--no-html", *RUN])
        if code != 1:
            raise SystemExit(f"expected the faulty fleet to fail (exit 1), got {code}")
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(work / "reports" / "example" / "bundle", target)
    header = json.loads((target / "bundle.json").read_text())
    header["example"] = ("built by examples/build_examples.py from the simulated nodes of tests/nodes.py "
                         "over SSH; sources in SOURCES.tsv")
    (target / "bundle.json").write_text(json.dumps(header, indent=2) + "\n")
    rows = ["host\tprobe\tsource"]
    for host in [*FLEET, DOWN]:
        edits = built[host][1] if host in built else {}
        missing: dict[str, list[str]] = {}  # why there is no output -> probes
        for meta in sorted((target / "hosts" / host).glob("*.json")):
            probe = meta.stem
            if (target / "hosts" / host / f"{probe}.txt").is_file():
                rows.append(f"{host}\t{probe}\t{sources(host, probe, edits)}")
                continue
            why = json.loads(meta.read_text())
            missing.setdefault(str(why.get("error") or why.get("stderr") or why["exit_code"]), []).append(probe)
        for why, probes in missing.items():
            rows.append(f"{host}\t{','.join(probes)}\t(no output: {why})")
    (target / "SOURCES.tsv").write_text("\n".join(rows) + "\n")


if __name__ == "__main__":
    build(HERE / "h200-fleet")
    print("wrote", HERE / "h200-fleet")
