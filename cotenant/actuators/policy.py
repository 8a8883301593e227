"""The actuation policy: which change to propose for each diagnosed cause (``rules/policy.yaml``).

:func:`load_policy` reads and validates the file once, at start; every error is a
:class:`store.errors.ConfigError` naming the file, the path inside it (``causes.cotenant.
share_gain``) and the bad value. :meth:`Policy.size_rate` turns a culprit's arrival rate and its
diagnosed share into a token bucket (rate, burst).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from cotenant.core.cause_kinds import CAUSE_KINDS, CauseKind
from cotenant.core.errors import ConfigError

BUNDLED_POLICY = Path(__file__).resolve().parent.parent / "rules" / "policy.yaml"
"""The policy used when ``[actuators] policy`` is empty."""


ActionKind = Literal["rate_limit", "priority", "reroute", "notify"]
_ACTIONS: tuple[str, ...] = ("rate_limit", "priority", "reroute", "notify")
_TARGETS: tuple[str, ...] = ("culprit", "victim")
_BASES: tuple[str, ...] = ("pre", "during")


@dataclass(frozen=True)
class CauseRule:
    """What to do about one cause kind."""

    action: ActionKind
    target: str = "culprit"
    priority: int | None = None
    share_gain: float = 0.5
    basis: str = "pre"
    lookback_s: float = 60.0
    burst_s: float = 1.0
    min_rate_rps: float = 0.0
    min_share: float = 0.2
    min_confidence: float = 0.3
    max_wait_s: float | None = None


@dataclass(frozen=True)
class VerifyRule:
    baseline_margin: float = 0.2
    culprit_hurt_ratio: float = 1.0


@dataclass(frozen=True)
class RerouteRule:
    """How ``reroute`` moves a victim's traffic between its replicas (``actuators.reroute``).

    ``fallback``: cause kinds whose own action is replaced by a reroute when it cannot be
    applied (its culprit served no requests, or the rule only notifies) or was rolled back.
    ``max_step``: the most of the model's traffic (0-1) one step moves; ``min_weight``: the
    weight (of 256) the contended replica keeps; ``headroom``: another model on a receiving
    GPU must be at p99 <= headroom x its SLO (the victim's own replica there: <= its SLO);
    ``step_settle_s``: wait after each step before judging it; ``max_steps``; ``lookback_s``:
    recent data the headroom is judged on."""

    fallback: tuple[str, ...] = (CauseKind.COTENANT, CauseKind.BANDWIDTH, CauseKind.THROTTLE)
    max_step: float = 0.25
    min_weight: int = 0
    headroom: float = 0.8
    step_settle_s: float = 10.0
    max_steps: int = 4
    lookback_s: float = 30.0


@dataclass(frozen=True)
class Policy:
    """A validated policy. ``rules`` has an entry for every kind in :data:`CAUSE_KINDS`
    (kinds the file does not name are ``notify``); ``reroute`` is None when the file has
    no ``reroute`` section (no traffic is ever moved)."""

    path: str
    rules: dict[str, CauseRule]
    verify: VerifyRule = field(default_factory=VerifyRule)
    reroute: RerouteRule | None = None

    def reroutes(self, kind: str) -> bool:
        """Whether a ``kind`` cause may be answered by moving the victim's traffic."""
        if self.reroute is None:
            return False
        return self.rule(kind).action == "reroute" or kind in self.reroute.fallback

    def rule(self, kind: str) -> CauseRule:
        """The rule for ``kind``; an unknown kind is treated as ``unknown``."""
        return self.rules.get(kind) or self.rules[CauseKind.UNKNOWN]

    @staticmethod
    def size_rate(
        rule: CauseRule, basis_rps: float, share: float, floor_rps: float
    ) -> tuple[float, int]:
        """Token bucket for a target whose basis arrival rate is ``basis_rps`` (requests/s) and
        that explains ``share`` (0-1) of the victim's excess: ``rate = basis x (1 - share x
        share_gain)`` floored at ``max(floor_rps, rule.min_rate_rps)`` (and at 0.001 rps),
        ``burst = max(1, ceil(rate x burst_s))``. Returns ``(rate_rps, burst)``."""
        share = min(max(share, 0.0), 1.0)
        rate = max(basis_rps, 0.0) * max(0.0, 1.0 - share * rule.share_gain)
        rate = max(rate, floor_rps, rule.min_rate_rps, 0.001)
        return round(rate, 3), max(1, math.ceil(rate * rule.burst_s))


_RULE_KEYS: dict[str, tuple[str, float | None, float | None]] = {
    # key: (type, min, max)
    "share_gain": ("float", 0.0, 1.0),
    "lookback_s": ("float", 1.0, 86_400.0),
    "burst_s": ("float", 0.001, 3600.0),
    "min_rate_rps": ("float", 0.0, None),
    "min_share": ("float", 0.0, 1.0),
    "min_confidence": ("float", 0.0, 1.0),
    "priority": ("int", -1_000_000.0, 1_000_000.0),
    "max_wait_s": ("float", 0.0, 3600.0),
}


class _Reader:
    """Validation helpers that name the file and the path in every error."""

    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, where: str, value: Any, why: str) -> ConfigError:
        return ConfigError(f"policy {self.path}: {where}: bad value {value!r}: {why}")

    def table(self, where: str, value: Any) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(where, value, "expected a mapping")
        return value

    def number(self, where: str, value: Any, kind: str, lo: float | None, hi: float | None) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(where, value, "expected a number")
        if kind == "int" and not isinstance(value, int):
            raise self.fail(where, value, "expected an integer")
        if not math.isfinite(value):
            raise self.fail(where, value, "expected a finite number")
        if lo is not None and value < lo:
            raise self.fail(where, value, f"must be >= {lo:g}")
        if hi is not None and value > hi:
            raise self.fail(where, value, f"must be <= {hi:g}")
        return int(value) if kind == "int" else float(value)

    def choice(self, where: str, value: Any, choices: tuple[str, ...]) -> str:
        if value not in choices:
            raise self.fail(where, value, f"must be one of {', '.join(choices)}")
        return str(value)

    def known(self, where: str, table: Mapping[str, Any], keys: tuple[str, ...]) -> None:
        for k in table:
            if k not in keys:
                raise self.fail(
                    f"{where}.{k}" if where else str(k),
                    k,
                    f"unknown key (known: {', '.join(keys)})",
                )


def _rule_fields(r: _Reader, where: str, raw: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _RULE_KEYS:
            typ, lo, hi = _RULE_KEYS[key]
            out[key] = r.number(f"{where}.{key}", value, typ, lo, hi)
        elif key == "basis":
            out[key] = r.choice(f"{where}.{key}", value, _BASES)
    return out


_REROUTE_KEYS: dict[str, tuple[str, float | None, float | None]] = {
    "max_step": ("float", 0.01, 1.0),
    "min_weight": ("int", 0.0, 256.0),
    "headroom": ("float", 0.1, 1.0),
    "step_settle_s": ("float", 1.0, 3600.0),
    "max_steps": ("int", 1.0, 100.0),
    "lookback_s": ("float", 1.0, 3600.0),
}


def _reroute(r: _Reader, raw: Any) -> RerouteRule:
    body = r.table("reroute", raw or {})
    r.known("reroute", body, ("fallback", *_REROUTE_KEYS))
    fields: dict[str, Any] = {
        k: r.number(f"reroute.{k}", v, *_REROUTE_KEYS[k])
        for k, v in body.items()
        if k != "fallback"
    }
    if "fallback" in body:
        kinds = body["fallback"]
        if not isinstance(kinds, list):
            raise r.fail("reroute.fallback", kinds, "expected a list of cause kinds")
        for i, k in enumerate(kinds):
            r.choice(f"reroute.fallback[{i}]", k, CAUSE_KINDS)
        fields["fallback"] = tuple(kinds)
    return RerouteRule(**fields)


def parse_policy(data: Any, path: str = "<policy>") -> Policy:
    """Validate a parsed policy document; raises ConfigError naming ``path`` and the field."""
    r = _Reader(path)
    doc = r.table("(top level)", data)
    r.known("", doc, ("version", "defaults", "verify", "reroute", "causes"))
    if doc.get("version") != 1:
        raise r.fail("version", doc.get("version"), "must be 1")
    defaults_raw = r.table("defaults", doc.get("defaults", {}) or {})
    default_keys = (*(k for k in _RULE_KEYS if k not in ("priority", "max_wait_s")), "basis")
    r.known("defaults", defaults_raw, default_keys)
    defaults = _rule_fields(r, "defaults", defaults_raw)
    verify_raw = r.table("verify", doc.get("verify", {}) or {})
    r.known("verify", verify_raw, ("baseline_margin", "culprit_hurt_ratio"))
    verify = VerifyRule(
        **{k: r.number(f"verify.{k}", v, "float", 0.0, 100.0) for k, v in verify_raw.items()}
    )
    causes_raw = r.table("causes", doc.get("causes", {}) or {})
    rules: dict[str, CauseRule] = {}
    for kind, raw in causes_raw.items():
        where = f"causes.{kind}"
        if kind not in CAUSE_KINDS:
            raise r.fail(where, kind, f"not a cause kind (known: {', '.join(CAUSE_KINDS)})")
        if isinstance(raw, str):  # shorthand: `throttle: notify`
            raw = {"action": raw}
        body = r.table(where, raw)
        r.known(where, body, ("action", "target", *_RULE_KEYS, "basis"))
        action = r.choice(f"{where}.action", body.get("action"), _ACTIONS)
        target = r.choice(f"{where}.target", body.get("target", "culprit"), _TARGETS)
        fields = {**defaults, **_rule_fields(r, where, body)}
        if action == "priority" and "priority" not in body:
            raise r.fail(f"{where}.priority", None, "a priority action needs a priority")
        if action != "priority" and "priority" in body:
            raise r.fail(
                f"{where}.priority", body["priority"], f"only for action priority, not {action}"
            )
        if action != "rate_limit" and "max_wait_s" in body:
            raise r.fail(
                f"{where}.max_wait_s",
                body["max_wait_s"],
                f"only for action rate_limit, not {action}",
            )
        if action == "rate_limit" and kind in (CauseKind.THROTTLE, CauseKind.UNKNOWN):
            raise r.fail(f"{where}.action", action, f"a {kind} cause has no model to rate-limit")
        if action == "reroute":
            if "reroute" not in doc:
                raise r.fail(f"{where}.action", action, "needs a top-level reroute section")
            if body.get("target", "victim") != "victim":
                raise r.fail(f"{where}.target", body["target"], "a reroute moves the victim")
            target = "victim"
        rules[kind] = CauseRule(action=action, target=target, **fields)  # type: ignore[arg-type]
    for kind in CAUSE_KINDS:
        rules.setdefault(kind, CauseRule(action="notify", **defaults))
    reroute = _reroute(r, doc["reroute"]) if "reroute" in doc else None
    return Policy(path=path, rules=rules, verify=verify, reroute=reroute)


def load_policy(path: str | Path | None = None) -> Policy:
    """Read and validate the policy file (the bundled one when ``path`` is None or empty)."""
    p = Path(path) if path else BUNDLED_POLICY
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"policy {p}: file does not exist (set [actuators] policy)") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"policy {p}: cannot be read: {exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"policy {p}: not valid YAML: {exc}") from exc
    return parse_policy(data, str(p))
