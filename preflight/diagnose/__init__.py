"""Findings to likely causes: the rules engine over ``playbooks/causes.yaml`` and
``rules.yaml``, ``explain``, and ``analyze`` (bundle -> judged and diagnosed ``Analysis``).
May import: ``preflight.judge`` and below.
"""
