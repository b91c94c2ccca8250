"""The soak agent's ``burn`` engine: a GEMM and an HBM copy on every GPU, each in its own process.

Part of the agent (agent.py beside it; standard library here, ``torch`` in the worker processes
only, never preflight). Each GPU gets one spawned process that runs a bf16 GEMM
(8192-square on GPUs of 16 GiB or more) for most of each window, then an HBM device-to-device
copy for ``--copy-fraction`` of it, and reports each phase's rate. ``--bench S`` then runs a
plain ``torch.matmul`` loop on the same sizes for S seconds on each GPU, on a GPU as hot as the
burn left it, so the burn's efficiency can be read off the summary.

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
    copy_fraction: float = 0.1
    gemm_size: int | None = None
    bench_s: float = 0.0


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
        self._book = WindowBook()
        self._grid_t0 = 0.0
        self.windows: dict[int, list[tuple[float, float, float]]] = {}
        self.bench: dict[int, float] = {}
        self.info: dict[int, dict] = {}

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
                _, _, k, t, tflops, gbps = msg
                self.windows.setdefault(gpu, []).append((t, tflops, gbps))
                self._book.add(k, gpu, tflops, gbps)
                rows += [ThroughputRow(round(t, 3), host, "gpu_tflops", round(tflops, 3), gpu),
                         ThroughputRow(round(t, 3), host, "gpu_hbm_gbps", round(gbps, 2), gpu)]
            elif kind == "ready":
                self._ready.add(gpu)
                self.info[gpu] = msg[2]
            elif kind == "bench":
                self.bench[gpu] = msg[2]
            elif kind == "error":
                errors.append(f"burn on GPU {gpu}: {msg[2]}")
        for gpu, proc in self._procs.items():
            if proc.exitcode not in (None, 0) and gpu not in self._reported_exit:
                self._reported_exit.add(gpu)
                errors.append(f"burn on GPU {gpu}: process exited with code {proc.exitcode}")
        expected = {g for g in self._ready if self._procs[g].exitcode is None}
        for k, got in self._book.release(expected, final):
            t = round(self._grid_t0 + k * self.params.window_s, 3)
            rows += [ThroughputRow(t, host, "tflops", round(sum(v[0] for v in got.values()), 3)),
                     ThroughputRow(t, host, "hbm_gbps", round(sum(v[1] for v in got.values()), 2))]
        return rows, errors

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
            if windows:
                s["tflops_median"] = round(statistics.median(w[1] for w in windows), 2)
                s["hbm_gbps_median"] = round(statistics.median(w[2] for w in windows), 1)
                s["windows"] = len(windows)
                s["first_window"], s["last_window"] = windows[0][0], windows[-1][0]
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
        if now - t_chunk < 0.05:
            chunk[0] *= 2
        if now - t0 >= seconds or any(e.is_set() for e in ended):
            return now - t0, count


def _burn_worker(gpu: int, uuid: str, params: BurnParams, grid_t0: float, queue, finish, stop, parent: int) -> None:
    """One GPU's burn, in its own process. Sees only its GPU (CUDA_VISIBLE_DEVICES=UUID), so
    its CUDA device 0 is NVML's GPU ``gpu`` whatever CUDA's device order."""
    _die_with_parent(parent)
    os.environ["CUDA_VISIBLE_DEVICES"] = uuid
    try:
        import torch

        dev = torch.device("cuda", 0)
        torch.cuda.set_device(dev)
        total = torch.cuda.get_device_properties(dev).total_memory
        n = params.gemm_size or gemm_size(total)
        a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        c = torch.empty_like(a)
        nbytes = copy_bytes(total)
        src = torch.randint(0, 255, (nbytes,), device=dev, dtype=torch.uint8)
        dst = torch.empty_like(src)
        flop = 2.0 * n ** 3
        sync = torch.cuda.synchronize
        # Plain str: torch.__version__ is torch's own str subclass, and unpickling it would
        # import torch (seconds of CPU, GBs of memory) into the agent.
        queue.put(("ready", gpu, {"gemm_size": n, "copy_bytes": nbytes,
                                  "device": str(torch.cuda.get_device_name(dev)), "torch": str(torch.__version__)}))
        gemm_chunk, copy_chunk = [1], [1]
        ended = (finish, stop)
        width, copy_s = params.window_s, params.window_s * params.copy_fraction
        while not any(e.is_set() for e in ended) and os.getppid() == parent:
            k = int((time.time() - grid_t0) // width) + 1
            gemm_s = grid_t0 + k * width - copy_s - time.time()
            if gemm_s <= 0.1 * width:
                k += 1  # too little of this window left (the first one, after start-up): join the next
                gemm_s += width
            t_gemm, done_gemm = _timed_loop(lambda: torch.matmul(a, b, out=c), gemm_s, ended, gemm_chunk, sync)
            t_copy, done_copy = _timed_loop(lambda: dst.copy_(src), grid_t0 + k * width - time.time(),
                                            ended, copy_chunk, sync)
            # A copy reads and writes every byte: 2 x nbytes of HBM traffic.
            queue.put(("window", gpu, k, time.time(), flop * done_gemm / t_gemm / 1e12,
                       2 * nbytes * done_copy / t_copy / 1e9))
        if os.getppid() != parent:
            return
        if params.bench_s > 0 and not stop.is_set():
            t, done = _timed_loop(lambda: torch.matmul(a, b), params.bench_s, (stop,), [1], sync)
            queue.put(("bench", gpu, flop * done / t / 1e12))
    except BaseException as exc:  # noqa: BLE001 - reported to the agent, then the process fails
        queue.put(("error", gpu, f"{type(exc).__name__}: {exc}"))
        raise SystemExit(1) from None

