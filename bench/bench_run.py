"""Wall time of `preflight run` (static probes) against clush and a plain OpenSSH loop.

    sudo python3 bench/bench_run.py [--sizes 8,32,64] [--repeat 3]

Builds a simulated cluster (tests/simcluster.py: one network namespace and a real sshd per
host, every probe answered with recorded real output), then runs the same commands three
ways and prints wall-clock seconds (best of --repeat) and ratios:
- preflight: `preflight run --hosts ... --no-node-runner` with every static probe (what a
  default run does, active tests excluded), bundle and reports written, one channel per probe;
- preflight node-runner: the same with the node runner, the default since issue 14 (one
  channel per node, whose python3 runs the probes);
- clush: ClusterShell's `clush -w HOSTS -f 64` running the same commands as one `;`-joined
  command per host (its best case: one connection per host);
- ssh loop: `for h in hosts; do ssh h "<same command>"; done`, sequentially, the glue
  script preflight replaces;
- fabric group: a bare fabric `ThreadingGroup` over the same ssh config running the same
  `;`-joined command (the transport preflight is built on, with nothing saved or judged);
- bare runner: a fabric `Connection` per host on a thread of its own, running preflight's node
  runner exactly as a run starts it (`python3 -I -S -c BOOT`, the same payload on stdin) on a raw
  channel, reading its output and nothing more: the node-side work of a run with none of the
  controller's (records, bundle, judgement, reports), so that preflight / bare runner is what
  the controller itself adds.
Each contender runs once untimed first, so that every Python reads its bytecode from one cache
as an installed package does. Needs root (namespaces). Numbers depend on the machine: record
them with its size and date.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from derived import CORPUS, h200_node_text, h200_node_xml  # noqa: E402
from simcluster import Reply, SimCluster, SimHost  # noqa: E402

from preflight.collect.fanout import ExecPlan  # noqa: E402
from preflight.collect.node_runner import node_payload  # noqa: E402
from preflight.collect.probes import PROBES  # noqa: E402
from preflight.collect.ssh import remote_command  # noqa: E402

# Recorded replies for every static probe whose tool is shimmed; the sh -c probes (sysfs,
# ethtool loop, dmesg) run their real scripts on the simulated host.
REPLIES = {
    "nvidia-smi -q -x": Reply(h200_node_xml(8)),
    "nvidia-smi -q": Reply(h200_node_text(8)),
    "nvidia-smi topo -m": Reply(CORPUS / "topo/dgx-h100-8gpu-12nic-nv18-drv580-truncated-by-report.txt"),
    "nvidia-smi nvlink --status": Reply(CORPUS / "nvlink/h200-1gpu-drv590-nvlink-s.txt"),
    "nvidia-smi nvlink -e": Reply(CORPUS / "nvlink/h100-nvlink-e-error-counters-zero-excerpt.txt"),
    "ibv_devinfo -v": Reply(CORPUS / "ibv/ibv-devinfo-cx7-roce-fw28.42-h100.txt"),
    "ibstat": Reply(CORPUS / "ibv/ibstat-cx7-ndr-400g-active-ib.txt"),
    "lspci -vvv": Reply(CORPUS / "lspci/cx7-gen5-x16-lnkcap-lnksta-ok-grep.txt"),
    "uname -a": Reply("Linux node 6.8.0-generic #1 SMP x86_64 GNU/Linux\n"),
}


def static_probes():
    # What `run --quick` runs: no active probe, so no second reading "after" them either.
    return [p for p in PROBES.values() if not p.active and not p.after_active]


# `python3 -c _FABRIC_GROUP SSH_CONFIG COMMAND HOST...`: the bare transport, one command per host.
_FABRIC_GROUP = """\
import sys
from fabric import Config, ThreadingGroup
config = Config(runtime_ssh_path=sys.argv[1])
config.load_ssh_config()
ThreadingGroup(*sys.argv[3:], config=config).run(sys.argv[2], hide=True, warn=True)
"""


# `python3 -c _BARE_RUNNER SSH_CONFIG PAYLOAD_FILE HOST...`: the node runner's own cost.
_BARE_RUNNER = """\
import shlex, sys, threading
from fabric import Config, Connection
from preflight.collect.node_runner import runner_argv
config = Config(runtime_ssh_path=sys.argv[1])
config.load_ssh_config()
payload = open(sys.argv[2], "rb").read()
def one(host):
    conn = Connection(host, config=config)
    conn.open()
    chan = conn.client.get_transport().open_session()
    chan.exec_command(shlex.join(runner_argv()))
    chan.sendall(payload)
    chan.shutdown_write()
    while chan.recv(1 << 16):
        pass
    chan.recv_exit_status()
threads = [threading.Thread(target=one, args=(h,)) for h in sys.argv[3:]]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""


# Every contender's Python reads its modules' bytecode from one cache, written by the untimed
# first round, as an installed package's is: a shell with PYTHONDONTWRITEBYTECODE set (or a
# source tree without a writable __pycache__) would otherwise make each run of preflight
# compile its own modules again (0.3 s here), which no user's run pays.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(cmd: list[str] | str, shell: bool = False) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the command and its children): for preflight and the fabric
    group that is the controller alone, the simulated nodes' sshd processes are not its children."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    subprocess.run(cmd, shell=shell, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, env=ENV)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


@contextlib.contextmanager
def fleet(n: int, work: Path):
    """(host names, ssh config, hosts file) of ``n`` simulated hosts: one SimCluster holds at
    most 253 (one /24), so larger fleets are several side by side behind one ssh config."""
    names = [f"node{i:04d}" for i in range(n)]
    with contextlib.ExitStack() as stack:
        clusters = [stack.enter_context(SimCluster([SimHost(name, commands=dict(REPLIES)) for name in chunk],
                                                   work / f"sim{n}-{k}"))
                    for k, chunk in enumerate(names[i:i + 250] for i in range(0, n, 250))]
        ssh_config, hosts_file = work / f"ssh_config-{n}", work / f"hosts-{n}.txt"
        ssh_config.write_text("".join(c.ssh_config.read_text() for c in clusters))
        hosts_file.write_text("".join(f"{name}\n" for name in names))
        yield names, ssh_config, hosts_file


def bench(n: int, repeat: int, work: Path, only: set[str]) -> dict[str, tuple[float, float]]:
    with fleet(n, work) as (names, ssh_config, hosts_file):
        compound = "; ".join(remote_command(p.argv, 30) for p in static_probes())
        payload = work / f"payload-{n}"
        payload.write_bytes(node_payload(ExecPlan(probes=tuple(static_probes()))))
        ssh = ["ssh", "-F", str(ssh_config), "-o", "BatchMode=yes"]
        runs = {
            "preflight": lambda i: timed([sys.executable, "-m", "preflight", "run", "--hosts", str(hosts_file),
                                          "--ssh-config", str(ssh_config), "--out", str(work / "reports"),
                                          "--run-id", f"b{n}-{i}", "-q", "--quick",
                                          "--no-node-runner"]),
            "preflight node-runner": lambda i: timed([
                sys.executable, "-m", "preflight", "run", "--hosts", str(hosts_file), "--ssh-config", str(ssh_config),
                "--out", str(work / "reports"), "--run-id", f"nr{n}-{i}", "-q", "--quick", "--node-runner"]),
            "clush": lambda i: timed(["clush", "-f", "64", "-w", ",".join(names),
                                      "-O", f"ssh_options=-F {ssh_config} -oBatchMode=yes", compound]),
            "ssh loop": lambda i: timed(" ; ".join(f"{shlex.join(ssh + [h, compound])} >/dev/null" for h in names),
                                        shell=True),
            "fabric group": lambda i: timed([sys.executable, "-c", _FABRIC_GROUP, str(ssh_config),
                                             compound, *names]),
            "bare runner": lambda i: timed([sys.executable, "-c", _BARE_RUNNER, str(ssh_config), str(payload),
                                            *names]),
        }
        runs = {name: fn for name, fn in runs.items() if not only or name in only}
        # Interleaved, so that a slow minute of the machine hits every contender alike; the
        # median of each (wall, CPU) pair by wall time.
        got: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
        for fn in runs.values():
            fn("warm")  # untimed: bytecode cached, files in the page cache, as on a second run
        for i in range(repeat):
            for name, fn in runs.items():
                got[name].append(fn(i))
        return {name: sorted(v)[len(v) // 2] for name, v in got.items()}


def row(n: int, r: dict[str, tuple[float, float]]) -> str:
    def cell(name: str, cpu: bool = True) -> str:
        if name not in r:
            return "-"
        wall, used = r[name]
        return f"{wall:.2f} ({used / n * 1e3:.0f})" if cpu else f"{wall:.2f}"

    def ratio(a: str, b: str) -> str:
        return f"{r[a][0] / r[b][0]:.2f}" if a in r and b in r else "-"
    return (f"{n:>5} {cell('preflight'):>16} {cell('preflight node-runner'):>16} {cell('clush'):>16} "
            f"{cell('ssh loop', False):>9} {cell('fabric group'):>16} {cell('bare runner'):>16} "
            f"{ratio('preflight', 'clush'):>9} {ratio('preflight', 'fabric group'):>10} "
            f"{ratio('preflight node-runner', 'fabric group'):>10} {ratio('preflight node-runner', 'bare runner'):>10}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8,32,64")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", default="",
                    help="comma-separated contenders: preflight, preflight node-runner, clush, ssh loop, fabric group, "
                         "bare runner")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_run.py needs root (it builds network namespaces)")
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"# {platform.node()} {os.cpu_count()} cores, python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d')}; {len(static_probes())} static probes per host; "
          f"median of {args.repeat}, interleaved; wall s (controller CPU ms per host)")
    print(f"{'hosts':>5} {'preflight':>16} {'node-runner':>16} {'clush':>16} {'ssh loop':>9} {'fabric group':>16} "
          f"{'bare runner':>16} {'pf/clush':>9} {'pf/fabric':>10} {'nr/fabric':>10} {'nr/bare':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        ENV["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        for n in sizes:
            r = bench(n, args.repeat, Path(tmp), {s for s in args.only.split(",") if s})

            print(row(n, r), flush=True)


if __name__ == "__main__":
    main()
