"""The node's copies of the contract strings agree with preflight.contracts.

Code that runs on nodes cannot import preflight, so the agent keeps its own format names, file
names and columns (its row dataclasses' fields are its CSV columns); the controller side reads
and merges what it writes with preflight.contracts'. A rename on one side only would show on a
real node as a soak directory the analysis refuses, or columns the merge drops: here it fails.
"""

from __future__ import annotations

import csv
import json
from dataclasses import fields

from fake_nvml import FakeNvml

from preflight import contracts
from preflight.node import ib_snapshots, records, vllm_engine, vllm_log
from preflight.node.agent import Agent, AgentConfig
from preflight.soak import data, follow, merge


def test_the_agents_format_names_are_the_contracts():
    assert records.FORMAT == contracts.SOAK_FORMAT
    assert records.HEARTBEAT_FORMAT == contracts.HEARTBEAT_FORMAT


def test_the_agents_rows_are_the_contracts_columns():
    assert tuple(f.name for f in fields(records.GpuSample)) == records.TELEMETRY_COLUMNS
    assert records.TELEMETRY_COLUMNS == contracts.AGENT_TELEMETRY_COLUMNS
    assert records.TELEMETRY_COLUMNS[:len(contracts.TELEMETRY_COLUMNS)] == contracts.TELEMETRY_COLUMNS
    assert contracts.SLOWDOWN_COLUMN in records.TELEMETRY_COLUMNS
    assert tuple(f.name for f in fields(records.ThroughputRow)) == records.THROUGHPUT_COLUMNS
    assert records.THROUGHPUT_COLUMNS == contracts.AGENT_THROUGHPUT_COLUMNS
    assert records.THROUGHPUT_COLUMNS[:len(contracts.THROUGHPUT_COLUMNS)] == contracts.THROUGHPUT_COLUMNS
    # The vllm and endpoint engines build throughput rows of their own, written the same way.
    assert tuple(f.name for f in fields(vllm_engine.EngineRow)) == contracts.AGENT_THROUGHPUT_COLUMNS
    assert tuple(f.name for f in fields(records.EventRow)) == records.EVENT_COLUMNS == contracts.EVENT_COLUMNS


def test_the_agents_file_names_are_the_ones_the_controller_reads_and_mirrors():
    assert (records.SOAK_JSON, records.TELEMETRY_CSV, records.THROUGHPUT_CSV, records.EVENTS_CSV) == (
        contracts.SOAK_JSON, contracts.TELEMETRY_CSV, contracts.THROUGHPUT_CSV, contracts.EVENTS_CSV)
    assert follow.HEARTBEAT_JSON == records.HEARTBEAT_JSON
    assert {records.AGENT_LOG, vllm_log.SERVER_LOG, vllm_engine.LOADGEN_LOG} == set(follow.AGENT_LOGS)
    assert set(follow.APPEND_FILES) | set(follow.WHOLE_FILES) == {
        records.TELEMETRY_CSV, records.THROUGHPUT_CSV, records.EVENTS_CSV, records.SOAK_JSON, records.HEARTBEAT_JSON,
        ib_snapshots.IB_COUNTERS_TXT, *follow.AGENT_LOGS}
    assert (ib_snapshots.IB_COUNTERS_TXT, ib_snapshots.FORMAT) == (contracts.IB_COUNTERS_TXT,
                                                                  contracts.IB_COUNTERS_FORMAT)
    # The merge's empty files get the agent's headers.
    assert merge.MERGED_CSVS == {contracts.TELEMETRY_CSV: records.TELEMETRY_COLUMNS,
                                 contracts.THROUGHPUT_CSV: records.THROUGHPUT_COLUMNS,
                                 contracts.EVENTS_CSV: records.EVENT_COLUMNS}


def test_the_soak_reader_uses_the_contracts_strings():
    assert data.TELEMETRY_COLUMNS is contracts.TELEMETRY_COLUMNS
    assert data.THROUGHPUT_COLUMNS is contracts.THROUGHPUT_COLUMNS
    assert data.SLOWDOWN_COLUMN is contracts.SLOWDOWN_COLUMN


def test_what_an_agent_writes_carries_the_contracts_names(tmp_path):
    cfg = AgentConfig(out=tmp_path, host="h200", engine="none", seconds=0.2, interval_s=0.1)
    assert Agent(cfg, lambda: FakeNvml(gpus=1)).run() == 0
    assert json.loads((tmp_path / contracts.SOAK_JSON).read_text())["format"] == contracts.SOAK_FORMAT
    assert json.loads((tmp_path / records.HEARTBEAT_JSON).read_text())["format"] == contracts.HEARTBEAT_FORMAT
    for name, columns in ((contracts.TELEMETRY_CSV, contracts.AGENT_TELEMETRY_COLUMNS),
                          (contracts.THROUGHPUT_CSV, contracts.AGENT_THROUGHPUT_COLUMNS),
                          (contracts.EVENTS_CSV, contracts.EVENT_COLUMNS)):
        with (tmp_path / name).open(newline="") as f:
            assert tuple(next(csv.reader(f))) == columns, name
