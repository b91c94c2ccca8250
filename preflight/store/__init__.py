"""The results store: every finished report kept in SQLite (embedded, the default) or
PostgreSQL (a fleet's), and the questions asked of it over time. A layer of its own above
``judge``, whose rules of time (``judge.trends``) and figures it shares: it reads finished
reports (``preflight-report/1``), never the stages that make them, and nothing below it imports
it; ``app`` hands it a report once the report is on disk, so a store that is down costs a
warning, never a verdict, and hands its answers to the judgement as plain records
(``model.HostHistory``)."""

from preflight.store.db import SchemaMismatch, Store, StoreCorrupt, StoreError, StoreUnavailable
from preflight.store.location import StoreUrl, StoreUrlError, chosen, parse

__all__ = ["SchemaMismatch", "Store", "StoreCorrupt", "StoreError", "StoreUnavailable", "StoreUrl",
           "StoreUrlError", "chosen", "parse"]
