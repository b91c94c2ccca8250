"""The results store at fleet scale (issue 24): SQLite and PostgreSQL side by side.

    python3 bench/bench_store.py [--nodes 10000] [--days 365] [--writers 1000] [--engines sqlite,postgresql]
                                 [--node-runs 100000] [--keep DIR] [--skip ingest,writers]

Per engine, printed as it goes and as a Markdown table at the end (nothing is asserted):
1. ingest of one --nodes run: the real report `preflight analyze examples/h200-fleet` writes, its
   9 hosts' findings and diagnoses replicated round-robin over gpu00001.., then
   `Store.record(rows_of(report))`, into an empty store and into the full store of 2.;
2. `history --fleet` (`read.fleet`) over --days daily runs of --nodes nodes, generated here with
   a fixed seed and planted repeat offenders, flappers and degraders (found vs planted printed);
3. `history NODE` (`read.node_history`), median of 20 calls on a few nodes;
4. PostgreSQL only: --writers threads recording a single-host report each at once, against a
   server at its default max_connections (100), so the store's connection retry is exercised:
   through the unix socket pgcluster gives, then through TCP on 127.0.0.1 (the server restarted);
5. the store's size per host-run;
6. one node's long past (issue 31, store_long_node.py): a store holding --node-runs healthchecks of one node (every
   5 minutes, about a year at 100,000), then `preflight history NODE` as a user runs it (a new
   process, stdout to a file), as text and as --json, and with an unknown 10,000-character name
   (the did-you-mean lookup).

--keep DIR builds the stores of 2. and 6. there (a SQLite file each, a PostgreSQL cluster) and
reuses them on later runs with the same sizes: the 3.65 M host-run store takes minutes to load.

PostgreSQL is a private cluster (tests/pgcluster.py: fsync and synchronous_commit off), so its
write times are those of a server that does not wait for its disk. Numbers depend on the
machine: record them with its size and date.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import pgcluster  # noqa: E402

# Run as a script, this module is __main__: store_long_node's `from bench_store import` gets it, not a second copy.
sys.modules.setdefault("bench_store", sys.modules[__name__])

from preflight.store import Store, parse  # noqa: E402
from preflight.store.read import Window, fleet, node_history  # noqa: E402
from preflight.store.rows import Rows, RunRow, iso, rows_of  # noqa: E402

DAY = 86400.0
SEED = 24
P_FAIL = 0.005  # a host-run's chance of failing something, outside the planted patterns
BUSBW, NOISE = 475.0, 0.005  # all_reduce busbw (GB/s) and its run-to-run noise, as a fraction
PLANTED = 36  # hosts of each planted pattern
DEGRADED_RUNS = 4  # a degrader's last runs, its busbw lowered by 3-6 %
HISTORY_CALLS = 20
# cause -> (the check that fails with it, its summary, the diagnosis' action)
CAUSES = {
    "gpu-ecc-uncorrectable": ("gpu-memory", "GPU3: 2 volatile uncorrectable ECC errors",
                              "drain the node, reset GPU3; RMA it if the errors return"),
    "nvlink-down": ("nvlink", "GPU2: 1 of 18 links inactive (link 5)", "reset the GPUs; reseat the NVLink tray"),
    "nic-fw-driver-mismatch": ("nic-fw-driver-mismatch", "ConnectX-7: firmware 28.45.1020 older than the driver's",
                               "flash ConnectX-7 firmware 28.46.1006, then reboot"),
    "ib-port-down": ("ib-port-down", "mlx5_3 port 1: DOWN (Polling)", "check the cable and the switch port"),
}


def code_version() -> str:
    """The code measured: preflight/ may be edited while a bench runs, so beside git's HEAD the
    digest of every preflight module this process loaded (read when it starts)."""
    files = sorted(m.__file__ for name, m in sys.modules.items()
                   if name.split(".")[0] == "preflight" and getattr(m, "__file__", None))
    digest = hashlib.sha256(b"".join(Path(f).read_bytes() for f in files)).hexdigest()[:12]
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--", "preflight"], capture_output=True, text=True).stdout
    return f"git {head}{' + uncommitted changes in preflight/' if dirty.strip() else ''}, " \
           f"sha256 of the {len(files)} preflight modules loaded: {digest}"


# ---- the reports ---------------------------------------------------------------------------------
def real_report() -> dict:
    """The report `analyze` writes for the shipped 9-host example (exit 1: it has failing hosts);
    recorded into no store (PREFLIGHT_DB empty), so the bench leaves the user's own alone."""
    with tempfile.TemporaryDirectory() as out:
        proc = subprocess.run([sys.executable, "-m", "preflight", "analyze", "examples/h200-fleet", "--out", out,
                               "-q"], cwd=ROOT, env={**os.environ, "PREFLIGHT_DB": ""}, capture_output=True)
        found = list(Path(out).glob("*/report.json"))
        if proc.returncode not in (0, 1) or len(found) != 1:  # 1 is also Python's exit on a traceback
            raise RuntimeError(f"analyze failed ({proc.returncode}): {proc.stderr.decode(errors='replace')}")
        return json.loads(found[0].read_text())


def names(nodes: int) -> list[str]:
    return [names_at(i) for i in range(nodes)]


def fleet_report(real: dict, nodes: int, run_id: str) -> dict:
    """The real report grown to ``nodes`` hosts: host i is a copy of real host i mod 9, its
    findings with it, each diagnosis naming every copy of the hosts it named."""
    model = list(real["hosts"])
    of = {name: model[i % len(model)] for i, name in enumerate(names(nodes))}
    per_host = defaultdict(list)
    for f in real["findings"]:
        per_host[f.get("host")].append(f)
    findings = [{**f, "host": name} for name, m in of.items() for f in per_host[m]] + per_host[None]
    diagnoses = [{**d, "hosts": [n for n, m in of.items() if m in d["hosts"]]} for d in real["diagnoses"]]
    report = {**real, "run_id": run_id, "hosts": {n: real["hosts"][m] for n, m in of.items()},
              "findings": findings, "diagnoses": diagnoses}
    report.pop("source_run_id", None)  # else every copy would be recorded as the example's run
    return report


def healthcheck_report(real: dict, node: str) -> dict:
    """One node's healthcheck: the real report's first (passing) host alone, renamed."""
    model = next(iter(real["hosts"]))
    report = {**real, "run_id": f"healthcheck-{node}-{int(time.time())}", "kind": "healthcheck",
              "created": iso(time.time()), "hosts": {node: real["hosts"][model]},
              "findings": [{**f, "host": node} for f in real["findings"] if f.get("host") == model],
              "diagnoses": []}
    report.pop("source_run_id", None)
    return report


# ---- the generated year ----------------------------------------------------------------------------
@dataclass
class Plan:
    """Which host fails what on which day, beyond chance; the patterns `history --fleet` must find."""
    nodes: int
    days: int
    checks: str  # the JSON list of check ids every generated run judged
    failures: dict[int, dict[int, str]] = field(default_factory=lambda: defaultdict(dict))  # day -> host -> cause
    offenders: set[str] = field(default_factory=set)
    flappers: set[str] = field(default_factory=set)
    degraders: dict[int, float] = field(default_factory=dict)  # host index -> the fraction its busbw falls


def plan_of(nodes: int, days: int, checks: list[str], rng: random.Random) -> Plan:
    """Repeat offenders: one cause in 4 streaks of 1-3 runs, passes between, in the last 4 weeks;
    flappers: one check failing every other run over the last 12; degraders: busbw down 3-6 %
    in the last DEGRADED_RUNS runs. All inside the 30-day window, so both windows see them."""
    plan = Plan(nodes, days, json.dumps(checks))
    per = min(PLANTED, nodes // 10)  # a small --nodes keeps most of its hosts unplanted
    picked = rng.sample(range(nodes), 3 * per)
    span = min(days, 28)
    gap = span // 4
    for i in picked[:per]:
        cause = rng.choice(list(CAUSES))
        for k in range(4):
            start = days - span + k * gap
            for day in range(start, start + rng.randint(1, max(1, min(3, gap - 1)))):
                plan.failures[day][i] = cause
        plan.offenders.add(names_at(i))
    for i in picked[per:2 * per]:
        cause = rng.choice(list(CAUSES))
        for day in range(max(0, days - 12), days, 2):
            plan.failures[day][i] = cause
        plan.flappers.add(names_at(i))
    for i in picked[2 * per:]:
        plan.degraders[i] = rng.uniform(0.03, 0.06)
    return plan


def names_at(i: int) -> str:
    return f"gpu{i + 1:05d}"


def started_of(plan: Plan, day: int, now: float) -> float:
    """Day ``days - 1`` ran an hour after this time yesterday; each earlier day a day before."""
    return now - (plan.days - day) * DAY + 3600.0


def day_rows(plan: Plan, day: int, now: float, rng: random.Random) -> Rows:
    """One daily run of every node: chance failures, the planted ones, a busbw figure each."""
    run_id, started = f"run-{day:04d}", started_of(plan, day, now)
    causes = list(CAUSES)
    failing = {i: rng.choice(causes) for i in range(plan.nodes) if rng.random() < P_FAIL}
    failing.update(plan.failures.get(day, {}))
    rows = Rows(RunRow(run_id, "run", started, 1800.0, "slurm", "bench", "preflight run --partition gpu",
                       "fail" if failing else "pass", plan.checks, plan.nodes))
    late = day >= plan.days - DEGRADED_RUNS
    for i in range(plan.nodes):
        host = names_at(i)
        rows.hosts.append((run_id, host, started, "fail" if i in failing else "pass", True, "hgx-h200"))
        level = BUSBW * (1 - plan.degraders.get(i, 0.0)) if late else BUSBW
        rows.figures.append((run_id, host, started, "busbw_gbs", level * (1 + rng.gauss(0.0, NOISE))))
    for i, cause in failing.items():
        check, summary, action = CAUSES[cause]
        host = names_at(i)
        rows.findings.append((run_id, host, started, check, "fail", json.dumps([cause]), summary))
        rows.diagnoses.append((run_id, host, started, cause, "high", action))
    return rows


# ---- stores kept between runs (--keep) ---------------------------------------------------------------
def kept(engine, args, name: str, shape: dict) -> tuple[str, dict | None]:
    """The store ``name``'s URL and, when --keep holds one built with ``shape``, its marker (its
    ``now``); None when it must be (re)built, the stale one gone."""
    marker = Path(args.keep) / f"{engine.name}-{name}.json" if args.keep else None
    if marker is not None and marker.exists():
        found = json.loads(marker.read_text())
        if {k: found.get(k) for k in shape} == shape:
            return engine.url(name), found
        marker.unlink()
    engine.drop(name)
    return engine.url(name), None


def mark(engine, args, name: str, shape: dict) -> None:
    if args.keep:
        (Path(args.keep) / f"{engine.name}-{name}.json").write_text(json.dumps(shape))


# ---- the engines -----------------------------------------------------------------------------------
_COLUMNS = {
    "pf_runs": ("run_id", "kind", "started", "duration_s", "launcher", "version", "command", "status", "checks",
                "hosts", "recorded"),
    "pf_host_results": ("run_id", "host", "started", "status", "reachable", "profile"),
    "pf_findings": ("run_id", "host", "started", "check_id", "status", "symptoms", "summary"),
    "pf_diagnoses": ("run_id", "host", "started", "cause", "confidence", "action"),
    "pf_figures": ("run_id", "host", "started", "figure", "value"),
}


class Sqlite:
    name = "sqlite"

    def __init__(self, root: Path):
        self.root = root

    def url(self, name: str) -> str:
        return f"sqlite:///{self.root / name}.sqlite"

    def loader(self, store: Store) -> None:
        """A bigger page cache for the loading connection only: the measured ones keep the default."""
        store.conn.execute("PRAGMA cache_size = -262144")

    def load(self, store: Store, batch: list[Rows]) -> None:
        """The store's own write, a run (20,000 rows at 10,000 nodes) per transaction."""
        for rows in batch:
            store.record(rows)

    def bulk(self, store: Store, tables: dict[str, list[tuple]]) -> None:
        """Many small runs in one transaction: the store's own statements, executemany."""
        with store.transaction():
            for table, data in tables.items():
                cols = _COLUMNS[table]
                store.executemany(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                                  data)

    def drop(self, name: str) -> None:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{self.root / name}.sqlite{suffix}").unlink(missing_ok=True)

    def settle(self, url: str) -> None:
        """Nothing: the store runs no ANALYZE of its own, so neither does the bench."""

    def size(self, url: str) -> int:
        """The file and its WAL after a checkpoint that empties the WAL."""
        path = Path(parse(url).target)
        with Store.open(parse(url)) as store:
            store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


class Postgres:
    name = "postgresql"

    def __init__(self, cluster):
        self.cluster = cluster

    def url(self, name: str) -> str:
        if not self.cluster.psql(f"SELECT 1 FROM pg_database WHERE datname = '{name}'").strip("[]"):
            self.cluster.create_database(name)
        return self.cluster.url(name)

    def drop(self, name: str) -> None:
        self.cluster.psql(f'DROP DATABASE IF EXISTS "{name}"')

    def bulk(self, store: Store, tables: dict[str, list[tuple]]) -> None:
        """Many small runs in one transaction, each table in one COPY."""
        with store.transaction(), store.conn.cursor() as cur:
            for table, data in tables.items():
                with cur.copy(f"COPY {table} ({', '.join(_COLUMNS[table])}) FROM STDIN") as copy:
                    for row in data:
                        copy.write_row(row)

    def loader(self, store: Store) -> None:
        """Nothing to tune: COPY is the fast path."""

    def load(self, store: Store, batch: list[Rows]) -> None:
        """COPY, the batch of runs in one transaction."""
        with store.transaction(), store.conn.cursor() as cur:
            for rows in batch:
                r = rows.run
                store.execute("INSERT INTO pf_runs (run_id, kind, started, duration_s, launcher, version, command, "
                              "status, checks, hosts, recorded) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                              (r.run_id, r.kind, r.started, r.duration_s, r.launcher, r.version, r.command,
                               r.status, r.checks, r.hosts, time.time()))
                tables = zip(list(_COLUMNS)[1:], ([(*h[:4], int(h[4]), h[5]) for h in rows.hosts], rows.findings,
                                        rows.diagnoses, rows.figures), strict=True)
                for table, data in tables:
                    with cur.copy(f"COPY {table} ({', '.join(_COLUMNS[table])}) FROM STDIN") as copy:
                        for row in data:
                            copy.write_row(row)

    def settle(self, url: str) -> None:
        """VACUUM ANALYZE, which autovacuum would have run on a store filled over a year."""
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")

    def size(self, url: str) -> int:
        """The pf_ tables with their indexes and TOAST (pg_total_relation_size)."""
        with Store.open(parse(url)) as store:
            return int(store.rows("SELECT SUM(pg_total_relation_size(c.oid)) FROM pg_class c JOIN pg_namespace n "
                                  "ON n.oid = c.relnamespace WHERE c.relkind = 'r' AND left(c.relname, 3) = 'pf_' "
                                  "AND n.nspname = 'public'")[0][0])


# ---- the measurements ------------------------------------------------------------------------------
def ingest(url: str, report: dict) -> tuple[float, float]:
    """Seconds of rows_of and of record for one report, the store already open (as on a node)."""
    with Store.open(parse(url)) as store:
        t0 = time.perf_counter()
        rows = rows_of(report, started_fallback=time.time())
        t1 = time.perf_counter()
        added = store.record(rows)
        t2 = time.perf_counter()
    if not added:
        print(f"  odd: {report['run_id']} was already in the store")
    return t1 - t0, t2 - t1


def load_history(engine, url: str, plan: Plan, now: float, rng: random.Random) -> float:
    """Fill the store with the plan's days, ten runs a batch; seconds, generation included."""
    t0 = time.perf_counter()
    with Store.open(parse(url)) as store:
        engine.loader(store)
        for first in range(0, plan.days, 10):
            engine.load(store, [day_rows(plan, d, now, rng) for d in range(first, min(first + 10, plan.days))])
            print(f"  loaded {min(first + 10, plan.days)}/{plan.days} days, {time.perf_counter() - t0:.0f} s",
                  flush=True)
    engine.settle(url)
    return time.perf_counter() - t0


def time_fleet(url: str, days: float, now: float, repeat: int) -> tuple[float, dict]:
    """Median seconds of ``fleet`` over the last ``days`` days, and its answer."""
    times, answer = [], {}
    with Store.open(parse(url)) as store:
        for _ in range(repeat):
            t0 = time.perf_counter()
            answer = fleet(store, Window(since=now - days * DAY))
            times.append(time.perf_counter() - t0)
    return statistics.median(times), answer


def found(answer: dict, plan: Plan) -> dict[str, tuple[int, int, int, int]]:
    """Per pattern: planted hosts found, planted, hosts of another planted pattern found (a repeat
    offender's streaks are also a flapping check), other hosts found (chance failures)."""
    got = {"repeat offenders": {r["node"] for r in answer["repeat_offenders"]},
           "flapping": {r["node"] for r in answer["flapping"]},
           "degrading": {r["node"] for r in answer["degrading"] if r["figure"] == "busbw_gbs"}}
    planted = {"repeat offenders": plan.offenders, "flapping": plan.flappers,
               "degrading": {names_at(i) for i in plan.degraders}}
    every = set().union(*planted.values())
    return {k: (len(got[k] & planted[k]), len(planted[k]), len((got[k] - planted[k]) & every),
                len(got[k] - every)) for k in got}


def shown_found(counts: dict[str, tuple[int, int, int, int]]) -> str:
    return ", ".join(f"{k} {a}/{b} +{c}/+{d}" for k, (a, b, c, d) in counts.items())


def time_nodes(url: str, nodes: list[str], days: float, now: float) -> float:
    """Median milliseconds of ``node_history`` over HISTORY_CALLS calls on each node."""
    times = []
    with Store.open(parse(url)) as store:
        for node in nodes:
            for _ in range(HISTORY_CALLS):
                t0 = time.perf_counter()
                node_history(store, node, Window(since=now - days * DAY))
                times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


@dataclass
class Writers:
    wall_s: float
    runs: int
    host_results: int
    errors: list[str]
    peak_open: int
    refused: int  # "too many clients" in the server's log: connections the retry had to wait for


def writers(cluster, url: str, real: dict, n: int) -> Writers:
    """``n`` threads, each a node's healthcheck: its own Store.open, one single-host record.
    Threads suffice: psycopg waits on the socket with the GIL released, and peak_open shows how
    many connections were open at once."""
    Store.open(parse(url)).close()  # the schema exists, as after the fleet's first healthcheck
    reports = [healthcheck_report(real, f"node{i:05d}") for i in range(n)]
    errors, lock, state = [], threading.Lock(), {"open": 0, "peak": 0}
    started: list[float] = []
    gate = threading.Barrier(n, action=lambda: started.append(time.perf_counter()))
    refused_before = cluster.log.read_text(errors="replace").count("too many clients")

    def one(report: dict) -> None:
        gate.wait()
        try:
            with Store.open(parse(url)) as store:
                with lock:
                    state["open"] += 1
                    state["peak"] = max(state["peak"], state["open"])
                try:
                    store.record(rows_of(report, started_fallback=time.time()))
                finally:
                    with lock:
                        state["open"] -= 1
        except Exception as exc:  # noqa: BLE001 - counted and printed, the point of the measurement
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=one, args=(r,)) for r in reports]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started[0]
    with Store.open(parse(url)) as store:
        runs = store.rows("SELECT COUNT(*) FROM pf_runs")[0][0]
        hosts = store.rows("SELECT COUNT(*) FROM pf_host_results")[0][0]
    refused = cluster.log.read_text(errors="replace").count("too many clients") - refused_before
    return Writers(wall, runs, hosts, errors, state["peak"], refused)


def tcp_url(cluster, database: str) -> str:
    """Restart the cluster listening on a loopback TCP port instead, and make ``database`` there.
    pgcluster's server has a unix socket only, whose full accept queue (2 x max_connections)
    fails a connect at once with EAGAIN; over TCP the kernel holds the SYN and retries it, which is
    how a fleet's nodes reach their store."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    opts = (f"-c listen_addresses='127.0.0.1' -c port={port} -c unix_socket_directories='{cluster.socket_dir}' "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=100")
    pg_ctl = str(pgcluster._bindir() / "pg_ctl")
    subprocess.run(pgcluster._as_owner([pg_ctl, "-D", str(cluster.root / "data"), "-l", str(cluster.log), "-o", opts,
                                        "-w", "-m", "fast", "restart"]), check=True, capture_output=True, timeout=90)
    import psycopg  # the socket's name holds the port: pgcluster's own URL is gone with it

    with psycopg.connect(f"postgresql://{cluster.user}@127.0.0.1:{port}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    return f"postgresql://{cluster.user}@127.0.0.1:{port}/{database}"


def bench_writers(cluster, engine, real: dict, n: int) -> dict[str, str]:
    """The writers through the unix socket, then through TCP."""
    out = {}
    for key, how in (("writers_unix", "unix socket"), ("writers_tcp", "TCP 127.0.0.1")):
        url = engine.url("writers") if key == "writers_unix" else tcp_url(cluster, "writers_tcp")
        w = writers(cluster, url, real, n)
        out[key] = (f"{w.wall_s:.1f} s; {w.runs} runs, {w.host_results} host results of {n}; "
                    f"{len(w.errors)} errors; {w.peak_open} open at once; {w.refused} refused 'too many clients'")
        print(f"{engine.name}: {n} writers, {how}: {out[key]}", flush=True)
        kinds = defaultdict(int)
        for e in w.errors:
            kinds[e.replace(str(cluster.socket_dir), "SOCK")] += 1
        for e, count in sorted(kinds.items(), key=lambda kv: -kv[1])[:5]:
            print(f"  {count} x {e}")
    return out


# ---- one engine, then the table --------------------------------------------------------------------
def sample_nodes(plan: Plan) -> list[str]:
    """A repeat offender, a flapper, a degrader and a node with none of these."""
    plain = next(names_at(i) for i in range(plan.nodes) if names_at(i) not in plan.offenders | plan.flappers
                 and i not in plan.degraders)
    return [min(plan.offenders), min(plan.flappers), names_at(min(plan.degraders)), plain]


def bench(engine, args, real: dict, cluster) -> dict[str, str]:
    """Every measurement of one engine, as the table's cells."""
    out: dict[str, str] = {}
    checks = [c["id"] for c in real["checks"]]
    if "ingest" not in args.skip:
        report = fleet_report(real, args.nodes, f"bench-ingest-{args.nodes}")
        for k in range(3):
            engine.drop(f"ingest{k}")
        shares = [ingest(engine.url(f"ingest{k}"), report) for k in range(3)]
        rows_s, record_s = statistics.median(s[0] for s in shares), statistics.median(s[1] for s in shares)
        totals = statistics.median(a + b for a, b in shares)
        out["ingest"] = f"{totals:.2f} s (rows_of {rows_s:.2f} + record {record_s:.2f})"
        print(f"{engine.name}: ingest of {args.nodes} nodes into an empty store, median of 3: {out['ingest']}",
              flush=True)

    if "fleet" not in args.skip:
        shape = {"nodes": args.nodes, "days": args.days, "seed": SEED}
        url, built = kept(engine, args, "history", shape)
        now = time.time() if built is None else built["now"]
        plan = plan_of(args.nodes, args.days, checks, random.Random(SEED))
        if built is None:
            out["load"] = f"{load_history(engine, url, plan, now, random.Random(SEED + 1)):.0f} s"
            mark(engine, args, "history", {**shape, "now": now})
        out["size"] = f"{engine.size(url) / (args.nodes * args.days):.0f} B"
        print(f"{engine.name}: {args.days} x {args.nodes} loaded in {out.get('load', 'an earlier run')}, "
              f"{out['size']} per host-run", flush=True)

        for days in sorted({30, args.days}):
            seconds, answer = time_fleet(url, days, now, 3)
            out[f"fleet{days}"] = f"{seconds:.2f} s"
            out[f"found{days}"] = shown_found(found(answer, plan))
            print(f"{engine.name}: fleet --since {days}d: {seconds:.2f} s, host_runs {answer['host_runs']}, "
                  f"{out[f'found{days}']}", flush=True)
        nodes = sample_nodes(plan)
        for days in sorted({30, args.days}):
            out[f"node{days}"] = f"{time_nodes(url, nodes, days, now):.1f} ms"
            print(f"{engine.name}: history NODE --since {days}d ({', '.join(nodes)}): {out[f'node{days}']}",
                  flush=True)

        if "ingest" not in args.skip:
            run_id = f"bench-ingest-full-{args.nodes}"
            rows_s, record_s = ingest(url, fleet_report(real, args.nodes, run_id))
            out["ingest_full"] = f"{rows_s + record_s:.2f} s (rows_of {rows_s:.2f} + record {record_s:.2f})"
            print(f"{engine.name}: ingest of {args.nodes} nodes into the full store: {out['ingest_full']}", flush=True)
            with Store.open(parse(url)) as store:  # the kept store stays the generated year
                store.write(lambda s: [s.execute(f"DELETE FROM {t} WHERE run_id = ?", (run_id,))
                                       for t in ("pf_runs", *list(_COLUMNS)[1:])])

    if "node" not in args.skip:
        from store_long_node import bench_long_node  # it reads this module's constants: imported once they exist

        out.update(bench_long_node(engine, args, json.dumps(checks)))
    if cluster is not None and args.writers and "writers" not in args.skip:
        out.update(bench_writers(cluster, engine, real, args.writers))
    return out


def table(args, results: dict[str, dict[str, str]]) -> str:
    n, d = f"{args.nodes:,}", args.days
    lines = [(f"ingest of one {n}-node run, empty store (median of 3)", "< 5 s", "ingest"),
             (f"ingest of one {n}-node run into the full store", "< 5 s", "ingest_full"),
             (f"load of {d} daily runs x {n} nodes (setup)", "-", "load"),
             ("`history --fleet --since 30d` (median of 3)", "< 2 s", "fleet30"),
             (f"`history --fleet --since {d}d`", "< 2 s", f"fleet{d}"),
             ("found: planted/planted +of another pattern/+others, 30d", "-", "found30"),
             (f"found: planted/planted +of another pattern/+others, {d}d", "-", f"found{d}"),
             (f"`history NODE --since 30d`, median of {HISTORY_CALLS} x 4 nodes", "< 100 ms", "node30"),
             (f"`history NODE --since {d}d`, median of {HISTORY_CALLS} x 4 nodes", "< 100 ms", f"node{d}"),
             (f"{args.writers:,} concurrent writers (threads), unix socket", "all rows, no error", "writers_unix"),
             (f"{args.writers:,} concurrent writers (threads), TCP 127.0.0.1", "all rows, no error", "writers_tcp"),
             ("store size per host-run", "-", "size"),
             (f"`history NODE --since 365d`, text, {args.node_runs:,} runs of one node (median of 3)", "< 2 s",
              "long_text"),
             (f"`history NODE --since 365d --json`, {args.node_runs:,} runs of one node (median of 3)", "< 2 s",
              "long_json"),
             (f"`history` of an unknown 10,000-character name, the {args.node_runs:,}-run store", "-", "unknown")]
    engines = list(results)
    out = ["| measurement | target | " + " | ".join(engines) + " |", "|---|---|" + "---|" * len(engines)]
    seen = set()
    for label, target, key in lines:
        if key in seen:  # --days 30: its window is the 30-day one
            continue
        seen.add(key)
        out.append(f"| {label} | {target} | " + " | ".join(results[e].get(key, "-") for e in engines) + " |")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=10000)
    p.add_argument("--days", type=int, default=365)
    p.add_argument("--writers", type=int, default=1000)
    p.add_argument("--node-runs", type=int, default=100000)
    p.add_argument("--engines", default="sqlite,postgresql")
    p.add_argument("--keep", metavar="DIR", type=Path,
                   help="build the history stores in DIR once and reuse them (a PostgreSQL server there is "
                        "left running; the writers, which restart it, are not run)")
    p.add_argument("--skip", default="", help="comma-separated: ingest, fleet, node, writers")
    p.add_argument("--unknown-timeout", type=float, default=120.0, metavar="S")
    args = p.parse_args()
    args.skip = set(filter(None, args.skip.split(",")))
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        os.chmod(args.keep, 0o755)  # the PostgreSQL server runs as postgres
        args.skip.add("writers")
    version = code_version()
    print(f"code: {version}", flush=True)
    real = real_report()
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp:
        for name in args.engines.split(","):
            if name == "sqlite":
                results[name] = bench(Sqlite(args.keep or Path(tmp)), args, real, None)
                continue
            cluster = pgcluster.start(max_connections=100, root=args.keep / "pg" if args.keep else None)
            try:
                results[name] = bench(Postgres(cluster), args, real, cluster)
            finally:
                if args.keep:
                    print(f"PostgreSQL left running at {cluster.url()}; stop it: "
                          f"runuser -u postgres -- {pgcluster._bindir()}/pg_ctl -D {cluster.root}/data stop")
                else:
                    pgcluster.stop(cluster)
    print()
    print(f"code: {version}")
    print(table(args, results))


if __name__ == "__main__":
    main()
