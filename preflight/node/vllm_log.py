"""What a vLLM server's log says went wrong: known failure signatures, and their meaning.

Standard library only and free of preflight imports: the ``vllm`` soak engine (vllm_engine.py,
beside this file on a node) scans its server's log with ``scan_server_log`` when the soak ends
and records each finding's symptom and line in events.csv; the soak's analysis, on the
controller, reads the words back with ``describe_symptom``. So the table below is the one
place that knows both the signatures and what to try.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

SERVER_LOG = "vllm-server.log"


@dataclass(frozen=True)
class LogFinding:
    """A known failure seen in the server log: the symptom code, what it means, what to try,
    and the first line that showed it (1-based number and text)."""

    symptom: str
    summary: str
    suggestion: str
    line: int
    excerpt: str


# First match wins per symptom. Message texts are vLLM's and PyTorch's own (e.g. vllm
# v1/core/kv_cache_utils.py, v1/worker/gpu_model_runner.py in 0.32.0). Symptom names are the
# knowledge base's (playbooks/rules.yaml, causes.yaml), which turns them into diagnoses.
_SIGNATURES: Tuple[Tuple[str, "re.Pattern[str]", str, str], ...] = (
    ("vllm-cuda-graph-capture-error", re.compile(r"Cannot capture graph|CUDA graph capture.*(fail|error)|"
                                            r"(fail|error).*capturing CUDA graph", re.I),
     "CUDA graph capture failed while the server started",
     "restart with --enforce-eager (no CUDA graphs); if it then runs, the graph capture of this "
     "model/quantization is the fault, not the GPU"),
    ("vllm-illegal-memory-access", re.compile(r"illegal memory access", re.I),
     "a CUDA kernel made an illegal memory access",
     "retry with --enforce-eager (known with CUDA graphs and some quantized models); if it "
     "persists, look for XID 13/31/43 on this GPU in the kernel log"),
    ("vllm-no-kv-cache-memory", re.compile(r"No available memory for the cache blocks|"
                                           r"larger than the available KV cache memory"),
     "no GPU memory left for the KV cache after the weights",
     "raise --gpu-memory-utilization (vLLM's own advice) if the GPU has room, lower --max-model-len, "
     "or spread the model with a larger --tensor-parallel-size"),
    ("vllm-oom", re.compile(r"CUDA out of memory|OutOfMemoryError|not enough GPU memory"),
     "the GPU ran out of memory",
     "lower --gpu-memory-utilization, --max-num-seqs or --max-model-len, or use a larger "
     "--tensor-parallel-size; check that no other process holds GPU memory"),
    ("vllm-engine-dead", re.compile(r"EngineDeadError|EngineCore encountered a fatal error|died unexpectedly"),
     "the vLLM engine process died during the soak",
     "read the traceback before this line in the server log; a GPU fault shows as an XID in the kernel log"),
)


def describe_symptom(symptom: str) -> Optional[Tuple[str, str]]:
    """(what it means, what to try) for a symptom ``scan_server_log`` reports, else None: the
    soak directory keeps only the symptom and its line (events.csv), the analysis the words."""
    for name, _, summary, suggestion in _SIGNATURES:
        if name == symptom:
            return summary, suggestion
    return None


def scan_server_log(text: str) -> Tuple[LogFinding, ...]:
    """The known signatures in a vLLM server log, each once, in order of first appearance."""
    found: Dict[str, LogFinding] = {}
    for number, line in enumerate(text.splitlines(), 1):
        for symptom, pattern, summary, suggestion in _SIGNATURES:
            if symptom not in found and pattern.search(line):
                found[symptom] = LogFinding(symptom, summary, suggestion, number, line.strip()[:300])
    return tuple(sorted(found.values(), key=lambda f: f.line))
