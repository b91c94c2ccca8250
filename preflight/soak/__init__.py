"""The soak, controller side, by job.

Running one (``preflight soak``; ``controller`` puts the steps together): ``plan`` turns the
options into a plan kept in run.json, ``ship`` sends the agent of ``preflight.node`` to every
node and starts it, ``follow`` mirrors each node's files as they grow and shows the live view,
``merge`` makes one ``preflight-soak/1`` directory of the copies.

Judging one (``preflight analyze SOAK_DIR``, and the end of ``preflight soak``): ``data``
reads, validates and writes a soak directory; ``figures`` reduces it to per-GPU summaries and
throughput trends; ``context`` hands those to the soak checks of ``checks/soak.py`` with the
verdicts of ``gpu_verdicts``, ``throughput`` and ``server_log`` (``fmt`` writes their figures);
``analysis`` runs the checks and makes the report's ``soak`` section; ``judge`` turns that into
an ``Analysis`` like a bundle's; ``plots`` draws one PNG per host.

Nothing is imported here: pandas and matplotlib cost a second at start-up, and most commands
never need them. May import every stage up to ``preflight.report``.
"""
