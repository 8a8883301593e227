"""The Prometheus rule files: ``render`` (write and check them) and one module per group of
rules (``cotenant``, ``exporters``, ``fleet``, ``tokens``, ``windows``), built from ``blocks``."""
