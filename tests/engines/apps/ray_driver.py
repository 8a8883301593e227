"""Starts a one-node Ray cluster with Serve and its dashboard (the REST API) on loopback, prints
``ready``, and holds it until its standard input closes (the test finished, or died), then shuts
the cluster down: everything it started goes with it.

    python ray_driver.py DASHBOARD_PORT HTTP_PORT TEMP_DIR [METRICS_PORT]

METRICS_PORT: where the cluster's Prometheus page (``/metrics``, Serve's ``ray_serve_*``)
is served.
"""

from __future__ import annotations

import sys

import ray
from ray import serve


def main() -> None:
    dash, http, temp = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    metrics = int(sys.argv[4]) if len(sys.argv) > 4 else None
    ray.init(
        num_cpus=2,
        include_dashboard=True,
        dashboard_host="127.0.0.1",
        dashboard_port=dash,
        _temp_dir=temp,
        _metrics_export_port=metrics,
        configure_logging=False,
    )
    serve.start(http_options={"host": "127.0.0.1", "port": http})
    print("ready", flush=True)
    sys.stdin.read()
    serve.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
