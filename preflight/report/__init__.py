"""Report writers: one module per format, each a pure function of an ``Analysis`` (terminal,
report.json, report.md, report.html, junit.xml, Prometheus textfile, run-to-run diff).
May import: ``preflight.model`` and the stages below; never the command line.
"""
