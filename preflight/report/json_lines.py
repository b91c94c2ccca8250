"""JSON for a person and a pipe at once: a document's top-level keys one to a line, each list one
item to a line. Still one JSON document (``json.load`` reads it), and grep keeps a record whole.

Why not ``json.dumps(doc, indent=1)``: an indent makes Python use its pure-Python encoder, about
five times slower than the C one: a node's year of five-minute healthchecks (100,000 runs) took
1.86 s to encode that way, 0.46 s item by item (bench/RESULTS.md)."""

from __future__ import annotations

import json


def dumps(doc: dict) -> str:
    """``doc`` as JSON, ending with a newline."""
    parts = []
    for key, value in doc.items():
        name = json.dumps(key)
        if isinstance(value, list) and value:
            parts.append(f" {name}: [\n  " + ",\n  ".join(map(json.dumps, value)) + "\n ]")
        else:
            parts.append(f" {name}: {json.dumps(value)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"
