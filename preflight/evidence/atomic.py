"""Writing a file whole or not at all: the bundle's evidence, the reports, the soak's merged files."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, data: bytes) -> None:
    """``data`` to ``path`` through a temporary file beside it and a rename, so a reader (or a
    controller killed mid-write) never sees half a file. A write that fails (disk full, a
    directory in the way) removes its temporary file and raises."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
