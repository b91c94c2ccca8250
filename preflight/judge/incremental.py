"""Judging each host while the rest of the fleet is still being probed.

A run used to judge every host after the last one answered, so the judgement (parsing an
8-GPU ``nvidia-smi -q -x``, the kernel log, every host check) was added to the collection's
time. Host checks need nothing but their own host's records, so a host is judged the moment
its last planned probe is recorded, on a thread of its own, while the fan-out waits on the
network; the fleet checks, the diagnosis and the reports still run once, at the end.

What the run decides stays exactly what ``preflight analyze`` of its bundle decides: a host
is judged on a copy of the records the bundle holds for it, and that judgement is used only
if the bundle still holds those very records at the end (a later record for the host, from
the multinode stage say, and the host is judged again).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from preflight.evidence.bundle import Bundle
from preflight.judge.analyze import HostJudgement, judge_host
from preflight.knowledge.profiles import Profile
from preflight.model import Check, HostHistory, ProbeResult


class IncrementalJudge:
    """``offer`` a host's records as each result is saved; ``judged(bundle)`` at the end."""

    def __init__(self, checks: list[Check], profiles: dict[str, Profile], planned: Sequence[str],
                 forced_profile: str | None = None, on_judged: Callable[[HostJudgement], None] | None = None,
                 histories: Mapping[str, HostHistory] | None = None):
        """``on_judged`` sees each judgement once it is made (the live view's early verdicts), on
        the judging thread; ``histories``: each node's past (``--history``)."""
        self._args = (checks, profiles, tuple(planned), forced_profile)
        self._histories = histories or {}
        self._on_judged = on_judged
        self._planned = frozenset(planned)
        # One thread: judging is CPU work under the GIL, so more would only contend, and one
        # keeps checks (and any module state they keep) single-threaded as in `analyze`.
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="preflight-judge")
        self._pending: dict[str, tuple[dict[str, ProbeResult], Future[HostJudgement]]] = {}
        # Results reach `offer` from the fan-out's threads, two of one host at once when its
        # probes run on separate channels (--no-node-runner): one of them starts the judgement.
        self._lock = threading.Lock()

    def offer(self, host: str, records: Mapping[str, ProbeResult]) -> None:
        """Start judging ``host`` if ``records`` (all of its records so far) hold every planned
        probe; a call before that, or for a host already judged on the same records, does nothing."""
        if not self._planned or not self._planned <= records.keys():
            return
        with self._lock:
            earlier = self._pending.get(host)
            if earlier and _same(earlier[0], records):
                return
            snapshot = dict(records)  # the writer keeps adding; the judge reads only this copy
            future = self._pool.submit(judge_host, host, snapshot, *self._args, self._histories.get(host))
            self._pending[host] = (snapshot, future)
        if self._on_judged is not None:
            future.add_done_callback(self._report)

    def _report(self, future: Future[HostJudgement]) -> None:
        if not future.cancelled() and future.exception() is None:
            self._on_judged(future.result())

    def judged(self, bundle: Bundle) -> dict[str, HostJudgement]:
        """Every host whose judgement finished on exactly the records ``bundle`` holds for it;
        waits for the judgements under way. A judgement that raised is left out, so the final
        analysis judges that host again and reports the error as it always would."""
        self._pool.shutdown(wait=True)
        out = {}
        for host, (snapshot, future) in self._pending.items():
            if future.exception() is None and _same(snapshot, bundle.probes_of(host)):
                out[host] = future.result()
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _same(a: Mapping[str, ProbeResult], b: Mapping[str, ProbeResult]) -> bool:
    # The writer hands out the very objects it keeps, so identity says "the same record".
    return a.keys() == b.keys() and all(a[k] is b[k] for k in a)
