"""The policy file: the bundled one loads, sizing follows share and rate, bad files are refused
with the file, the path and the value in the message."""

from __future__ import annotations

from pathlib import Path

import pytest

from cotenant.actuators.policy import BUNDLED_POLICY, Policy, load_policy
from cotenant.core.cause_kinds import CAUSE_KINDS
from cotenant.core.errors import ConfigError


def test_bundled_policy_covers_every_cause() -> None:
    p = load_policy()
    assert p.path == str(BUNDLED_POLICY)
    assert set(p.rules) == set(CAUSE_KINDS)
    assert p.rule("cotenant").action == "rate_limit"
    assert p.rule("bandwidth").action == "rate_limit"
    for kind in ("throttle", "memory", "unknown"):
        assert p.rule(kind).action == "notify"
    assert p.rule("no-such-kind").action == "notify"


def test_rate_sized_from_basis_and_share_with_floor() -> None:
    rule = load_policy().rule("cotenant")  # share_gain 0.5, burst_s 1
    assert Policy.size_rate(rule, 20.0, 0.5, 1.0) == (15.0, 15)
    assert Policy.size_rate(rule, 20.0, 1.0, 1.0) == (10.0, 10)
    # a bigger share cuts deeper
    assert Policy.size_rate(rule, 20.0, 0.9, 1.0)[0] < Policy.size_rate(rule, 20.0, 0.3, 1.0)[0]
    # never under the floor, burst at least 1
    assert Policy.size_rate(rule, 0.5, 1.0, 2.0) == (2.0, 2)
    assert Policy.size_rate(rule, 0.0, 1.0, 0.0)[1] == 1


BAD = [
    ("version: 2\ncauses: {}\n", "version", "2"),
    ("version: 1\ncauses: {hog: notify}\n", "causes.hog", "not a cause kind"),
    (
        "version: 1\ncauses: {cotenant: {action: throttle_it}}\n",
        "causes.cotenant.action",
        "throttle_it",
    ),
    (
        "version: 1\ncauses: {cotenant: {action: rate_limit, share_gain: 3}}\n",
        "causes.cotenant.share_gain",
        "must be <= 1",
    ),
    (
        "version: 1\ncauses: {cotenant: {action: rate_limit, share_gain: fast}}\n",
        "causes.cotenant.share_gain",
        "expected a number",
    ),
    ("version: 1\ncauses: {cpu: {action: priority}}\n", "causes.cpu.priority", "needs a priority"),
    (
        "version: 1\ncauses: {cpu: {action: notify, priority: 3}}\n",
        "causes.cpu.priority",
        "only for action priority",
    ),
    (
        "version: 1\ncauses: {throttle: {action: rate_limit}}\n",
        "causes.throttle.action",
        "no model to rate-limit",
    ),
    (
        "version: 1\ncauses: {cotenant: {action: rate_limit, targett: victim}}\n",
        "causes.cotenant.targett",
        "unknown key",
    ),
    (
        "version: 1\ncauses: {cotenant: {action: rate_limit, target: bystander}}\n",
        "causes.cotenant.target",
        "bystander",
    ),
    ("version: 1\ndefaults: {min_share: -1}\n", "defaults.min_share", "must be >= 0"),
    ("version: 1\nverify: {baseline_margin: x}\n", "verify.baseline_margin", "expected a number"),
    ("- a list\n", "(top level)", "expected a mapping"),
    ("version: 1\ncauses: [1, 2\n", "not valid YAML", ""),
]


@pytest.mark.parametrize(("text", "where", "what"), BAD)
def test_bad_policies_name_file_path_and_value(
    tmp_path: Path, text: str, where: str, what: str
) -> None:
    f = tmp_path / "policy.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_policy(f)
    msg = str(e.value)
    assert str(f) in msg and where in msg and what in msg


def test_missing_policy_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_policy(tmp_path / "nope.yaml")


def test_max_wait_only_for_rate_limits(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text("version: 1\ncauses: {cotenant: {action: rate_limit, max_wait_s: 0.5}}\n")
    assert load_policy(f).rule("cotenant").max_wait_s == 0.5
    f.write_text("version: 1\ncauses: {cpu: {action: priority, priority: 1, max_wait_s: 1}}\n")
    with pytest.raises(ConfigError, match=r"causes\.cpu\.max_wait_s.*only for action rate_limit"):
        load_policy(f)
