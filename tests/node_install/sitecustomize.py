"""A node install, simulated: loaded at start-up by the interpreters that
tests/app/test_node_install.py starts (this directory first on PYTHONPATH), it makes pandas, numpy
and matplotlib impossible to import, as on a machine where only the core package is installed
(pyproject.toml's ``dependencies``, without the ``analysis`` extra). Every attempt, even one the
code catches, is appended to $PREFLIGHT_BLOCKED_LOG, so a test can tell "never imported" from
"imported and the error swallowed"."""

import os
import sys

BLOCKED = frozenset({"pandas", "numpy", "matplotlib"})


class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] not in BLOCKED:
            return None
        log = os.environ.get("PREFLIGHT_BLOCKED_LOG")
        if log:
            with open(log, "a") as f:
                f.write(name + "\n")
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)


sys.meta_path.insert(0, _NotInstalled())
