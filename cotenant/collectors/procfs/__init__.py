"""Host CPU from procfs and sysfs: per-process CPU, the process tree, CPU frequency, the
Kubernetes identity of a process, and their ``/metrics`` series. See docs/architecture.md."""
