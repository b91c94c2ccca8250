"""The agent's readings of the RDMA counters (preflight/node/ib_snapshots.py, and the agent's
loop): a sysfs tree built from the real mlx5 capture (tests/fixtures/corpus/ibcounters, provenance
in MANIFEST.tsv: one file per counter with the captured value, and a port state added), read
back as the ``ib-counters`` probe's lines; and the agent taking readings before, during and after
its soak, with a counter that grows mid-soak (constructed: the test's engine rewrites one file
after its third poll).
"""

from __future__ import annotations

import json
from pathlib import Path

from fake_nvml import FakeNvml

from preflight.node import agent as soak_agent
from preflight.node.agent import NoEngine
from preflight.node.ib_snapshots import IB_COUNTERS_TXT, read_lines
from preflight.parse.ib_counters import parse_ib_counters, parse_ib_series

CAPTURE = Path(__file__).parents[1] / "fixtures" / "corpus" / "ibcounters" / \
    "mlx5-sysfs-counters-saturated-link-downed-xmit-discards-gpud943.txt"


def sysfs_tree(tmp_path: Path) -> Path:
    """``tmp/infiniband/mlx5_1/ports/1/...`` holding the capture's counters, one file each."""
    root = tmp_path / "infiniband"
    for line in CAPTURE.read_text().splitlines():
        path, _, value = line.rpartition(":")
        target = root / path.split("/infiniband/", 1)[1]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(value + "\n")
    port = root / "mlx5_1" / "ports" / "1"
    (port / "state").write_text("4: ACTIVE\n")
    (port / "phys_state").write_text("5: LinkUp\n")
    (port / "link_layer").write_text("InfiniBand\n")
    (port / "hw_counters").mkdir()
    (port / "hw_counters" / "out_of_buffer").write_text("0\n")
    return root


def test_a_reading_is_the_probes_lines_and_parses_like_the_capture(tmp_path):
    root = sysfs_tree(tmp_path)
    lines = read_lines(root)
    assert all(line.startswith(f"{root}/mlx5_1/ports/1/") for line in lines)
    (port,) = parse_ib_counters("\n".join(lines)).ports
    (captured,) = parse_ib_counters(CAPTURE.read_text()).ports
    assert port.counters == captured.counters and port.counters["link_downed"] == 255
    assert (port.state, port.phys_state, port.hw_counters) == ("ACTIVE", "LINKUP", {"out_of_buffer": 0})
    assert read_lines(tmp_path / "nothing-here") == []  # no RDMA device: no line


class GrowingEngine(NoEngine):
    """The none engine, except that the fabric sees 500 symbol errors after its third poll."""

    def __init__(self, counter: Path):
        self.counter, self.polls = counter, 0

    def poll(self, host, final=False):
        self.polls += 1
        if self.polls == 3:
            self.counter.write_text("500\n")
        return [], []


def test_the_agent_reads_before_during_and_after_and_sees_the_growth(tmp_path):
    root = sysfs_tree(tmp_path)
    counter = root / "mlx5_1" / "ports" / "1" / "counters" / "symbol_error"
    out = tmp_path / "soak"
    out.mkdir()
    cfg = soak_agent.AgentConfig(out=out, host="gpu01", engine="none", seconds=0.6, interval_s=0.1,
                                 ib_interval_s=0.2, ib_root=root)
    agent = soak_agent.Agent(cfg, lambda: FakeNvml(gpus=1), engine_factory=lambda c, g: GrowingEngine(counter))
    assert agent.run() == 0
    readings = parse_ib_series((out / IB_COUNTERS_TXT).read_text()).of("gpu01")
    phases = [r.phase for r in readings]
    assert phases[0] == "before" and phases[-1] == "after" and "during" in phases
    symbol = [r.snapshot.ports[0].counters["symbol_error"] for r in readings]
    assert symbol[0] == 0 and symbol[-1] == 500
    assert json.loads((out / "soak.json").read_text())["ib_interval_s"] == 0.2


def test_interval_zero_reads_nothing(tmp_path):
    cfg = soak_agent.AgentConfig(out=tmp_path, host="gpu01", engine="none", seconds=0.2, interval_s=0.1,
                                 ib_interval_s=0, ib_root=sysfs_tree(tmp_path))
    assert soak_agent.Agent(cfg, lambda: FakeNvml(gpus=1)).run() == 0
    assert not (tmp_path / IB_COUNTERS_TXT).exists()


def test_the_interval_option_is_checked(capsys):
    assert soak_agent.parse_args(["--ib-interval", "0"]).ib_interval == 0
    assert soak_agent.parse_args([]).ib_interval == 300
    for bad in ("-1", "nan", "inf"):
        try:
            soak_agent.parse_args(["--ib-interval", bad])
        except SystemExit as exc:
            assert exc.code == 2
        else:
            raise AssertionError(f"--ib-interval {bad} accepted")
    assert "--ib-interval: must be 0 or more seconds" in capsys.readouterr().err
