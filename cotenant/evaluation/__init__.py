"""Benchmark harnesses and closed-loop drivers: the layer above analysis, actuators and the
simulator (see docs/architecture.md).

Modules: ``accuracy`` (``cotenant bench --suite``: diagnosis accuracy on simulated scenarios,
side by side with the baselines), ``tabular_cases`` (``cotenant bench --tabular``),
``sim_backend`` (the actuator backend over a running simulation), ``closed_loop`` (the analysis
and control loops on a simulation's clock) and ``actuation_score`` (``cotenant bench
--actuate``'s scoring).
"""
