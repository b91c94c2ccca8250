"""Wall time of `preflight run` (static probes) against clush and a plain OpenSSH loop.

    sudo python3 bench/bench_run.py [--sizes 8,32,64] [--repeat 3]

Builds a simulated cluster (tests/simcluster.py: one network namespace and a real sshd per
host, every probe answered with recorded real output), then runs the same commands three
ways and prints wall-clock seconds (best of --repeat) and ratios:
- preflight: `preflight run --hosts ...` with every static probe (what a default run does,
  active tests excluded), bundle and reports written;
- clush: ClusterShell's `clush -w HOSTS -f 64` running the same commands as one `;`-joined
  command per host (its best case: one connection per host);
- ssh loop: `for h in hosts; do ssh h "<same command>"; done`, sequentially, the glue
  script preflight replaces;
- fabric group: a bare fabric `ThreadingGroup` over the same ssh config running the same
  `;`-joined command (the transport preflight is built on, with nothing saved or judged).
Needs root (namespaces). Numbers depend on the machine: record them with its size and date.
"""

from __future__ import annotations

import argparse
import os
import platform
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
    return [p for p in PROBES.values() if not getattr(p, "active", False)]


# `python3 -c _FABRIC_GROUP SSH_CONFIG COMMAND HOST...`: the bare transport, one command per host.
_FABRIC_GROUP = """\
import sys
from fabric import Config, ThreadingGroup
config = Config(runtime_ssh_path=sys.argv[1])
config.load_ssh_config()
ThreadingGroup(*sys.argv[3:], config=config).run(sys.argv[2], hide=True, warn=True)
"""


def timed(cmd: list[str] | str, shell: bool = False) -> float:
    t0 = time.monotonic()
    subprocess.run(cmd, shell=shell, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.monotonic() - t0


def bench(n: int, repeat: int, work: Path) -> dict[str, float]:
    hosts = [SimHost(f"node{i:03d}", commands=dict(REPLIES)) for i in range(n)]
    with SimCluster(hosts, work / f"sim{n}") as cluster:
        names = [h.name for h in hosts]
        compound = "; ".join(remote_command(p.argv, 30) for p in static_probes())
        ssh = ["ssh", "-F", str(cluster.ssh_config), "-o", "BatchMode=yes"]
        runs = {
            "preflight": lambda i: timed([sys.executable, "-m", "preflight", "run", "--hosts", str(cluster.hosts_file),
                                          "--ssh-config", str(cluster.ssh_config), "--out", str(work / "reports"),
                                          "--run-id", f"b{n}-{i}", "-q", "--quick"]),
            "clush": lambda i: timed(["clush", "-f", "64", "-w", ",".join(names),
                                      "-O", f"ssh_options=-F {cluster.ssh_config} -oBatchMode=yes", compound]),
            "ssh loop": lambda i: timed(" ; ".join(f"{shlex.join(ssh + [h, compound])} >/dev/null" for h in names),
                                        shell=True),
            "fabric group": lambda i: timed([sys.executable, "-c", _FABRIC_GROUP, str(cluster.ssh_config),
                                             compound, *names]),
        }
        return {name: min(fn(i) for i in range(repeat)) for name, fn in runs.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8,32,64")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_run.py needs root (it builds network namespaces)")
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"# {platform.node()} {os.cpu_count()} cores, python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d')}; {len(static_probes())} static probes per host; best of {args.repeat}")
    print(f"{'hosts':>5} {'preflight s':>12} {'clush s':>9} {'ssh loop s':>11} {'fabric group s':>15} "
          f"{'preflight/clush':>16} {'preflight/fabric':>17}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            r = bench(n, args.repeat, Path(tmp))
            print(f"{n:>5} {r['preflight']:>12.2f} {r['clush']:>9.2f} {r['ssh loop']:>11.2f} "
                  f"{r['fabric group']:>15.2f} {r['preflight'] / r['clush']:>16.2f} "
                  f"{r['preflight'] / r['fabric group']:>17.2f}", flush=True)


if __name__ == "__main__":
    main()
