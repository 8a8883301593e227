"""NVML: the GPU poller, its device health and error handling, per-process rows, the
``/metrics`` series, and the in-memory double ``FakeNvml``. See docs/architecture.md."""
