"""The soak, controller side: ``controller`` starts the agent of ``preflight.node`` on every
node, follows it and collects its files (``preflight soak``); ``data`` reads, validates and
writes a ``preflight-soak/1`` directory; ``analysis`` turns it into findings and the report's
``soak`` section; ``plots`` draws one PNG per host. Nothing is imported here: pandas and
matplotlib cost a second at start-up, and most commands never need them. May import every
stage up to ``preflight.report``.
"""
