"""The evidence bundle on disk (``preflight-bundle/1``): written atomically as results arrive,
read back for judging, and which hosts were reached. May import: ``preflight.model``,
``preflight.contracts``.
"""
