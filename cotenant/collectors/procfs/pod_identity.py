"""Who a process is on Kubernetes: ``namespace/pod (container)`` from its cgroup and the kubelet.

:func:`parse_cgroup` reads the text of ``/proc/<pid>/cgroup`` into a :class:`ContainerRef`
(container id, pod UID). Layouts understood, cgroup v2 (one ``0::<path>`` line) and v1 (one
line per hierarchy, ``12:memory:<path>``; the first line naming a container wins) alike:

- systemd driver: ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/
  cri-containerd-<id>.scope`` (the UID's dashes written as underscores; ``crio-<id>.scope``,
  ``docker-<id>.scope`` for CRI-O and dockershim);
- cgroupfs driver: ``/kubepods/burstable/pod<uid>/<id>`` (Guaranteed pods sit directly under
  ``/kubepods``);
- read from a container with a cgroup namespace of its own (the agent's, on v2): the same
  paths relative to the reader's cgroup, ``/../../kubepods-burstable-pod<uid>.slice/...``;
- outside Kubernetes: ``/docker/<id>`` or ``/system.slice/docker-<id>.scope`` give a container
  without a pod; ``/system.slice/foo.service``, ``/user.slice/...`` and anything else give None.

Container ids are 64 hex digits. A :class:`PodDirectory` maps (pod UID, container id) to names:
:class:`KubeletPods` reads the kubelet's pod list (``/pods`` of its API, or a JSON file of the
same shape), :class:`StaticPods` holds a fixed list (tests, and callers that already know).
:class:`PodIdentity` joins the two for a pid: :meth:`PodIdentity.name_of` gives
``namespace/pod (container)``, ``namespace/pod`` where the pod is known but not the container
(a container not yet in the kubelet's status), or None (not in a pod, the pod unknown, the
cgroup unreadable); :meth:`PodIdentity.lookup` also says whether that answer is final, so
callers that cache names per process ask again for one whose pod is not listed yet, and gives
its :class:`PodRef` (the pod UID from the cgroup and the names), the key that
:meth:`collectors.gpu_resolve.GpuResolver.model_of_pod` joins with the ``k8s.*`` attributes of
span resources (:func:`pod_ref_of_resource`). It never raises: a directory that fails is
logged once, counted in :attr:`PodIdentity.errors` and its previous answer kept. The
directory is read again at most every ``refresh_s`` when a pod is not in it (a pod started
since), so a poll thread blocks on the kubelet (up to its ``timeout_s``) at most that often.

Thread-safe: the NVML and procfs pollers share one instance.
"""

from __future__ import annotations

import json
import logging
import re
import ssl
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http.client import HTTPException
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from cotenant.core.errors import SourceError

log = logging.getLogger(__name__)

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")

# a pod's cgroup: "pod<uid>" (cgroupfs) or "kubepods[-<qos>]-pod<uid_with_underscores>.slice"
_POD = re.compile(r"^(?:kubepods(?:-[a-z]+)?-)?pod([0-9a-fA-F][0-9a-fA-F_-]{15,63})(?:\.slice)?$")
# a container's: "<64hex>" (cgroupfs, docker) or "<runtime>-<64hex>.scope" (systemd)
_CONTAINER = re.compile(
    r"^(?:(?:cri-containerd|crio|docker|cri-dockerd|libpod)-)?([0-9a-f]{64})(?:\.scope)?$"
)


@dataclass(frozen=True)
class ContainerRef:
    """Where a process runs: a container id (64 hex digits), and its pod's UID (with dashes)
    when Kubernetes started it, else None."""

    container_id: str
    pod_uid: str | None


@dataclass(frozen=True)
class PodName:
    """A container's names; ``container`` is None where only the pod is known."""

    namespace: str
    pod: str
    container: str | None = None

    def __str__(self) -> str:
        base = f"{self.namespace}/{self.pod}"
        return base if self.container is None else f"{base} ({self.container})"


def _parse_path(path: str) -> ContainerRef | None:
    pod: str | None = None
    container: str | None = None
    for part in path.split("/"):
        if m := _POD.match(part):
            pod = m.group(1).replace("_", "-").lower()
        elif m := _CONTAINER.match(part):
            container = m.group(1)
    return None if container is None else ContainerRef(container, pod)


def parse_cgroup(text: str) -> ContainerRef | None:
    """The container (and pod) of the process whose ``/proc/<pid>/cgroup`` is ``text``; None
    where no line names a container (a host process, a systemd service, garbage)."""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and (ref := _parse_path(parts[2])) is not None:
            return ref
    return None


K8S_NAMESPACE = "k8s.namespace.name"
K8S_POD = "k8s.pod.name"
K8S_CONTAINER = "k8s.container.name"
K8S_POD_UID = "k8s.pod.uid"


class PodRef(NamedTuple):
    """Who a process, or the sender of a span, is on Kubernetes, as far as known: the pod's
    UID (lower case) and its names; at least one of the two is set."""

    uid: str | None
    name: PodName | None

    def container_keys(self) -> tuple[tuple[str, ...], ...]:
        """Keys naming its container: (namespace, pod, container) and (UID, container)."""
        n = self.name
        if n is None or n.container is None:
            return ()
        by_name = ("c", n.namespace, n.pod, n.container)
        return (by_name,) if self.uid is None else (by_name, ("uc", self.uid, n.container))

    def pod_keys(self) -> tuple[tuple[str, ...], ...]:
        """Keys naming its pod: (namespace, pod) and the UID."""
        keys: tuple[tuple[str, ...], ...] = ()
        if self.name is not None:
            keys = (("p", self.name.namespace, self.name.pod),)
        return keys if self.uid is None else (*keys, ("u", self.uid))


def pod_ref_of_resource(resource: Mapping[str, Any]) -> PodRef | None:
    """The pod a span's resource names in OpenTelemetry's ``k8s.*`` attributes
    (``k8s.namespace.name`` with ``k8s.pod.name``, ``k8s.container.name``, ``k8s.pod.uid``: what
    the Collector's k8sattributes processor or ``OTEL_RESOURCE_ATTRIBUTES`` set); None when it
    names neither a namespaced pod nor a UID. Non-string values are ignored."""
    uid = resource.get(K8S_POD_UID)
    ns, pod = resource.get(K8S_NAMESPACE), resource.get(K8S_POD)
    uid = uid.lower() if isinstance(uid, str) and uid else None
    name = None
    if isinstance(ns, str) and isinstance(pod, str) and ns and pod:
        c = resource.get(K8S_CONTAINER)
        name = PodName(ns, pod, c if isinstance(c, str) and c else None)
    return None if uid is None and name is None else PodRef(uid, name)


class PodLookup(NamedTuple):
    """What :meth:`PodIdentity.lookup` found: the name (None: name it by program), whether
    it is final for the process (False: its pod or container is not listed yet), and its
    pod (None: not in a pod, or unreadable)."""

    name: str | None
    final: bool
    ref: PodRef | None = None


class PodDirectory(Protocol):
    """The pods on this node: what :class:`PodIdentity` names processes from."""

    def containers(self) -> Mapping[tuple[str, str], PodName]:
        """(pod UID, container id) -> names of every container of every pod; each pod also
        under (pod UID, ``""``) with ``container`` None. Raises SourceError when the list
        cannot be read or is not a pod list."""
        ...


def pods_from_json(doc: Any) -> dict[tuple[str, str], PodName]:
    """:meth:`PodDirectory.containers` of a pod list (``{"items": [pod, ...]}``, as the
    kubelet's ``/pods`` and ``kubectl get pods -o json`` give): ``metadata.{uid, namespace,
    name}`` and ``status.containerStatuses[].{name, containerID}`` (``containerd://<id>``;
    init and ephemeral containers too). Pods or containers missing a field are skipped.
    Raises SourceError when ``doc`` has no ``items`` list."""
    items = doc.get("items") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise SourceError("not a pod list: no 'items' array")
    out: dict[tuple[str, str], PodName] = {}
    for pod in items:
        meta = pod.get("metadata") if isinstance(pod, dict) else None
        if not isinstance(meta, dict):
            continue
        uid, ns, name = meta.get("uid"), meta.get("namespace"), meta.get("name")
        if not (isinstance(uid, str) and isinstance(ns, str) and isinstance(name, str)):
            continue
        uid = uid.lower()
        out[(uid, "")] = PodName(ns, name)
        status = pod.get("status")
        if not isinstance(status, dict):
            continue
        for field in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
            for c in status.get(field) or ():
                cid = c.get("containerID") if isinstance(c, dict) else None
                if isinstance(cid, str) and isinstance(c.get("name"), str):
                    out[(uid, cid.rpartition("://")[2])] = PodName(ns, name, c["name"])
    return out


class StaticPods:
    """A :class:`PodDirectory` of a fixed list: ``(pod uid, namespace, pod, [(container,
    container id), ...])`` per pod. The test double of :class:`KubeletPods`."""

    def __init__(self, pods: Iterable[tuple[str, str, str, Iterable[tuple[str, str]]]]) -> None:
        self._map: dict[tuple[str, str], PodName] = {}
        for uid, ns, pod, containers in pods:
            self._map[(uid, "")] = PodName(ns, pod)
            for name, cid in containers:
                self._map[(uid, cid)] = PodName(ns, pod, name)
        self.reads = 0

    def containers(self) -> Mapping[tuple[str, str], PodName]:
        self.reads += 1
        return dict(self._map)


class KubeletPods:
    """A :class:`PodDirectory` reading the kubelet's pod list from ``source``: an ``http://``
    or ``https://`` URL (the read-only port ``http://<node>:10255/pods``, or the
    authenticated ``https://<node>:10250/pods``, for which the service account's token is sent
    and its ``ca.crt`` trusted when ``service_account`` holds them) or a file path."""

    def __init__(
        self, source: str, *, timeout_s: float = 2.0, service_account: Path = SERVICE_ACCOUNT
    ) -> None:
        self.source = source
        self.timeout_s = timeout_s
        self._sa = service_account

    def containers(self) -> Mapping[tuple[str, str], PodName]:
        try:
            raw = self._fetch()
            doc = json.loads(raw)
        except (OSError, ValueError, HTTPException) as exc:  # URLError, JSONDecodeError too
            raise SourceError(f"cannot read the kubelet's pod list {self.source}: {exc}") from exc
        try:
            return pods_from_json(doc)
        except SourceError as exc:
            raise SourceError(f"{self.source}: {exc}") from exc

    def _fetch(self) -> bytes:
        if not self.source.startswith(("http://", "https://")):
            return Path(self.source).read_bytes()
        req = urllib.request.Request(self.source, headers={"Accept": "application/json"})
        ctx = None
        if self.source.startswith("https://"):
            token, ca = self._sa / "token", self._sa / "ca.crt"
            if token.is_file():
                req.add_header("Authorization", f"Bearer {token.read_text().strip()}")
            ctx = ssl.create_default_context(cafile=str(ca) if ca.is_file() else None)
        with urllib.request.urlopen(req, timeout=self.timeout_s, context=ctx) as resp:
            body: bytes = resp.read()
            return body


class PodIdentity:
    """Names pids as pods; see the module docstring. ``proc``: the procfs root whose
    ``<pid>/cgroup`` is read (the host's, so that pids are the host's, as NVML reports them).
    """

    def __init__(
        self,
        directory: PodDirectory,
        *,
        proc: str | Path = "/proc",
        refresh_s: float = 10.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._dir = directory
        self._proc = str(proc)
        self.refresh_s = refresh_s
        self._monotonic = monotonic
        self._pods: Mapping[tuple[str, str], PodName] = {}
        self._read_at: float | None = None
        self._lock = threading.Lock()
        self._logged = False
        self.errors = 0

    def name_of(self, pid: int) -> str | None:
        """``namespace/pod (container)`` of ``pid``, ``namespace/pod`` where the container is
        not known, None where the process is not in a known pod. Never raises."""
        return self.lookup(pid).name

    def lookup(self, pid: int) -> PodLookup:
        """:meth:`name_of` of ``pid``, and whether that answer is final for the process:
        False while it is in a pod whose container the directory does not list (yet), so
        that a caller caching names asks again. Never raises."""
        try:
            with open(f"{self._proc}/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
                ref = parse_cgroup(f.read())
        except OSError:
            return PodLookup(None, True)  # exited, or not readable
        if ref is None or ref.pod_uid is None:
            return PodLookup(None, True)
        uid = ref.pod_uid
        key = (uid, ref.container_id)
        with self._lock:
            if key not in self._pods:
                self._refresh()
            name = self._pods.get(key)
            if name is not None:
                return PodLookup(str(name), True, PodRef(uid, name))
            pod = self._pods.get((uid, ""))
        return PodLookup(None if pod is None else str(pod), False, PodRef(uid, pod))

    def _refresh(self) -> None:
        now = self._monotonic()
        if self._read_at is not None and now - self._read_at < self.refresh_s:
            return
        self._read_at = now
        try:
            self._pods = self._dir.containers()
        except Exception as exc:  # naming is a nicety: a failing kubelet never stops a poll
            self.errors += 1
            if not self._logged:
                self._logged = True
                log.warning("processes named by program, not pod: %s", exc)
