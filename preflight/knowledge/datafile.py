"""Reading the YAML data files (profiles, playbooks, the NIC matrix, the Xid catalog) and
command-line numbers, with errors that name the file and line or the option."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import yaml

# libyaml's loader where PyYAML was built with it: the same safe subset, and the playbooks that
# every command loads read in a fraction of the pure-Python loader's time (a cost every
# healthcheck and prolog pays inside its budget).
_BASE = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BASE):  # type: ignore[misc, valid-type]
    """The safe loader, with a date that does not exist (2026-02-30) refused as a YAML error
    at its line: PyYAML's own timestamp constructor lets ``datetime``'s ValueError through,
    without the place it came from."""


def _timestamp(loader, node):
    try:
        return yaml.constructor.SafeConstructor.construct_yaml_timestamp(loader, node)
    except (ValueError, OverflowError) as exc:
        raise yaml.constructor.ConstructorError(None, None, f"{node.value!r} is not a date: {exc}",
                                                node.start_mark) from None


_Loader.add_constructor("tag:yaml.org,2002:timestamp", _timestamp)
_LOADER = _Loader


def read_yaml(path: Path, error: type[Exception]) -> Any:
    """The parsed file; ``error("<file>[:line]: what is wrong")`` when it cannot be read."""
    try:
        return yaml.load(path.read_text(), Loader=_LOADER)
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise error(f"{path}: not a text file") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise error(f"{where}: invalid YAML ({getattr(exc, 'problem', exc)})") from None


# The longest wait any option may ask for: a week. Beyond it a number is a typo, and a
# "timeout 1e300" reaches the node's `timeout` command (or time.monotonic() arithmetic) as
# something that never ends.
LONGEST_S = 7 * 24 * 3600.0


def positive(kind, maximum: float | None = None):
    """An argparse ``type`` accepting finite numbers of ``kind`` above zero (and at most
    ``maximum``): NaN compares false with everything, so without this ``nan`` passed every
    bound and ``inf`` made a timeout that never fires."""

    def parse(text: str):
        try:
            value = kind(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number: {text!r}")
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum:g}: {text!r}")
        return value

    return parse


def fraction(what: str):
    """An argparse ``type`` accepting a number from 0 to 1; ``what`` says what it is a share of
    (nan compares false with both bounds, so it is refused with them)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not 0 <= value <= 1:
            raise argparse.ArgumentTypeError(f"must be a share of {what}, from 0 to 1: {text!r}")
        return value

    return parse
