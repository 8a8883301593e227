"""The HAProxy backend against a real HAProxy (Debian's ``haproxy``) started here: a temp
config on loopback ports, a unix stats socket at ``level admin``, two stand-in replicas that
answer with their name. What it changes is read back from HAProxy (``show servers state``,
``show stat``) and seen in where HAProxy sends requests."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from act_helpers import free_socket

from cotenant.actuators.backend import Change
from cotenant.actuators.backends.haproxy import HaproxyBackend, SocketRuntimeApi
from cotenant.core.errors import BackendError
from tests.gateway.replicas import ReplicaServers

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
pytestmark = pytest.mark.skipif(
    not Path(HAPROXY).exists(),
    reason="HAProxy is not installed (`make system-deps` installs Debian's `haproxy` package)",
)

CONFIG = """
global
    stats socket {sock} mode 600 level admin
    maxconn 512
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
    timeout queue 30s
frontend fe
    bind 127.0.0.1:{port}
    use_backend static if {{ path_beg /static }}
    default_backend llama
backend llama
    balance roundrobin
    server r0 {r0} weight 1
    server r1 {r1} weight 1
backend static
    balance static-rr
    server s0 {r0} weight 1
    server s1 {r1} weight 1
"""


@dataclass
class Haproxy:
    url: str
    sock: Path
    replicas: ReplicaServers

    def backend(self, **kw: Any) -> HaproxyBackend:
        api = SocketRuntimeApi(f"unix://{self.sock}", retries=0, timeout_s=5)
        return HaproxyBackend(api, **kw)

    def served(self, n: int, path: str = "/v1/completions") -> Counter[str]:
        with httpx.Client(base_url=self.url, timeout=10) as c:
            return Counter(c.post(path, json={}).json()["replica"] for _ in range(n))


def _addr(url: str) -> str:
    return url.removeprefix("http://")


@pytest.fixture
def haproxy(tmp_path: Path) -> Iterator[Haproxy]:
    replicas = ReplicaServers()
    r0, r1 = replicas.add("r0"), replicas.add("r1")
    sock = tmp_path / "admin.sock"
    s = free_socket()
    port = s.getsockname()[1]
    s.close()
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(CONFIG.format(sock=sock, port=port, r0=_addr(r0), r1=_addr(r1)))
    log = (tmp_path / "haproxy.log").open("wb")
    proc = subprocess.Popen([HAPROXY, "-f", str(cfg), "-db"], stdout=log, stderr=log)
    api = SocketRuntimeApi(f"unix://{sock}", retries=0, timeout_s=2)
    deadline = time.monotonic() + 20
    while True:  # ready once the runtime API answers and the frontend accepts
        if proc.poll() is not None:
            raise RuntimeError(f"haproxy exited: {(tmp_path / 'haproxy.log').read_text()}")
        try:
            if "Name: HAProxy" in api.command("show info"):
                httpx.get(f"http://127.0.0.1:{port}/", timeout=2)
                break
        except (BackendError, httpx.HTTPError):
            if time.monotonic() > deadline:
                raise
        time.sleep(0.02)
    try:
        yield Haproxy(f"http://127.0.0.1:{port}", sock, replicas)
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()
        replicas.close()


def test_reroute_sets_weights_that_haproxy_reports_and_follows(haproxy: Haproxy) -> None:
    be = haproxy.backend()
    before = be.current("llama")
    assert before == {
        "backend": "llama",
        "weights": {"r0": 1, "r1": 1},
        "states": {"r0": "ready", "r1": "ready"},
        "max_in_flight": {"r0": 0, "r1": 0},
    }
    assert haproxy.served(8) == {"r0": 4, "r1": 4}
    after = be.apply(Change("reroute", "llama", {"weights": {"r0": 1, "r1": 3}}))
    assert after["weights"] == {"r0": 1, "r1": 3}  # as `show servers state` reads it back
    got = haproxy.served(40)
    assert got["r1"] == 30 and got["r0"] == 10
    be.apply(Change("reroute", "llama", {"weights": {"r0": 0}}))
    assert haproxy.served(10) == {"r1": 10}
    assert be.revert("llama", before) == before
    assert haproxy.served(8) == {"r0": 4, "r1": 4}


@pytest.mark.parametrize("state", ["drain", "maint"])
def test_server_states_take_a_replica_out_and_back(haproxy: Haproxy, state: str) -> None:
    be = haproxy.backend()
    before = be.current("llama")
    after = be.apply(Change("reroute", "llama", {"states": {"r0": state}}))
    assert after["states"] == {"r0": state, "r1": "ready"}
    assert after["weights"] == before["weights"]  # the configured weight is kept
    assert haproxy.served(6) == {"r1": 6}
    assert be.revert("llama", before)["states"] == {"r0": "ready", "r1": "ready"}
    assert haproxy.served(6) == {"r0": 3, "r1": 3}


def test_max_in_flight_caps_a_replica_with_maxconn(haproxy: Haproxy) -> None:
    be = haproxy.backend()
    before = be.current("llama")
    be.apply(Change("reroute", "llama", {"states": {"r0": "maint"}}))
    after = be.apply(Change("max_in_flight", "llama", {"max_in_flight": {"r1": 2}}))
    assert after["max_in_flight"] == {"r0": 0, "r1": 2}  # `show stat`'s slim
    codes: list[int] = []

    def one() -> None:
        codes.append(httpx.post(f"{haproxy.url}/v1/hold", json={}, timeout=30).status_code)

    threads = [threading.Thread(target=one) for _ in range(5)]
    for t in threads:
        t.start()
    api = SocketRuntimeApi(f"unix://{haproxy.sock}", retries=0)

    def stat() -> dict[str, dict[str, str]]:
        header, *rows = [ln for ln in api.command("show stat llama 6 -1").splitlines() if ln]
        cols = header[2:].split(",")
        return {r.split(",")[1]: dict(zip(cols, r.split(","), strict=False)) for r in rows}

    deadline = time.monotonic() + 10
    while int(stat()["BACKEND"]["qcur"]) < 3:  # the others wait in HAProxy's queue
        assert time.monotonic() < deadline, f"never 3 queued: {stat()['BACKEND']['qcur']}"
        time.sleep(0.01)
    assert int(stat()["r1"]["scur"]) == 2 and haproxy.replicas.in_flight("r1") == 2
    haproxy.replicas.release()
    for t in threads:
        t.join(20)
    assert codes == [200] * 5
    restored = be.revert("llama", before)
    assert restored == before


def test_a_refused_command_leaves_nothing_half_applied(haproxy: Haproxy) -> None:
    """static-rr takes a weight of 0 (0 %) but no other change: the first command succeeds,
    the second is refused, and the first is undone."""
    be = haproxy.backend()
    before = be.current("static")
    with pytest.raises(BackendError, match=r"'set server static/s1 weight 5' refused: Backend"):
        be.apply(Change("reroute", "static", {"weights": {"s0": 0, "s1": 5}}))
    assert be.current("static") == before


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (Change("reroute", "llama", {"weights": {"r9": 1}}), "backend 'llama' has no server 'r9'"),
        (Change("reroute", "llama", {"weights": {"r0": 300}}), "must be an integer 0..256"),
        (Change("reroute", "llama", {"weights": {"r0": True}}), "must be an integer 0..256"),
        (Change("reroute", "llama", {"states": {"r0": "off"}}), "ready, drain, maint, not 'off'"),
        (Change("reroute", "llama", {}), "names no weights and no states"),
        (Change("max_in_flight", "llama", {"max_in_flight": {"r0": -1}}), "0..1000000"),
        (Change("priority", "llama", {"priority": 1}), "cannot apply a 'priority' change"),
        (Change("reserve", "r0", {"slots": 1, "priority": 0}), "cannot apply a 'reserve'"),
        (Change("reroute", "nope", {"weights": {"r0": 1}}), "show servers state nope: Can't"),
        (Change("reroute", "meta/llama x", {"weights": {}}), "map the model with [actuators]"),
    ],
)
def test_bad_changes_are_refused_and_change_nothing(
    haproxy: Haproxy, change: Change, needle: str
) -> None:
    be = haproxy.backend()
    before = be.current("llama")
    with pytest.raises(BackendError) as err:
        be.apply(change)
    assert needle in str(err.value)
    assert be.current("llama") == before


def test_models_map_to_backends(haproxy: Haproxy) -> None:
    be = haproxy.backend(backends={"meta-llama/Llama-3.1-8B": "llama"})
    after = be.apply(Change("reroute", "meta-llama/Llama-3.1-8B", {"weights": {"r1": 0}}))
    assert after["backend"] == "llama" and after["weights"] == {"r0": 1, "r1": 0}
    assert haproxy.served(4) == {"r0": 4}


def test_a_down_haproxy_is_a_backend_error(tmp_path: Path) -> None:
    api = SocketRuntimeApi(f"unix://{tmp_path}/missing.sock", retries=1, backoff_s=0.01)
    with pytest.raises(BackendError, match=r"missing.sock: 'show servers state llama': cannot"):
        HaproxyBackend(api).current("llama")
    with pytest.raises(BackendError, match="give the stats socket as unix://"):
        SocketRuntimeApi("http://127.0.0.1:9999")


def test_make_backend_builds_the_haproxy_backend(haproxy: Haproxy) -> None:
    from cotenant.actuators.backends.factory import make_backend
    from cotenant.app.config import load_config
    from cotenant.core.errors import ConfigError

    env = {
        "COTENANT_ACTUATORS_BACKEND": "haproxy",
        "COTENANT_ACTUATORS_BACKEND_URL": f"unix://{haproxy.sock}",
        "COTENANT_ACTUATORS_HAPROXY_BACKENDS": "chat=llama",
    }
    be = make_backend(load_config(env=env).actuators, env={})
    assert isinstance(be, HaproxyBackend) and be.current("chat")["backend"] == "llama"
    env["COTENANT_ACTUATORS_BACKEND_URL"] = "tcp://nohost"
    with pytest.raises(ConfigError, match=r"actuators.backend_url.*tcp://HOST:PORT"):
        make_backend(load_config(env=env).actuators, env={})
