"""all_reduce over torch.distributed (NCCL), printed the way nccl-tests' all_reduce_perf prints.

preflight's nccl-all-reduce probe runs this where nccl-tests is not installed but python3 with
torch is, with all_reduce_perf's own options::

    python3 -u -c "$SOURCE" -b 8 -e 8589934592 -f 2 -g 8 -c 1 -n 20

It has to run on a node that holds nothing but python3 and torch, so it imports nothing from
preflight, and torch only where collectives run: the formatting functions are pure, and tested
without torch (preflight's controller has none).

How it measures, and why:
- One process per GPU. They are forked, not spawned: the program arrives as ``-c`` text, so
  there is no file a spawned child could re-import to find its worker. The parent never
  touches CUDA, which is what makes forking safe. Ranks meet through the TCP store that rank 0
  hosts on a free localhost port.
- Each size is timed like nccl-tests: warm-up iterations, then ``-n`` iterations between two
  device synchronisations; the time per iteration is averaged over the ranks; algbw = bytes /
  time and busbw = algbw x 2(n-1)/n (nccl-tests doc/PERFORMANCE.md).
- torch's all_reduce works in place, so the table has nccl-tests' in-place half only.
- With ``-c 1`` results are checked: every rank contributes rank+1, so every element must hold
  n(n+1)/2 afterwards, and the timed iterations run on zeros, which must stay zero. Wrong
  elements, summed over ranks, are the row's ``#wrong``; their total over all sizes is the
  "Out of bounds values" count, as in nccl-tests.
- A rank that fails prints ``HOST: Test failure ...`` (the form nccl-tests uses for its own
  failures) and the program exits 1.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys
import time
from dataclasses import dataclass

FIRST_LINE = "# preflight torch all_reduce fallback"
ELEMENT_BYTES = 4  # float32, the type nccl-tests uses by default
_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


@dataclass(frozen=True)
class Options:
    """all_reduce_perf's options that this program honours."""

    min_bytes: int
    max_bytes: int
    factor: int
    ngpus: int
    check: bool
    iters: int
    warmup: int


@dataclass(frozen=True)
class Device:
    """What a rank ran on, for the ``# Using devices`` block."""

    rank: int
    pid: int
    host: str
    device: int
    bus_id: str
    name: str


@dataclass(frozen=True)
class Row:
    """One size's measurement: in-place only (see the module docstring)."""

    size_bytes: int
    time_us: float
    algbw: float  # GB/s
    busbw: float  # GB/s
    wrong: int | None  # None when results were not checked (-c 0)


# --------------------------------------------------------------------------- pure parts


def parse_size(text: str) -> int:
    """``8``, ``512M``, ``8G`` -> bytes (binary multiples, as all_reduce_perf reads them)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"not a size: {text!r} (use bytes, or a K/M/G/T suffix)")
    return int(m.group(1)) * _SUFFIX[m.group(2).upper()]


def sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """Message sizes from min to max, multiplied by ``factor``, whole elements only."""
    out, size = [], max(min_bytes, ELEMENT_BYTES)
    while size <= max_bytes:
        out.append(size // ELEMENT_BYTES * ELEMENT_BYTES)
        size *= max(factor, 2)
    return out


def bus_factor(nranks: int) -> float:
    """busbw / algbw for all_reduce on ``nranks`` ranks."""
    return 2 * (nranks - 1) / nranks


def measure(size_bytes: int, seconds_per_iter: float, nranks: int, wrong: int | None) -> Row:
    """A row from one size's average time per iteration."""
    algbw = size_bytes / seconds_per_iter / 1e9 if seconds_per_iter > 0 else 0.0
    return Row(size_bytes, seconds_per_iter * 1e6, algbw, algbw * bus_factor(nranks), wrong)


def preamble(opts: Options) -> list[str]:
    """The header lines printed first, before torch is even imported: they show even if the
    import or NCCL's init hangs."""
    return [
        FIRST_LINE,
        "# Collective test starting: all_reduce",
        (f"# nThread 1 nGpus 1 minBytes {opts.min_bytes} maxBytes {opts.max_bytes} "
         f"step: {opts.factor}(factor) warmup iters: {opts.warmup} iters: {opts.iters} "
         f"agg iters: 1 validation: {int(opts.check)} graph: 0"),
    ]


def torch_line(version: str) -> str:
    return f"# torch {version}"


def devices_block(devices: list[Device]) -> list[str]:
    """The ``# Using devices`` block, one line per rank."""
    return ["#", "# Using devices"] + [
        f"#  Rank {d.rank:2d} Group  0 Pid {d.pid:6d} on {d.host:>10} device {d.device:2d} [{d.bus_id}] {d.name}"
        for d in devices
    ]


def table_header() -> list[str]:
    """The column header. (NCCL prints its own "NCCL version" line once NCCL_DEBUG is set, as
    the probe sets it, so the version needs no line of ours.)"""
    return [
        "#",
        f"#{'':62}in-place",
        (f"#{'size':>11}{'count':>14}{'type':>10}{'redop':>8}{'root':>8}"
         f"{'time':>9}{'algbw':>8}{'busbw':>8}{'#wrong':>8}"),
        f"#{'(B)':>11}{'(elements)':>14}{'':26}{'(us)':>9}{'(GB/s)':>8}{'(GB/s)':>8}",
    ]


def row_line(row: Row) -> str:
    wrong = "N/A" if row.wrong is None else str(row.wrong)
    return (f"{row.size_bytes:12d}  {row.size_bytes // ELEMENT_BYTES:12d}  {'float':>8}  {'sum':>6}  "
            f"{-1:6d}  {_cell(row.time_us, 7)}  {_cell(row.algbw, 6)}  {_cell(row.busbw, 6)}  {wrong:>6}")


def footer(rows: list[Row]) -> list[str]:
    """nccl-tests' closing lines: wrong values in total, and busbw averaged over the sizes."""
    out_of_bounds = sum(r.wrong or 0 for r in rows)
    average = sum(r.busbw for r in rows) / len(rows) if rows else 0.0
    return [
        f"# Out of bounds values : {out_of_bounds} {'FAILED' if out_of_bounds else 'OK'}",
        f"# Avg bus bandwidth    : {average:g} ",
        "#",
        "# Collective test concluded: all_reduce",
    ]


def _cell(value: float, width: int) -> str:
    """Two decimals where they fit the column, fewer where not, then %g (as nccl-tests 2.19)."""
    for decimals in (2, 1, 0):
        text = f"{value:.{decimals}f}"
        if len(text) <= width:
            return text.rjust(width)
    return f"{value:.{max(1, width - 5)}g}".rjust(width)


def parse_args(argv: list[str]) -> Options:
    p = argparse.ArgumentParser(prog="torch_allreduce", description=__doc__.splitlines()[0])
    p.add_argument("-b", "--minbytes", type=parse_size, default=8)
    p.add_argument("-e", "--maxbytes", type=parse_size, default=32 << 20)
    p.add_argument("-f", "--stepfactor", type=int, default=2)
    p.add_argument("-g", "--ngpus", type=int, default=1)
    p.add_argument("-c", "--check", type=int, default=1)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup_iters", type=int, default=5)
    a = p.parse_args(argv)
    if a.ngpus < 1 or a.iters < 1 or a.warmup_iters < 0 or a.minbytes > a.maxbytes:
        p.error("need -g >= 1, -n >= 1, -w >= 0 and -b <= -e")
    return Options(a.minbytes, a.maxbytes, a.stepfactor, a.ngpus, bool(a.check), a.iters, a.warmup_iters)


def _emit(lines: list[str]) -> None:
    # Flushed line by line: a hang or kill must leave everything printed so far in the probe.
    for line in lines:
        print(line, flush=True)


# --------------------------------------------------------------------------- torch parts


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _device(torch, rank: int, host: str) -> Device:
    props = torch.cuda.get_device_properties(rank)
    domain, bus, device = (getattr(props, f"pci_{k}_id", 0) for k in ("domain", "bus", "device"))
    return Device(rank, os.getpid(), host, rank, f"{domain:04x}:{bus:02x}:{device:02x}", props.name)


def _run_size(torch, dist, buf, size: int, opts: Options, rank: int, nranks: int) -> Row:
    view = buf[: size // ELEMENT_BYTES]
    wrong = 0
    if opts.check:
        view.fill_(rank + 1)
        dist.all_reduce(view)
        wrong += int(torch.count_nonzero(view != nranks * (nranks + 1) // 2))
    view.zero_()
    for _ in range(opts.warmup):
        dist.all_reduce(view)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(opts.iters):
        dist.all_reduce(view)
    torch.cuda.synchronize()
    elapsed = torch.tensor([(time.perf_counter() - start) / opts.iters], dtype=torch.float64, device="cuda")
    if opts.check:
        wrong += int(torch.count_nonzero(view))
    counts = torch.tensor([wrong], dtype=torch.int64, device="cuda")
    dist.all_reduce(elapsed)
    dist.all_reduce(counts)
    return measure(size, elapsed.item() / nranks, nranks, int(counts.item()) if opts.check else None)


def _worker(rank: int, nranks: int, port: int, opts: Options, host: str) -> None:
    import torch
    import torch.distributed as dist

    try:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=nranks)
        devices: list = [None] * nranks
        dist.all_gather_object(devices, _device(torch, rank, host))
        if rank == 0:
            _emit(devices_block(devices) + table_header())
        buf = torch.empty(opts.max_bytes // ELEMENT_BYTES, dtype=torch.float32, device="cuda")
        rows = []
        for size in sizes(opts.min_bytes, opts.max_bytes, opts.factor):
            rows.append(_run_size(torch, dist, buf, size, opts, rank, nranks))
            if rank == 0:
                _emit([row_line(rows[-1])])
        if rank == 0:
            _emit(footer(rows))
        dist.destroy_process_group()
    except Exception as exc:
        _emit([f"{host}: Test failure rank {rank}: {type(exc).__name__}: {exc}"])
        raise


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    _emit(preamble(opts))
    import torch
    import torch.multiprocessing as mp

    _emit([torch_line(torch.__version__)])
    try:
        mp.start_processes(_worker, args=(opts.ngpus, _free_port(), opts, socket.gethostname()),
                           nprocs=opts.ngpus, start_method="fork")
    except Exception as exc:  # noqa: BLE001 - a rank failed: it printed why; the others were stopped
        print(f"torch_allreduce: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
