"""The soak agent's ``burn`` engine: a GEMM and an HBM copy on every GPU, each in its own process.

Part of the agent (agent.py beside it; standard library here, ``torch`` in the worker processes
only, never preflight). Each GPU gets one spawned process that keeps a bf16 GEMM (8192-square on
GPUs of 16 GiB or more) running back to back, with a short HBM device-to-device copy after every
~50 ms of GEMMs (``--copy-fraction`` of the time), and reports each phase's rate per window.
The phases are that fine so that power and temperature hold steady, as a thermal soak needs
(whole-window phases made the GPU's power dip every window); they are timed with CUDA events and
the next chunk is queued before the last one is waited for, so the GPU never idles on Python.

Silent data corruption: the GEMM's inputs are the same on every GPU and every run (a fixed seed),
so its result is too (cuBLAS picks the same kernel for the same shapes on the same GPU model).
After every chunk, the result is checksummed per 1024-square tile on the GPU (exact integer sums
of its bits) and compared with the first result's, without a host sync; each window reports how
many tiles differed (``gpu_sdc_mismatches``). The first result's digest goes to the agent, which
compares GPUs of one model with each other (``gpu_sdc_agrees``: 0 for a GPU outvoted by the
rest, or for every GPU when no majority exists).

``--bench S`` then runs a plain ``torch.matmul`` loop on the same sizes for S seconds on each
GPU, on a GPU as hot as the burn left it, so the burn's efficiency can be read off the summary.

The workers' windows share one wall-clock grid, so ``WindowBook`` can add them up into the
node's figure per window. The engine interface is the agent's: ``start(grid_t0)``,
``poll(host, final) -> (rows, errors)``, ``running()``, ``finish(stopped) -> errors``,
``summary()``.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import queue
import signal
import statistics
import sys
import time
from dataclasses import dataclass

try:
    from .records import ThroughputRow
except ImportError:  # a shipped copy, run from the agent's directory
    from records import ThroughputRow

# How long the workers get to finish their window (plus the bench) before they are killed.
ENGINE_STOP_S = 60.0


@dataclass(frozen=True)
class BurnParams:
    window_s: float = 5.0
    copy_fraction: float = 0.05  # 0.1 let the H200's power dip to a P5 of 97.9 % of its limit
    gemm_size: int | None = None
    bench_s: float = 0.0
    sdc: bool = True  # checksum the GEMM's result (module docstring); off only to measure its cost


# The seed of the GEMM's inputs: any fixed value, the same on every node.
SDC_SEED = 20261201
SDC_TILE = 1024
# A chunk of GEMMs lasts about this long before its copies and its checksum.
CHUNK_S = 0.05


def sdc_agreement(digests: dict[int, tuple[str, str]]) -> dict[int, bool]:
    """Which GPUs agree with their model's majority: ``digests`` maps GPU index to (model and
    GEMM size, digest of its first result). A GPU is outvoted when more GPUs of its kind share
    another digest; with no strict majority (two GPUs that differ, or a three-way split) no
    GPU of that kind can be trusted, and every one reads False. A GPU alone of its kind agrees."""
    kinds: dict[str, dict[str, list[int]]] = {}
    for gpu, (kind, digest) in digests.items():
        kinds.setdefault(kind, {}).setdefault(digest, []).append(gpu)
    out: dict[int, bool] = {}
    for by_digest in kinds.values():
        total = sum(len(g) for g in by_digest.values())
        best = max(by_digest.values(), key=len)
        for gpus in by_digest.values():
            for gpu in gpus:
                out[gpu] = gpus is best and 2 * len(best) > total
    return out


class WindowBook:
    """Per-GPU windows gathered by index into the node's totals.

    Every worker ends window k at the same wall-clock instant (``grid_t0 + k * window_s``), so
    the node's throughput for window k is the sum over its GPUs. Window k is released once every
    expected GPU has reported it, or once some GPU is two windows further (a GPU that stopped
    reporting must not hold the node's rows back), or at the end.
    """

    def __init__(self) -> None:
        self._pending: dict[int, dict[int, tuple[float, float]]] = {}
        self._newest = -1

    def add(self, k: int, gpu: int, tflops: float, gbps: float) -> None:
        self._pending.setdefault(k, {})[gpu] = (tflops, gbps)
        self._newest = max(self._newest, k)

    def release(self, expected: set[int], final: bool = False) -> list[tuple[int, dict[int, tuple[float, float]]]]:
        out = []
        for k in sorted(self._pending):
            got = self._pending[k]
            if final or expected <= set(got) or self._newest >= k + 2:
                out.append((k, self._pending.pop(k)))
            else:
                break
        return out


class BurnEngine:
    """One spawned process per GPU (``_burn_worker``), reporting over a queue (see the module
    docstring for what each does). The processes die with the agent (PR_SET_PDEATHSIG, and a
    parent check every window), so a ``kill -9`` of the agent leaves no orphan burning a GPU.

    Rows: ``tflops`` and ``hbm_gbps`` per window for the node (sum over its GPUs, empty ``gpu``
    cell), and ``gpu_tflops`` / ``gpu_hbm_gbps`` per GPU (``gpu`` set)."""

    def __init__(self, gpus: list[tuple[int, str]], params: BurnParams):
        self._mp = multiprocessing.get_context("spawn")
        self.gpus, self.params = gpus, params
        self._queue = self._mp.Queue()
        self._finish = self._mp.Event()
        self._stop = self._mp.Event()
        self._procs: dict = {}
        self._ready: set[int] = set()
        self._reported_exit: set[int] = set()
        self._agreement_sent = False
        self._book = WindowBook()
        self._grid_t0 = 0.0
        self.windows: dict[int, list[tuple[float, float, float]]] = {}
        self.bench: dict[int, float] = {}
        self.info: dict[int, dict] = {}
        self.sdc: dict[int, tuple[int, int]] = {}  # GPU -> (checks, tiles that differed)

    def start(self, grid_t0: float) -> None:
        self._grid_t0 = grid_t0
        for gpu, uuid in self.gpus:
            proc = self._mp.Process(target=_burn_worker, name=f"burn-gpu{gpu}",
                                    args=(gpu, uuid, self.params, grid_t0, self._queue, self._finish, self._stop,
                                          os.getpid()))
            proc.start()
            self._procs[gpu] = proc

    def poll(self, host: str, final: bool = False) -> tuple[list[ThroughputRow], list[str]]:
        rows, errors = [], []
        while True:
            try:
                msg = self._queue.get_nowait()
            except queue.Empty:
                break
            kind, gpu = msg[0], msg[1]
            if kind == "window":
                _, _, k, t, tflops, gbps, sdc_checks, sdc_bad = msg
                self.windows.setdefault(gpu, []).append((t, tflops, gbps))
                self._book.add(k, gpu, tflops, gbps)
                rows += [ThroughputRow(round(t, 3), host, "gpu_tflops", round(tflops, 3), gpu),
                         ThroughputRow(round(t, 3), host, "gpu_hbm_gbps", round(gbps, 2), gpu)]
                if sdc_checks:
                    self.sdc[gpu] = (self.sdc.get(gpu, (0, 0))[0] + sdc_checks, self.sdc.get(gpu, (0, 0))[1] + sdc_bad)
                    rows.append(ThroughputRow(round(t, 3), host, "gpu_sdc_mismatches", sdc_bad, gpu))
            elif kind == "ready":
                self._ready.add(gpu)
                self.info[gpu] = msg[2]
            elif kind == "bench":
                self.bench[gpu] = msg[2]
            elif kind == "sdc_cost":
                self.info.setdefault(gpu, {})["sdc_time_share"] = round(msg[2], 5)
            elif kind == "error":
                errors.append(f"burn on GPU {gpu}: {msg[2]}")
        for gpu, proc in self._procs.items():
            if proc.exitcode not in (None, 0) and gpu not in self._reported_exit:
                self._reported_exit.add(gpu)
                errors.append(f"burn on GPU {gpu}: process exited with code {proc.exitcode}")
        rows += self._agreement_rows(host)
        expected = {g for g in self._ready if self._procs[g].exitcode is None}
        for k, got in self._book.release(expected, final):
            t = round(self._grid_t0 + k * self.params.window_s, 3)
            rows += [ThroughputRow(t, host, "tflops", round(sum(v[0] for v in got.values()), 3)),
                     ThroughputRow(t, host, "hbm_gbps", round(sum(v[1] for v in got.values()), 2))]
        return rows, errors

    def _agreement_rows(self, host: str) -> list[ThroughputRow]:
        """Once every GPU has its first result, one ``gpu_sdc_agrees`` row per GPU."""
        if self._agreement_sent or not self.params.sdc or len(self._ready) < len(self._procs):
            return []
        self._agreement_sent = True
        digests = {g: (f"{i.get('device')} n={i.get('gemm_size')}", i["sdc_digest"])
                   for g, i in self.info.items() if i.get("sdc_digest")}
        t = round(time.time(), 3)
        return [ThroughputRow(t, host, "gpu_sdc_agrees", int(ok), gpu)
                for gpu, ok in sorted(sdc_agreement(digests).items())]

    def running(self) -> bool:
        return any(proc.exitcode is None for proc in self._procs.values())

    def finish(self, stopped: bool) -> list[str]:
        """Ask the workers to end (bench first unless ``stopped``); wait for them, then force."""
        if stopped:
            self._stop.set()
        self._finish.set()
        deadline = time.monotonic() + ENGINE_STOP_S + (0 if stopped else self.params.bench_s)
        for proc in self._procs.values():
            proc.join(max(0.0, deadline - time.monotonic()))
        errors = []
        for gpu, proc in self._procs.items():
            if proc.is_alive():
                errors.append(f"burn on GPU {gpu}: did not stop in time; killed")
                proc.kill()
                proc.join(5)
        return errors

    def summary(self) -> dict:
        out = {}
        for gpu, _ in self.gpus:
            windows = self.windows.get(gpu, [])
            s: dict = dict(self.info.get(gpu, {}))
            # Whether the results were checked: an analysis tells --no-sdc from a burn without checks.
            s["sdc"] = bool(self.params.sdc)
            if windows:
                s["tflops_median"] = round(statistics.median(w[1] for w in windows), 2)
                s["hbm_gbps_median"] = round(statistics.median(w[2] for w in windows), 1)
                s["windows"] = len(windows)
                s["first_window"], s["last_window"] = windows[0][0], windows[-1][0]
            if gpu in self.sdc:
                s["sdc_checks"], s["sdc_mismatched_tiles"] = self.sdc[gpu]
            if gpu in self.bench:
                s["bench_matmul_tflops"] = round(self.bench[gpu], 2)
                if windows:
                    s["burn_efficiency"] = round(s["tflops_median"] / self.bench[gpu], 4)
            out[str(gpu)] = s
        return out


def gemm_size(total_memory_bytes: int) -> int:
    """Square bf16 GEMM size: 8192 keeps Hopper/Blackwell tensor cores at their peak with room
    to spare (3 x 128 MiB); smaller GPUs get 4096."""
    return 8192 if total_memory_bytes >= 16 << 30 else 4096


def copy_bytes(total_memory_bytes: int) -> int:
    """Each of the copy's two buffers: 1/32 of the GPU's memory, at most 2 GiB: far past any L2."""
    return min(2 << 30, total_memory_bytes // 32)


def _die_with_parent(parent: int) -> None:
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _timed_loop(fn, seconds: float, ended, chunk: list[int], sync) -> tuple[float, int]:
    """Run ``fn`` for about ``seconds`` (at least one chunk); synchronise only every chunk, grown
    until one takes >= 50 ms and kept in ``chunk`` between calls, so the GPU never waits on us."""
    t0 = time.perf_counter()
    count = 0
    while True:
        t_chunk = time.perf_counter()
        for _ in range(chunk[0]):
            fn()
        sync()
        count += chunk[0]
        now = time.perf_counter()
        if now - t_chunk < CHUNK_S:
            chunk[0] *= 2
        if now - t0 >= seconds or any(e.is_set() for e in ended):
            return now - t0, count


class _Window:
    """What one window's chunks added up to."""

    def __init__(self) -> None:
        self.gemm_ms = self.copy_ms = 0.0
        self.gemms = self.copies = self.checks = self.bad = 0


def _burn_worker(gpu: int, uuid: str, params: BurnParams, grid_t0: float, queue, finish, stop, parent: int) -> None:
    """One GPU's burn, in its own process. Sees only its GPU (CUDA_VISIBLE_DEVICES=UUID), so
    its CUDA device 0 is NVML's GPU ``gpu`` whatever CUDA's device order."""
    _die_with_parent(parent)
    os.environ["CUDA_VISIBLE_DEVICES"] = uuid
    try:
        import hashlib

        import torch

        dev = torch.device("cuda", 0)
        torch.cuda.set_device(dev)
        total = torch.cuda.get_device_properties(dev).total_memory
        n = params.gemm_size or gemm_size(total)
        # Drawn on the CPU from a fixed seed: the same inputs on every GPU of every node.
        gen = torch.Generator().manual_seed(SDC_SEED)
        a = torch.randn(n, n, generator=gen, dtype=torch.float32).to(dev, torch.bfloat16)
        b = torch.randn(n, n, generator=gen, dtype=torch.float32).to(dev, torch.bfloat16)
        c = torch.empty_like(a)
        nbytes = copy_bytes(total)
        src = torch.randint(0, 255, (nbytes,), device=dev, dtype=torch.uint8)
        dst = torch.empty_like(src)
        flop = 2.0 * n ** 3
        sync = torch.cuda.synchronize
        tiles = max(1, n // SDC_TILE)

        def checksum():
            # Exact: integer sums of the result's bit patterns, one per tile, any bit flip shows.
            bits = c.view(torch.int16).reshape(tiles, n // tiles, tiles, n // tiles)
            return bits.sum(dim=(1, 3), dtype=torch.int64)

        torch.matmul(a, b, out=c)
        reference = checksum()
        digest = hashlib.sha256(repr(reference.cpu().tolist()).encode()).hexdigest()[:16]
        # Two chunks are in flight at most; each brings its count of differing tiles back in its
        # own pinned buffer, copied before the chunk's last event, so reading it waits for nothing.
        readback = [torch.zeros((), dtype=torch.int64, pin_memory=True) for _ in range(2)]
        chunks_queued = [0]
        sdc_ms, busy_ms = [0.0], [0.0]  # the checksums' share of the GPU's time: their cost
        # Plain str: torch.__version__ is torch's own str subclass, and unpickling it would
        # import torch (seconds of CPU, GBs of memory) into the agent.
        info = {"gemm_size": n, "copy_bytes": nbytes, "device": str(torch.cuda.get_device_name(dev)),
                "torch": str(torch.__version__)}
        if params.sdc:
            info["sdc_digest"] = digest
        queue.put(("ready", gpu, info))

        counts = [1, 1]  # GEMMs, copies per chunk; adapted to CHUNK_S and the copy fraction
        ended = (finish, stop)
        width = params.window_s

        def enqueue():
            """One chunk on the GPU's queue; returns its events and counts (nothing waits here)."""
            e0, e1, e2, e3 = (torch.cuda.Event(enable_timing=True) for _ in range(4))
            e0.record()
            for _ in range(counts[0]):
                torch.matmul(a, b, out=c)
            e1.record()
            host = None
            if params.sdc:
                host = readback[chunks_queued[0] % 2]
                host.copy_((checksum() != reference).sum(), non_blocking=True)
            chunks_queued[0] += 1
            e2.record()
            copies = counts[1] if params.copy_fraction > 0 else 0
            for _ in range(copies):
                dst.copy_(src)
            e3.record()
            return e0, e1, e2, e3, counts[0], copies, host

        def account(chunk, into: _Window) -> None:
            e0, e1, e2, e3, gemms, copies, host = chunk
            e3.synchronize()
            gemm_ms, copy_ms = e0.elapsed_time(e1), e2.elapsed_time(e3)
            sdc_ms[0] += e1.elapsed_time(e2)
            busy_ms[0] += e0.elapsed_time(e3)
            into.gemm_ms += gemm_ms
            into.copy_ms += copy_ms
            into.gemms, into.copies = into.gemms + gemms, into.copies + copies
            if host is not None:
                into.checks += 1
                into.bad += int(host)
            # Size the chunk to CHUNK_S of GEMMs and the copies to their share of the time.
            counts[0] = max(1, round(gemms * CHUNK_S * 1e3 / max(gemm_ms, 1e-3)))
            if copies and params.copy_fraction > 0:
                want_ms = gemm_ms * params.copy_fraction / (1 - params.copy_fraction)
                counts[1] = max(1, round(copies * want_ms / max(copy_ms, 1e-3)))

        k = int((time.time() - grid_t0) // width) + 1
        if grid_t0 + k * width - time.time() < 0.1 * width:
            k += 1  # too little of this window left (the first one, after start-up): join the next
        window, pending = _Window(), enqueue()
        while not any(e.is_set() for e in ended) and os.getppid() == parent:
            nxt = enqueue()  # queued before we wait, so the GPU goes from one chunk to the next
            account(pending, window)
            pending = nxt
            if time.time() >= grid_t0 + k * width:
                queue.put(("window", gpu, k, time.time(), flop * window.gemms / (window.gemm_ms / 1e3) / 1e12,
                           2 * nbytes * window.copies / (window.copy_ms / 1e3) / 1e9 if window.copy_ms else 0.0,
                           window.checks, window.bad))
                window = _Window()
                k = int((time.time() - grid_t0) // width) + 1
        sync()
        if os.getppid() != parent:
            return
        if params.sdc and busy_ms[0]:
            queue.put(("sdc_cost", gpu, sdc_ms[0] / busy_ms[0]))
        if params.bench_s > 0 and not stop.is_set():
            t, done = _timed_loop(lambda: torch.matmul(a, b), params.bench_s, (stop,), [1], sync)
            queue.put(("bench", gpu, flop * done / t / 1e12))
    except BaseException as exc:  # noqa: BLE001 - reported to the agent, then the process fails
        queue.put(("error", gpu, f"{type(exc).__name__}: {exc}"))
        raise SystemExit(1) from None
