"""report/json_lines.py: one JSON document, a record to a line."""

from __future__ import annotations

import json

from preflight.report import json_lines


def test_each_record_is_one_line_and_the_document_reads_back_whole():
    doc = {"node": "gpu\n01", "since": "2026-11-01T00:00:00+00:00", "empty": [], "nothing": None,
           "runs": [{"run_id": "r1", "summary": "line one\nline two }, {", "figures": {"busbw_gbs": 475.5}},
                    {"run_id": "r2", "causes": [{"cause": "nvlink-down"}], "text": "\u00e9\x1b[31m"}],
           "rates": [1, 2.5, None]}
    text = json_lines.dumps(doc)
    back = json.loads(text)
    assert back == doc
    lines = text.splitlines()
    assert lines[0] == "{" and lines[-1] == "}" and text.endswith("}\n")
    assert [json.loads(line.rstrip(",")) for line in lines if line.startswith("  ")] == doc["runs"] + doc["rates"]
