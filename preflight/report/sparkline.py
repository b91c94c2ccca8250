"""Tiny inline SVG for HTML reports: a sparkline of a series (a failing node's recent readings
in a table cell) and the linear scale the report plots share. Hand-written SVG, no plotting
library: a report page stays one self-contained file that renders without scripts."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

_PAD = 2.0  # keeps the stroke and the end dot inside the box


def linear(lo: float, hi: float, a: float, b: float) -> Callable[[float], float]:
    """The map of ``[lo, hi]`` onto ``[a, b]``; a range of one value maps to the middle, so a
    flat series draws a flat line instead of dividing by zero."""
    if hi == lo:
        return lambda _: (a + b) / 2
    k = (b - a) / (hi - lo)
    return lambda v: a + (v - lo) * k


def points(xy: Sequence[tuple[float, float]]) -> str:
    """An SVG ``points`` attribute, rounded to a tenth of a pixel (finer is only bytes)."""
    return " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)


def sparkline_svg(values: Sequence[float], width: int = 120, height: int = 24) -> str:
    """The values in order, evenly spaced, scaled to their own range, with a dot on the last:
    the shape of a node's recent history at a glance. Non-finite values are left out; with none
    left, an empty box of the same size keeps a table's column aligned."""
    kept = [float(v) for v in values if math.isfinite(v)]
    head = (f'<svg class="spark" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img"')
    if not kept:
        return f'{head} aria-label="no readings"></svg>'
    x = linear(0, max(len(kept) - 1, 0), _PAD, width - _PAD)
    y = linear(min(kept), max(kept), height - _PAD, _PAD)
    xy = [(x(i), y(v)) for i, v in enumerate(kept)]
    last_x, last_y = xy[-1]
    return (f'{head} aria-label="{len(kept)} readings, last {kept[-1]:g}">'
            f'<polyline fill="none" stroke="currentColor" stroke-width="1.5" points="{points(xy)}"/>'
            f'<circle cx="{last_x:.1f}" cy="{last_y:.1f}" r="2" fill="currentColor"/></svg>')
