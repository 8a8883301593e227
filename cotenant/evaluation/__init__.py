"""Benchmark harnesses and closed-loop drivers: the layer above analysis, actuators and the
simulator (see docs/architecture.md).

Modules: ``population`` (scenario populations drawn from stated distributions: ``dev`` to tune
on, ``test`` to report on) with ``population_bench`` (``cotenant bench --population``) and
``victim_score`` (strict scoring per victim of the batch path and the live loop);
``accuracy`` (``cotenant bench --suite``: diagnosis accuracy on simulated scenarios, side by
side with the baselines), ``live`` (``--live``: the live loop on a virtual clock),
``tabular_cases`` (``cotenant bench --tabular``), ``sim_backend`` (the actuator backend over a
running simulation), ``closed_loop`` (the analysis and control loops on a simulation's clock)
and ``actuation_score`` (``cotenant bench --actuate``'s scoring).
"""
