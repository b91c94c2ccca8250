"""Planning of the fabric tests, pure (no I/O): which nodes and which of their rails meet in
which round. ``pairing`` plans the rail stage's pairwise rounds; the collective's bisection
plans beside it. Execution (``preflight.collect``) and judgement (``preflight.judge``) read
these plans; nothing here runs a command or reads a clock."""
