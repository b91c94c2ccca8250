"""Fixtures shared by the soak tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "h200-soak-5min"


@pytest.fixture
def soak(tmp_path) -> Path:
    """A writable copy of the real 5-minute H200 burn (examples/h200-soak-5min), without its
    plots and report, for tests that damage one of its files."""
    out = tmp_path / "soak"
    shutil.copytree(EXAMPLE, out, ignore=shutil.ignore_patterns("*.png", "*.md"))
    return out
