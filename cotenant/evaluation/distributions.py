"""The distributions a scenario population is drawn from (:mod:`evaluation.population`),
stated in one place; docs/accuracy.md ("The populations") describes each field."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Distributions:
    """What a population is drawn from. Ranges are ``(low, high)``; *log-uniform* draws are
    uniform in the logarithm. Every field is documented in docs/accuracy.md ("The
    populations"). Units: seconds, requests per second, fractions."""

    # the node
    gpus_per_node: tuple[float, ...] = (0.6, 0.4)  # P(1 GPU), P(2 GPUs)
    tenants_per_gpu: tuple[int, int] = (1, 5)  # uniform integer
    gpu_presets: tuple[str, ...] = ("h100-sxm", "h200", "a100-80g", "l4")  # uniform
    # sharing: uniform over the modes the preset supports (the L4 has no MIG)
    host_cpus: tuple[int, ...] = (8, 16, 32)  # uniform
    # load
    rate_rps: tuple[float, float] = (0.1, 200.0)  # log-uniform: each model's mean rate
    arrival_kinds: dict[str, float] = field(
        default_factory=lambda: {"poisson": 0.4, "bursty": 0.3, "trace": 0.3}
    )
    traces: tuple[str, ...] = (
        "azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv",
        "azure-llm-inference-2023/AzureLLMInferenceTrace_code.csv",
    )  # uniform; replayed from a uniform offset, scaled to the drawn rate
    burst_ratio: tuple[float, float] = (3.0, 10.0)  # bursty: burst / base rate, uniform
    burst_s: tuple[float, float] = (5.0, 30.0)  # bursty: mean burst length, uniform
    gap_s: tuple[float, float] = (30.0, 180.0)  # bursty: mean gap, uniform
    gpu_utilisation: tuple[float, float] = (0.1, 0.6)  # uniform: offered GPU load per GPU
    llm_share: float = 0.4  # P(LLM physics) for a model at <= llm_max_rps
    llm_max_rps: float = 20.0
    cpu_utilisation: tuple[float, float] = (0.05, 0.4)  # uniform: host cores busy preprocessing
    p_preprocess: float = 0.5
    p_lock: float = 0.3
    p_transfer: float = 0.3
    slo_classes: dict[str, float] = field(
        default_factory=lambda: {"tight": 1 / 3, "loose": 1 / 3, "absent": 1 / 3}
    )
    tight_slo: tuple[float, float] = (1.5, 2.5)  # x the model's pilot p99, uniform
    loose_slo: tuple[float, float] = (4.0, 10.0)
    pilot_s: float = 180.0  # fault-free pilot run that sets the SLOs
    # faults
    faults_per_scenario: tuple[float, ...] = (0.5, 0.35, 0.15)  # P(1), P(2), P(3)
    fault_kinds: tuple[str, ...] = (
        "cotenant_burst",
        "process_active",
        "bandwidth_hog",
        "lock_hog",
        "throttle",
        "memory_pressure",
        "cpu_hog",
        "load_surge",
        "length_shift",
        "model_load",
    )  # uniform
    fault_size: tuple[float, float] = (1.1, 3.0)  # log-uniform (meaning per kind: the docs)
    fault_s: tuple[float, float] = (30.0, 600.0)  # log-uniform
    first_fault_s: tuple[float, float] = (240.0, 300.0)  # uniform: history before the first
    later_fault_offset_s: tuple[float, float] = (0.0, 240.0)  # uniform, after the first's start
    tail_s: tuple[float, float] = (60.0, 120.0)  # uniform: after the last fault ends
    control_s: tuple[float, float] = (1200.0, 3600.0)  # uniform: fault-free controls


DEFAULT = Distributions()
