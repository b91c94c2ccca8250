"""Report writers: one module per format, each a pure function of an ``Analysis``."""
