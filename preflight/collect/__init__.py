"""Reaching nodes and running probes on them: the inventory, the ``Node`` transports
(local, SSH), the fan-out over many nodes, the probe catalogue with its node-side shell
scripts, and the multi-node all_reduce stage.

Every failure here is a result (a ``CommandResult`` or ``ProbeResult``), never an exception
that escapes a host. May import: ``preflight.model``, ``preflight.contracts``, ``preflight.parse``
(the multi-node stage reads each run to decide the next), ``preflight.knowledge``.
"""
