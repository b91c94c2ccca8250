"""A failed atomic write leaves nothing behind: no half file, no temporary file."""

from __future__ import annotations

import pytest

from preflight.evidence.atomic import write_atomic
from preflight.report.files import write_atomic as write_text_atomic


def test_a_failed_rename_removes_the_temporary_file(tmp_path):
    target = tmp_path / "report.json"
    target.mkdir()
    (target / "in-the-way").write_text("x")  # a non-empty directory: os.replace fails
    with pytest.raises(OSError):
        write_atomic(target, b"{}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]
    with pytest.raises(OSError):
        write_text_atomic(target, "{}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_a_write_replaces_the_file_whole(tmp_path):
    target = tmp_path / "f.txt"
    target.write_text("old")
    write_atomic(target, b"new")
    assert target.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_the_file_is_made_as_open_makes_it(tmp_path):
    # Same permissions (0o666 under the umask) as a file written through open(..., "wb").
    with open(tmp_path / "by-open", "wb") as f:
        f.write(b"x")
    write_atomic(str(tmp_path / "by-write-atomic"), b"x")
    assert (tmp_path / "by-write-atomic").stat().st_mode == (tmp_path / "by-open").stat().st_mode


def test_a_short_write_goes_on_where_it_stopped(tmp_path, monkeypatch):
    import os

    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:3])))
    write_atomic(tmp_path / "f.bin", b"0123456789")
    assert (tmp_path / "f.bin").read_bytes() == b"0123456789"
