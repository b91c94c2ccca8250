"""Reading the YAML data files (profiles, playbooks, the NIC matrix, the Xid catalog) and
command-line numbers, with errors that name the file and line or the option."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml


def read_yaml(path: Path, error: type[Exception]) -> Any:
    """The parsed file; ``error("<file>[:line]: what is wrong")`` when it cannot be read."""
    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise error(f"{path}: not a text file") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise error(f"{where}: invalid YAML ({getattr(exc, 'problem', exc)})") from None


def positive(kind):
    """An argparse ``type`` accepting numbers of ``kind`` above zero."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
        return value

    return parse
