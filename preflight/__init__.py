"""preflight: GPU cluster node health checks.

The package is laid out as the data flows, one folder per stage; a module imports only
from its own stage and the ones below it (tests/test_layers.py enforces the order):

    node/       runs ON a node (soak agent, sampler, burn, vLLM engine, load generator, torch
                all_reduce); stdlib + pynvml/torch, never imports preflight
    model.py    records that cross stages; contracts.py: format names, columns, exit codes
    parse/      raw text in, frozen records out, no I/O
    knowledge/  loaders for the playbooks (profiles, NIC matrix, Xid catalog, causes, rules)
    collect/    inventory, the Node transports, the fan-out, probes and their node-side scripts
    evidence/   the bundle on disk: writer, reader, reachability
    judge/      facts (declared once with their probes), host/fleet contexts, the check loader
    diagnose/   symptoms to causes; explain; bundle -> Analysis
    report/     terminal, JSON, Markdown, HTML, JUnit, Prometheus, diff
    soak/       the soak controller: plan, ship, follow, merge, judge
    app/        the command line: shared options, errors, run orchestration
    pytest/     the pytest plugin and the acceptance API

``check.py`` is the public check API; ``plugin.py`` keeps its first name working.
"""

__version__ = "0.1.0"
