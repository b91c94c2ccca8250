"""Evidence to findings: the facts (each declared once with the probes it needs), the host and
fleet contexts checks read them through, the loader that finds checks, and the judgement of a
bundle. May import: everything below it (model, parse, knowledge, collect for probe ids,
evidence).
"""
