"""Waiting in the end-to-end tests for what daemons do in their own time (a drain, a job's start, a
store row): poll a condition until it holds, or fail naming it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(what: Callable[[], T], timeout: float = 60) -> T:
    """``what()``'s first true answer, polled every 0.5 s; past ``timeout`` seconds an
    AssertionError naming the condition by its docstring."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := what():
            return got
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout} s: {what.__doc__}")
