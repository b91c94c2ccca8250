"""nccl-tests' ``-J`` JSON report (format version 3), read into the records the text parser gives
(``preflight.parse.nccl_tests``), a report cut short included: nccl-tests writes it as it goes."""

from __future__ import annotations

import json
import re
from typing import Any

from preflight.parse import ParseError
from preflight.parse.nccl_tests import (
    NcclDevice,
    NcclOutput,
    NcclRow,
    NcclTiming,
    _collective_name,
    _count,
    _finish,
    _float,
    _run_notes,
    _RunBuilder,
    _version_from_code,
)


def parse_nccl_json(text: str) -> NcclOutput:
    """The run in an nccl-tests ``-J`` report (format version 3)."""
    body = text.strip()
    if not body.startswith("{"):
        raise ParseError("not an nccl-tests JSON report (no JSON object)")
    notes: list[str] = []
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        data = _load_truncated_json(body)
        if data is None:
            raise ParseError("not an nccl-tests JSON report (unreadable JSON)") from None
        notes.append("JSON report is truncated: read up to its last complete value")
    if not isinstance(data, dict) or not {"version", "config", "results"} & data.keys():
        raise ParseError("JSON without the keys of an nccl-tests report")
    if data.get("version") != 3:
        notes.append(f"JSON format version {data.get('version')!r}, read as version 3")

    config: dict[str, Any] = data["config"] if isinstance(data.get("config"), dict) else {}
    devices = tuple(d for d in map(_json_device, config.get("devices") or ()) if d)
    rows, run_notes = [], []
    for index, item in enumerate(data.get("results") or ()):
        row = _json_row(item)
        if row is None:
            run_notes.append(f"results[{index}]: incomplete result record skipped")
        else:
            rows.append(row)
    args = data.get("args") or ()
    code = data.get("nccl_version")
    average = data.get("average_bus_bandwidth")
    bounds = data.get("out_of_bounds")
    builder = _RunBuilder(
        collective=_collective_name(str(args[0])) if args else None,
        nccl_version=_version_from_code(code) if isinstance(code, int) else None,
        settings={
            key: config[json_key]
            for key, json_key in (
                ("nthread", "nthreads"),
                ("ngpus", "ngpus"),
                ("minbytes", "minimum_bytes"),
                ("maxbytes", "maximum_bytes"),
                ("iters", "iterations"),
                ("validation", "validation"),
            )
            if isinstance(config.get(json_key), int)
        },
        devices=list(devices),
        rows=rows,
        out_of_bounds=bounds.get("count") if isinstance(bounds, dict) else None,
        avg_busbw=_float(average.get("bandwidth")) if isinstance(average, dict) else None,
        errors=[e for e in data.get("errors") or () if isinstance(e, str) and e],
        notes=run_notes,
    )
    run = _finish(builder)
    return NcclOutput(runs=(run,), notes=tuple(notes) + _run_notes((run,)))


def _json_device(item: Any) -> NcclDevice | None:
    try:
        return NcclDevice(
            rank=int(item["rank"]),
            group=int(item["group"]) if item.get("group") is not None else None,
            pid=int(item["pid"]),
            host=str(item["hostname"]),
            device=int(item["device"]),
            bus_id=str(item.get("device_hex", "")),
            name=str(item.get("device_info", "")),
        )
    except (KeyError, TypeError, ValueError):
        return None


def _json_row(item: Any) -> NcclRow | None:
    if not isinstance(item, dict):
        return None
    in_place = _json_timing(item.get("in_place"))
    size, count = item.get("size"), item.get("count")
    if in_place is None or not isinstance(size, int) or not isinstance(count, int):
        return None
    root = str(item.get("root", "")).strip()
    return NcclRow(
        size_bytes=size,
        count=count,
        type=str(item.get("type", "")),
        redop=str(item.get("redop", "")),
        root=int(root) if re.fullmatch(r"-?[0-9]+", root) else None,
        out_of_place=_json_timing(item.get("out_of_place")),
        in_place=in_place,
    )


def _json_timing(item: Any) -> NcclTiming | None:
    if not isinstance(item, dict):
        return None
    time_us = _float(item.get("time", item.get("cpu_time")))
    algbw, busbw = _float(item.get("alg_bw")), _float(item.get("bus_bw"))
    if time_us is None or algbw is None or busbw is None:
        return None
    raw_wrong = item.get("nwrong")
    wrong = _count(_float(raw_wrong))
    if raw_wrong is not None and wrong is None and raw_wrong != "N/A":
        return None  # not a count (NaN, infinity, a fraction): the timing is unreadable
    return NcclTiming(time_us, algbw, busbw, wrong=wrong, max_error=None)


def _load_truncated_json(body: str) -> Any:
    """Parse a JSON text cut short, by closing it after its last complete value. nccl-tests
    writes the report as it goes, so a crash or kill leaves exactly such a prefix."""
    stack: list[str] = []
    in_string = escaped = False
    cut, closers = 0, ""
    for i, char in enumerate(body):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            stack.append("}" if char == "{" else "]")
        elif char in "}]" and stack:
            stack.pop()
            cut, closers = i + 1, "".join(reversed(stack))
        elif char == ",":
            cut, closers = i, "".join(reversed(stack))
    try:
        return json.loads(body[:cut] + closers) if cut else None
    except json.JSONDecodeError:
        return None
