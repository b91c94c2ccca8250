"""The pytest plugin (``--preflight-*`` options; one item per host x check) and the acceptance
API (``Report``) that hand-written acceptance tests read. May import anything below it,
including ``preflight.app`` (a plugin run is a ``preflight run``).
"""
