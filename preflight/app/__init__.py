"""The command line, the only layer that imports every stage: argument parsing with the option
groups ``run``, ``soak`` and the pytest plugin share, the error table behind exit code 2, and
the orchestration of one ``preflight run``.
"""
