"""The OTLP trace receivers (HTTP and gRPC) and their ingest pipeline: decoding, the byte
budget, span normalisation into ``requests`` rows (critical path, pending children). See
docs/architecture.md."""
