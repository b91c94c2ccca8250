"""Writing a file whole or not at all: the bundle's evidence, the reports, the soak's merged files."""

from __future__ import annotations

import contextlib
import os

# What ``open(path, "wb")`` asks the kernel for (so the same file, mode 0o666 under the
# umask), without the buffered-file object around it: for a bundle's small files that
# object and pathlib cost more than the write.
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """``data`` to ``path`` through a temporary file beside it and a rename, so a reader (or a
    controller killed mid-write) never sees half a file. A write that fails (disk full, a
    directory in the way) removes its temporary file and raises."""
    path = os.fspath(path)
    head, name = os.path.split(path)
    tmp = os.path.join(head, f".{name}.tmp{os.getpid()}")
    try:
        _write_new(tmp, data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _write_new(path: str, data: bytes) -> None:
    fd = os.open(path, _CREATE, 0o666)
    try:
        # A write may take less than it is given (a signal, a huge file): go on from there.
        view, done = memoryview(data), 0
        while done < len(view):
            done += os.write(fd, view[done:])
    finally:
        os.close(fd)
