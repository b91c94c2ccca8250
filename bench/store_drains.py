"""Drains for a store bench_store.py built (issue 35): `history --fleet`'s precision reads the
drain events, so a store without any times none of it. Adds, with a fixed seed, the events the
commands would have recorded for a share of the store's diagnosed host-runs, in the shapes they
record them (preflight/app/healthcheck.py, preflight/lifecycle/controller.py):

- a healthcheck's drain, and its resume by a passing healthcheck hours later (no step);
- the lifecycle's: drain, reset, retest, resume, each after its transition event;
- the lifecycle's failed retest and escalation (transitions back to drained, then escalated);
- a drain still open at the end.

    python3 bench/store_drains.py STORE_URL [--share 0.3] [--seed 35]

Prints how many of each it added. Run it once on a copy of the store: it adds, never replaces.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from preflight.store import Store, parse  # noqa: E402


def transition(node: str, at: float, frm: str, to: str, why: str, run: str, actions=()) -> tuple:
    return (node, "transition", at, "bench", f"-> {to}: {why}", run,
            json.dumps({"from": frm, "to": to, "actions": list(actions)}))


def lifecycle(node: str, cause: str, run: str, t: float, rng: random.Random, fails: bool) -> list[tuple]:
    drained = f"preflight: drained {cause} {run}"
    out = [transition(node, t, "healthy", "drained", f"{cause} in {run}: one reading is enough", run, ["drain"]),
           (node, "drain", t, "bench", drained, run, "{}")]
    t += rng.uniform(60, 3600)  # until the node is idle
    out += [transition(node, t, "drained", "remediating", f"reset for {cause}", run, ["reset"]),
            (node, "reset", t, "bench", f"preflight: remediating {cause} {run}: reset", run, "{}"),
            transition(node, t, "remediating", "retesting", "reset done: retest", run)]
    retest = f"retest-{node}-{int(t)}"
    out.append((node, "retest", t, "bench", "the checks that blamed it", run, json.dumps({"run": retest})))
    t += rng.uniform(300, 900)
    if fails:
        out += [transition(node, t, "retesting", "drained", f"retest {retest} failed: back to drained", run),
                transition(node, t + 600, "retesting", "escalated", f"retest {retest} failed (2 times)", run,
                           ["drain"]),
                (node, "drain", t + 600, "bench", f"preflight: escalated {cause} {run}: RMA: open a vendor case",
                 run, "{}")]
        return out
    return out + [transition(node, t, "retesting", "resumed", f"retest {retest} passed", retest, ["resume"]),
                  (node, "resume", t, "bench", f"passes {retest}", retest, "{}")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("url")
    p.add_argument("--share", type=float, default=0.3, help="share of the diagnosed host-runs that drained")
    p.add_argument("--seed", type=int, default=35)
    args = p.parse_args()
    rng = random.Random(args.seed)
    counts = {"healthcheck": 0, "lifecycle": 0, "escalated": 0, "open": 0}
    with Store.open(parse(args.url), create=False) as store:
        hits = store.rows("SELECT host, run_id, started, MIN(cause) FROM pf_diagnoses GROUP BY host, run_id, started "
                          "ORDER BY started, host")
        busy: dict[str, float] = {}  # node -> until when its last drain lasts: one drain at a time
        rows: list[tuple] = []
        for host, run, started, cause in hits:
            if rng.random() >= args.share or busy.get(host, 0) > started:
                continue
            t = started + rng.uniform(30, 120)  # the command's drain after the reading
            kind = rng.choices(list(counts), weights=(40, 40, 10, 10))[0]
            counts[kind] += 1
            if kind == "healthcheck":
                back = t + rng.uniform(3600, 12 * 3600)
                rows += [(host, "drain", t, "healthcheck", f"preflight: {cause} healthcheck-{run}", run, "{}"),
                         (host, "resume", back, "healthcheck", "healthy again; the drain was preflight's", run, "{}")]
                busy[host] = back
            elif kind == "open":
                rows.append((host, "drain", t, "healthcheck", f"preflight: {cause} healthcheck-{run}", run, "{}"))
                busy[host] = float("inf")
            else:
                added = lifecycle(host, cause, run, t, rng, fails=kind == "escalated")
                rows += added
                busy[host] = float("inf") if kind == "escalated" else added[-1][2]

        def work(s: Store) -> None:
            for r in rows:
                s.execute("INSERT INTO pf_events (node, kind, at, actor, reason, run_id, detail) "
                          "VALUES (?, ?, ?, ?, ?, ?, ?)", r)

        store.write(work)
    print(json.dumps({**counts, "events": len(rows), "diagnosed_host_runs": len(hits)}))


if __name__ == "__main__":
    main()
