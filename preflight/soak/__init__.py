"""Soak: the node-side agent, the controller that runs it, and the judgement of its data.

``agent`` runs on a node (shipped as source; stdlib + pynvml + torch); ``controller`` starts,
follows and collects agents (``preflight soak``); ``data`` reads, validates and writes a
``preflight-soak/1`` directory; ``analysis`` turns it into findings and the report's ``soak``
section; ``plots`` draws one PNG per host. Nothing is imported here: pandas and matplotlib
cost a second at start-up, and most commands never need them.
"""
