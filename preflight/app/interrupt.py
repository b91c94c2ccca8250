"""Ctrl-C: the first one stops the command and says where what it saved is kept; the ones that
follow while it winds down are ignored, so that a second quick Ctrl-C (or ``timeout -s INT``
twice) cannot land inside the first one's handling and end in a traceback from a thread's lock
or rich's live display (issue 34)."""

from __future__ import annotations

import signal
import threading
from pathlib import Path


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a command that keeps what it saved so far: ``kept`` names it (a bundle)."""

    def __init__(self, kept: Path):
        super().__init__(str(kept))
        self.kept = kept


def _first_only(signum, frame):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def install():
    """SIGINT raises KeyboardInterrupt once, then is ignored; returns the handler it replaced
    (None where nothing was changed: not the main thread, or SIGINT already ignored)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:  # started in the background with SIGINT ignored: leave it so
        return None
    signal.signal(signal.SIGINT, _first_only)
    return previous


def restore(previous) -> None:
    if previous is not None:
        signal.signal(signal.SIGINT, previous)
