"""The ``cotenant`` command line: ``main`` (the parser and the small commands: serve, agent,
nvml, config) and one module per larger command (``bench``, ``demo``, ``diagnose``,
``gateway``, ``import_gentd26``, ``rca_table``, ``report``, ``rules``, ``simulate``), with the
argument types they share (``argtypes``) and the HTTP client of the remote commands
(``remote``). See docs/architecture.md."""
