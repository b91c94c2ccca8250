"""The burn engine's bookkeeping (preflight/node/burn.py), without torch: per-GPU windows summed
into the node's, and the GEMM and copy sizes by GPU memory. The engine itself needs a GPU
(tests marked gpu elsewhere; bench/ has the H200 runs)."""

from __future__ import annotations

from preflight.node import burn


def test_window_book_sums_gpus_and_does_not_wait_for_a_silent_gpu():
    book = burn.WindowBook()
    # Per-window rates from probe.log's real 5 s windows (673.2, 673.8, 674.3 TFLOP/s; 4265 GB/s).
    book.add(1, 0, 673.2, 4265.1)
    assert book.release({0, 1}) == []
    book.add(1, 1, 673.8, 4265.1)
    assert book.release({0, 1}) == [(1, {0: (673.2, 4265.1), 1: (673.8, 4265.1)})]
    book.add(2, 0, 674.3, 4265.1)
    book.add(3, 0, 674.5, 4265.1)
    assert book.release({0, 1}) == []
    book.add(4, 0, 674.1, 4265.1)  # GPU 1 is two windows behind: window 2 goes without it
    assert book.release({0, 1}) == [(2, {0: (674.3, 4265.1)})]
    assert [k for k, _ in book.release({0, 1}, final=True)] == [3, 4]


# --- Sampler against the replayed H200 burn ---------------------------------------------------


def test_gemm_and_copy_sizes_by_gpu_memory():
    # An H200 (141 GiB), a 16 GiB card, an 8 GiB one.
    assert [burn.gemm_size(g << 30) for g in (141, 16, 8)] == [8192, 8192, 4096]
    assert [burn.copy_bytes(g << 30) for g in (141, 16, 8)] == [2 << 30, 512 << 20, 256 << 20]
