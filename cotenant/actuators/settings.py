"""The ``[actuators]`` configuration keys: the mode, the backend and the control loop's knobs."""

from __future__ import annotations

from dataclasses import dataclass

from cotenant.core.config_key import key


@dataclass(frozen=True)
class ActuatorSettings:
    """``[actuators]``: read by :func:`actuators.build.build_controller` (the policy file and
    the API token), :func:`actuators.backends.factory.make_backend` (the ``backend…`` keys
    and ``webhook_secret``) and :class:`actuators.controller.ActionController` (the mode,
    the loop's period and the guardrails)."""

    mode: str = key(
        "dry-run",
        "off: no proposals; dry-run: proposals recorded, nothing applied; manual: a person "
        "approves; auto: applied by the loop",
        choices=("off", "dry-run", "manual", "auto"),
    )
    token: str = key(
        "",
        "bearer token the mutating actions API requires ('' = mutating calls refused)",
        secret=True,
    )
    token_file: str = key("", "file holding the bearer token (used when token is '')")
    policy: str = key(
        "", "policy file mapping causes to actions ('' = the bundled cotenant/rules/policy.yaml)"
    )
    backend: str = key(
        "gateway",
        "where actions are applied",
        choices=("gateway", "rayserve", "triton", "webhook", "haproxy"),
    )
    backend_url: str = key(
        "",
        "base URL of the backend (gateway control API, Ray, Triton, webhook); haproxy: its "
        "stats socket, unix:///path or tcp://host:port",
    )
    haproxy_backends: dict[str, str] = key(
        {},
        "model -> HAProxy backend name (haproxy; a model not listed is its own backend) "
        "(env: 'llama=be_llama,tts=be_tts')",
    )
    webhook_secret: str = key("", "HMAC-SHA256 key signing webhook bodies", secret=True)
    backend_token_file: str = key(
        "",
        "file holding the bearer token of the backend's control API (gateway, rayserve; '' = "
        "COTENANT_GATEWAY_TOKEN for the gateway, Ray's RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH / "
        "~/.ray/auth_token for rayserve, or none)",
    )
    interval_s: float = key(5.0, "how often the control loop advances actions", min=0.1)
    max_actions_per_hour: int = key(10, "most actions applied per hour overall", min=0)
    max_actions_per_target_per_hour: int = key(3, "most actions per target per hour", min=0)
    cooldown_s: float = key(300.0, "quiet time per target after a change ends", min=0.0)
    settle_s: float = key(30.0, "wait after applying before verifying", min=0.0)
    ttl_s: float = key(1800.0, "an applied change is reverted after this long", min=1.0)
    min_rate_rps: float = key(1.0, "floor under any rate limit set on a model", min=0.0)
    backend_timeout_s: float = key(5.0, "timeout of one backend call", min=0.1, max=300.0)
    backend_retries: int = key(3, "retries of a failed backend call (with backoff)", min=0)
