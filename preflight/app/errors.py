"""Bad input, in one table: every exception here means "refused before anything ran or was
written", and the command line turns each into its message and exit code 2."""

from __future__ import annotations

from preflight.collect.inventory import InventoryInvalid
from preflight.collect.slurm_job import SlurmUsageError
from preflight.diagnose.engine import PlaybookError
from preflight.evidence.bundle import BundleError
from preflight.judge.loader import CheckLoadError
from preflight.knowledge.profiles import ProfileError
from preflight.knowledge.site_profile import BaselineError
from preflight.lifecycle.policy import PolicyError
from preflight.soak.plan import SoakUsageError
from preflight.store import StoreError, StoreUrlError


class UsageError(Exception):
    """An option or a combination of options that cannot be honoured."""


INPUT_ERRORS: tuple[type[Exception], ...] = (
    InventoryInvalid, UsageError, BundleError, ProfileError, PlaybookError, CheckLoadError, SoakUsageError,
    SlurmUsageError, BaselineError,
    # The store's own commands (history, lifecycle) exit 2 on a store they cannot use; the run-like
    # commands catch these themselves and warn (preflight.app.store_cli.record_report).
    StoreError, StoreUrlError, PolicyError,
)
