"""The verdict on a ``vllm`` soak's server log, from what the agent recorded of it.

The agent records each known failure ``vllm_log.scan_server_log`` found as an events.csv row
(event = the symptom, data = its line in ``vllm-server.log``), and each becomes a FAIL of
``soak-vllm-server`` with that symptom, what it means, what to try (its ``action``, which the
diagnosis shows) and the log line itself where the log was kept: ``soak/<host>/vllm-server.log``
in a run directory of ``preflight soak``, ``vllm-server.log`` in an agent's own directory. The
words come from ``preflight.node.vllm_log``, the table the engine scanned the log with.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from preflight.check import Outcome
from preflight.model import Evidence, Status
from preflight.node.vllm_log import SERVER_LOG, describe_symptom


def server_log(soak_dir: Path, hosts: Iterable[str], events: Iterable[Mapping[str, str]]) -> list[Outcome]:
    """One FAIL per host and server-log symptom among ``events`` (events.csv's rows)."""
    out = []
    for host, symptom, line in symptom_events(events, set(hosts)):
        summary, suggestion = describe_symptom(symptom)
        where = f"{SERVER_LOG} line {line}" if line is not None else SERVER_LOG
        quoted = _log_line(soak_dir, host, line)
        out.append(Outcome(
            Status.FAIL, f"vLLM server: {summary} ({where}); try: {suggestion}", (symptom,),
            (Evidence(SERVER_LOG, f"line {line}: {quoted}" if quoted else where),), {"line": line}, host, suggestion))
    return out


def symptom_events(events: Iterable[Mapping[str, str]], hosts: set[str]) -> list[tuple[str, str, int | None]]:
    """(host, symptom, line) of the rows that are server-log symptoms, in file order, each once;
    a row cut short reads as no event."""
    out: dict[tuple[str, str], int | None] = {}
    for row in events:
        host, symptom, data = row.get("host"), row.get("event"), (row.get("data") or "").strip()
        if host in hosts and symptom and describe_symptom(symptom) and (host, symptom) not in out:
            out[(host, symptom)] = int(data) if data.isdigit() else None
    return [(host, symptom, line) for (host, symptom), line in out.items()]


def _log_line(soak_dir: Path, host: str, line: int | None) -> str | None:
    """Line ``line`` (1-based) of the host's kept server log, stripped, or None."""
    if line is None:
        return None
    for path in (soak_dir / "soak" / host / SERVER_LOG, soak_dir / SERVER_LOG):
        try:
            with path.open(encoding="utf-8", errors="replace") as f:
                for number, text in enumerate(f, 1):
                    if number == line:
                        return text.strip()[:300]
        except FileNotFoundError:
            continue
    return None
