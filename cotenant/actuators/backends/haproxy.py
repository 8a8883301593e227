"""Backend for HAProxy's runtime API: the stats socket of a running HAProxy (``stats socket
/run/haproxy/admin.sock level admin``, or ``stats socket ipv4@127.0.0.1:9999 level admin``).

A target model is an HAProxy ``backend`` (the same name, or the one ``[actuators]
haproxy_backends`` maps it to) and its replicas are that backend's ``server`` lines.

* ``reroute``: ``weights`` -> ``set server <backend>/<server> weight <0..256>``; ``states`` ->
  ``set server <backend>/<server> state ready|drain|maint`` (drain: no new connections, the
  ones in progress finish; maint: none at all).
* ``max_in_flight`` (reservation-like: cap one model's share of a replica so the rest stays
  for others) -> ``set maxconn server <backend>/<server> <n>`` (0: no limit).
* ``current``: ``show servers state <backend>`` (each server's user weight and admin state)
  and ``show stat <backend> 4 -1`` (its ``slim``: maxconn) ->
  ``{"backend", "weights": {server: int}, "states": {server: state},
  "max_in_flight": {server: int}}``.
* ``revert`` sets back every weight, state and maxconn that differs from what ``current`` read
  before the change.

HAProxy has no rate limit, priority or per-priority reservation lever reachable at run time:
those changes are refused. Every change is checked against the backend's servers first (names,
ranges), then sent one command per connection; when HAProxy refuses a command (its answer is
not empty), the commands already applied are undone and :class:`BackendError` names the
command and HAProxy's answer, so a change is never left half-applied. Names are checked
against HAProxy's own alphabet before they go into a command line.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from cotenant.actuators.backend import Change
from cotenant.core.errors import BackendError

NAME_RE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
"""HAProxy's proxy and server names: letters, digits, ``-``, ``_``, ``.`` and ``:``."""
STATES = ("ready", "drain", "maint")
MAX_WEIGHT = 256
# srv_admin_state bits (HAProxy's SRV_ADMF_*): forced/inherited/config/resolver/hostname
# maintenance, forced/inherited drain
_MAINT = 0x01 | 0x02 | 0x04 | 0x20 | 0x40
_DRAIN = 0x08 | 0x10


class RuntimeApi(Protocol):
    """Sends one command line to HAProxy's runtime API and returns its whole answer.
    Raises :class:`BackendError` when HAProxy cannot be reached or does not answer."""

    def command(self, line: str) -> str: ...


class SocketRuntimeApi:
    """The runtime API over its socket: ``unix:///path``, a plain ``/path``, or
    ``tcp://host:port``. One connection per command (HAProxy's non-interactive mode: it
    answers, then closes). Connecting is retried ``retries`` times (backoff ``backoff_s`` x
    2^n); a command already sent is never resent."""

    def __init__(
        self,
        address: str,
        *,
        timeout_s: float = 5.0,
        retries: int = 3,
        backoff_s: float = 0.2,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.address = address
        self._addr: str | tuple[str, int]
        if address.startswith(("unix://", "/")):
            self._family, self._addr = socket.AF_UNIX, address.removeprefix("unix://")
        elif address.startswith("tcp://"):
            host, sep, port = address[len("tcp://") :].rstrip("/").rpartition(":")
            if not sep or not host or not port.isdigit():
                raise BackendError(f"haproxy backend: address {address!r}: give tcp://HOST:PORT")
            host = host.strip("[]")
            self._family = socket.AF_INET6 if ":" in host else socket.AF_INET
            self._addr = (host, int(port))
        else:
            raise BackendError(
                f"haproxy backend: address {address!r}: give the stats socket as "
                "unix:///path/to/admin.sock or tcp://HOST:PORT"
            )
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self._sleep = sleep

    def command(self, line: str) -> str:
        if "\n" in line or ";" in line:
            raise BackendError(f"haproxy backend: refusing to send {line!r} (one command only)")
        where = f"haproxy backend {self.address}: {line!r}"
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                self._sleep(self.backoff_s * 2 ** (attempt - 1))
            sock = socket.socket(self._family, socket.SOCK_STREAM)
            sock.settimeout(self.timeout_s)
            try:
                try:
                    sock.connect(self._addr)
                except OSError as exc:
                    last = f"cannot connect ({exc.strerror or exc})"
                    continue
                try:
                    sock.sendall(line.encode() + b"\n")
                    chunks = []
                    while chunk := sock.recv(65536):
                        chunks.append(chunk)
                except TimeoutError:
                    raise BackendError(f"{where}: no answer within {self.timeout_s:g} s") from None
                except OSError as exc:
                    raise BackendError(f"{where}: {exc.strerror or exc}") from None
                return b"".join(chunks).decode("utf-8", "replace")
            finally:
                sock.close()
        raise BackendError(f"{where}: {last} ({self.retries + 1} tries)")


def _check_name(name: str, what: str) -> str:
    if not NAME_RE.fullmatch(name):
        hint = "; map the model with [actuators] haproxy_backends" if what == "backend" else ""
        raise BackendError(
            f"haproxy backend: {what} {name!r} is not an HAProxy name (letters, digits, "
            f"'-', '_', '.', ':'){hint}"
        )
    return name


class HaproxyBackend:
    """See the module docstring. ``backends``: model -> HAProxy backend name."""

    name = "haproxy"

    def __init__(self, api: RuntimeApi, backends: Mapping[str, str] | None = None) -> None:
        self._api = api
        self._backends = dict(backends or {})

    def backend_of(self, target: str) -> str:
        return _check_name(self._backends.get(target, target), "backend")

    # -- reading ----------------------------------------------------------------------------

    def current(self, target: str) -> dict[str, Any]:
        return self._read(self.backend_of(target))

    def _read(self, backend: str) -> dict[str, Any]:
        weights: dict[str, int] = {}
        states: dict[str, str] = {}
        for row in self._servers_state(backend):
            name = row["srv_name"]
            weights[name] = int(row["srv_uweight"])
            admin = int(row["srv_admin_state"])
            states[name] = "maint" if admin & _MAINT else "drain" if admin & _DRAIN else "ready"
        limits = self._maxconn(backend)
        return {
            "backend": backend,
            "weights": weights,
            "states": states,
            "max_in_flight": {s: limits.get(s, 0) for s in weights},
        }

    def _servers_state(self, backend: str) -> list[dict[str, str]]:
        answer = self._api.command(f"show servers state {backend}")
        lines = [ln for ln in answer.splitlines() if ln.strip()]
        header = next((ln for ln in lines if ln.startswith("# ")), None)
        if header is None:
            msg = lines[0] if lines else "empty answer"
            raise BackendError(f"haproxy backend: show servers state {backend}: {msg}")
        cols = header[2:].split()
        rows = [
            dict(zip(cols, ln.split(), strict=False)) for ln in lines[lines.index(header) + 1 :]
        ]
        if not rows:
            raise BackendError(f"haproxy backend: backend {backend!r} has no servers")
        return rows

    def _maxconn(self, backend: str) -> dict[str, int]:
        answer = self._api.command(f"show stat {backend} 4 -1")
        lines = [ln for ln in answer.splitlines() if ln.strip()]
        if not lines or not lines[0].startswith("# "):
            msg = lines[0] if lines else "empty answer"
            raise BackendError(f"haproxy backend: show stat {backend}: {msg}")
        cols = lines[0][2:].split(",")
        out: dict[str, int] = {}
        for ln in lines[1:]:
            row = dict(zip(cols, ln.split(","), strict=False))
            if row.get("pxname") == backend and row.get("svname"):
                slim = row.get("slim", "")
                out[row["svname"]] = int(slim) if slim.isdigit() else 0
        return out

    # -- changing ---------------------------------------------------------------------------

    def apply(self, change: Change) -> dict[str, Any]:
        if change.kind not in ("reroute", "max_in_flight"):
            raise BackendError(
                f"haproxy backend: cannot apply a {change.kind!r} change (HAProxy's runtime API "
                "has weights, server states and maxconn: use reroute or max_in_flight)"
            )
        before = self.current(change.target)
        backend = before["backend"]
        servers = before["weights"]
        p = change.params
        cmds: list[str] = []
        if change.kind == "reroute":
            weights = p.get("weights") or {}
            states = p.get("states") or {}
            if not isinstance(weights, dict) or not isinstance(states, dict):
                raise BackendError("haproxy backend: reroute 'weights' and 'states' are objects")
            if not weights and not states:
                raise BackendError("haproxy backend: a reroute names no weights and no states")
            for server, w in weights.items():
                self._known(backend, servers, server)
                if isinstance(w, bool) or not isinstance(w, int) or not 0 <= w <= MAX_WEIGHT:
                    raise BackendError(
                        f"haproxy backend: weight of {backend}/{server} must be an integer "
                        f"0..{MAX_WEIGHT}, not {w!r}"
                    )
                cmds.append(f"set server {backend}/{server} weight {w}")
            for server, st in states.items():
                self._known(backend, servers, server)
                if st not in STATES:
                    raise BackendError(
                        f"haproxy backend: state of {backend}/{server} must be one of "
                        f"{', '.join(STATES)}, not {st!r}"
                    )
                cmds.append(f"set server {backend}/{server} state {st}")
        else:
            limits = p.get("max_in_flight") or {}
            if not isinstance(limits, dict) or not limits:
                raise BackendError("haproxy backend: max_in_flight must name servers: {server: n}")
            for server, n in limits.items():
                self._known(backend, servers, server)
                if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 1_000_000:
                    raise BackendError(
                        f"haproxy backend: max_in_flight of {backend}/{server} must be an "
                        f"integer 0..1000000 (0: no limit), not {n!r}"
                    )
                cmds.append(f"set maxconn server {backend}/{server} {n}")
        self._run(cmds, before)
        return self.current(change.target)

    def revert(self, target: str, before: dict[str, Any]) -> dict[str, Any]:
        now = self.current(target)
        self._run(self._restoring(now, before), now)
        return self.current(target)

    @staticmethod
    def _known(backend: str, servers: Mapping[str, int], server: str) -> None:
        if server not in servers:
            raise BackendError(
                f"haproxy backend: backend {backend!r} has no server {server!r} "
                f"(servers: {', '.join(servers)})"
            )

    @staticmethod
    def _restoring(now: dict[str, Any], before: dict[str, Any]) -> list[str]:
        """The commands that bring ``now`` back to ``before`` (servers in both only)."""
        backend = now["backend"]
        cmds = []
        for key, verb in (("weights", "weight"), ("states", "state")):
            for server, value in (before.get(key) or {}).items():
                if server in now[key] and now[key][server] != value:
                    _check_name(server, "server")
                    if verb == "state" and value not in STATES:
                        raise BackendError(f"haproxy backend: cannot restore state {value!r}")
                    arg = value if verb == "state" else int(value)
                    cmds.append(f"set server {backend}/{server} {verb} {arg}")
        for server, value in (before.get("max_in_flight") or {}).items():
            if server in now["max_in_flight"] and now["max_in_flight"][server] != value:
                _check_name(server, "server")
                cmds.append(f"set maxconn server {backend}/{server} {int(value)}")
        return cmds

    def _run(self, cmds: list[str], before: dict[str, Any]) -> None:
        """Send ``cmds`` in order; on a refusal, undo the ones sent (back to ``before``)."""
        for i, cmd in enumerate(cmds):
            try:
                answer = self._api.command(cmd).strip()
            except BackendError:
                if i:
                    self._undo(before)
                raise
            if answer:
                if i:
                    self._undo(before)
                raise BackendError(f"haproxy backend: {cmd!r} refused: {answer}")

    def _undo(self, before: dict[str, Any]) -> None:
        try:
            now = self._read(before["backend"])
            for cmd in self._restoring(now, before):
                self._api.command(cmd)
        except BackendError:
            pass  # the original error is what the caller must see
