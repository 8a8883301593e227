"""Benchmark: the gateway's added latency and its throughput on one core, beside nginx.

Ways to reach the same upstream, measured in turn in every repeat of one run:

* **direct** — the load generator talks to the upstream;
* **gateway** — through ``cotenant gateway`` (a real subprocess), pinned to one core;
* **gw+sdk** / **gw+builtin** — the same with every request traced (``--otlp-endpoint``)
  through the OTel SDK's batch exporter, or through the gateway's own pre-encoded OTLP
  exporter (``--otlp-exporter builtin``, the default);
* **gw ll x4** / **gw ll x4+spans** — the gateway in front of ``--replicas`` replicas (4) with
  ``--routing least-loaded``, untraced and traced (builtin);
* **gw builtin** / **gw ll x4 bltn** (``--compare-parsers``) — the two gateway paths above
  with ``--http-parser builtin`` (the gateway's own HTTP/1 parser) instead of llhttp;
* **nginx** / **nginx lc x4** — ``/usr/sbin/nginx`` (one worker, keep-alive upstream pool)
  pinned to the same core, as a reference proxy: one upstream, and the same replicas with
  ``least_conn``.

For each: latency (p50/p90/p99) at a fixed open-loop rate (``--rate``, default 1,000 rps) and
the maximum throughput of a closed loop of ``--conns`` keep-alive connections. The upstream is a
raw asyncio HTTP/1.1 responder (``--upstreams`` processes, each listening on the upstream port
and on every replica port with SO_REUSEPORT; it also answers the spans' OTLP POSTs), and the
load generator a raw asyncio keep-alive client; both run on the other core(s), so the proxy's
core does nothing else. Only the proxy being measured runs: the others are stopped (SIGSTOP).

::

    .venv/bin/python bench/gateway.py                      # ~5 minutes
    .venv/bin/python bench/gateway.py --duration 5 --repeats 3 --json out.json
    .venv/bin/python bench/gateway.py --only gateway,gw+builtin,gw+sdk   # a subset
    .venv/bin/python bench/gateway.py --only "gateway,gw ll x4,nginx,nginx lc x4" \
        --compare-parsers --no-spans                        # llhttp vs the builtin parser

Figures go to docs/performance.md ("Gateway").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NGINX = "/usr/sbin/nginx"
BODY = b'{"model":"llama-3-8b","prompt":"Say hello","max_tokens":16}'
REPLY = b'{"id":"cmpl-1","object":"text_completion","choices":[{"text":"hello"}]}'


# -- the upstream: a raw asyncio responder ------------------------------------------------


class _Responder(asyncio.Protocol):
    """Answers every request with a small JSON completion (keep-alive)."""

    reply = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        len(REPLY),
        REPLY,
    )

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.t = transport
        self.buf = bytearray()
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        out = []
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                break
            head = bytes(self.buf[:end]).lower()
            i = head.find(b"content-length:")
            n = int(head[i + 15 :].split(b"\r\n", 1)[0]) if i >= 0 else 0
            if len(self.buf) < end + 4 + n:
                break
            del self.buf[: end + 4 + n]
            out.append(self.reply)
        if out:
            self.t.write(b"".join(out))


def run_upstream(ports: list[int]) -> None:
    async def main() -> None:
        servers = []
        for port in ports:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(("127.0.0.1", port))
            loop = asyncio.get_running_loop()
            servers.append(await loop.create_server(_Responder, sock=sock, backlog=4096))
        await asyncio.gather(*(s.serve_forever() for s in servers))

    asyncio.run(main())


# -- the load generator: a raw asyncio keep-alive client ----------------------------------


class _Client(asyncio.Protocol):
    """One keep-alive connection sending one request at a time."""

    def __init__(self, request: bytes) -> None:
        self.request = request
        self.buf = bytearray()
        self.t0 = 0.0
        self.need = -1
        self.done: Callable[[_Client, float, int], None] | None = None
        self.status = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.t = transport

    def send(self, done: Callable[[_Client, float, int], None]) -> None:
        self.done = done
        self.t0 = time.perf_counter()
        self.t.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.need < 0:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end]).lower()
            self.status = int(head[9:12])
            i = head.find(b"content-length:")
            n = int(head[i + 15 :].split(b"\r\n", 1)[0]) if i >= 0 else 0
            del self.buf[: end + 4]
            self.need = n
        if len(self.buf) >= self.need:
            del self.buf[: self.need]
            self.need = -1
            cb, self.done = self.done, None
            if cb is not None:
                cb(self, time.perf_counter() - self.t0, self.status)

    def connection_lost(self, exc: Exception | None) -> None:
        cb, self.done = self.done, None
        if cb is not None:
            cb(self, time.perf_counter() - self.t0, 0)


def _request(port: int) -> bytes:
    return (
        b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1:%d\r\nuser-agent: bench\r\n"
        b"content-type: application/json\r\nx-tenant: acme\r\ncontent-length: %d\r\n\r\n%s"
        % (port, len(BODY), BODY)
    )


async def _connect(port: int, n: int) -> list[_Client]:
    loop = asyncio.get_running_loop()
    req = _request(port)
    conns = []
    for _ in range(n):
        _, c = await loop.create_connection(lambda: _Client(req), "127.0.0.1", port)
        conns.append(c)
    return conns


async def open_loop(port: int, rate: float, duration: float, conns: int) -> dict[str, float]:
    """Send ``rate`` requests/s for ``duration`` s, one per free connection; latencies in ms."""
    loop = asyncio.get_running_loop()
    idle = await _connect(port, conns)
    lat: list[float] = []
    errors = 0
    late = 0
    pending: list[int] = [0]
    finished = loop.create_future()
    total = int(rate * duration)

    def done(c: _Client, dt: float, status: int) -> None:
        nonlocal errors
        if status == 200:
            lat.append(dt)
        else:
            errors += 1
        idle.append(c)
        pending[0] -= 1
        if pending[0] == 0 and sent >= total and not finished.done():
            finished.set_result(None)

    sent = 0
    t_start = loop.time()
    interval = 1.0 / rate
    while sent < total:
        now = loop.time()
        due = min(total, int((now - t_start) / interval) + 1)
        while sent < due:
            if not idle:
                late += 1
                break
            pending[0] += 1
            sent += 1
            idle.pop().send(done)
        if sent < due:
            await asyncio.sleep(0.0002)
        else:
            await asyncio.sleep(max(0.0, t_start + sent * interval - loop.time()))
    if pending[0]:
        await asyncio.wait_for(finished, 30)
    for c in idle:
        c.t.close()
    lat.sort()
    ms = [x * 1000 for x in lat]
    return {
        "rate_rps": rate,
        "sent": sent,
        "errors": errors,
        "late_no_free_conn": late,
        "p50_ms": ms[len(ms) // 2],
        "p90_ms": ms[int(len(ms) * 0.9)],
        "p99_ms": ms[int(len(ms) * 0.99)],
        "max_ms": ms[-1],
    }


async def closed_loop(port: int, duration: float, conns: int) -> dict[str, float]:
    """Each of ``conns`` connections sends back to back for ``duration`` s."""
    loop = asyncio.get_running_loop()
    clients = await _connect(port, conns)
    count = 0
    errors = 0
    stop_at = loop.time() + duration
    finished = loop.create_future()
    live = [len(clients)]

    def done(c: _Client, dt: float, status: int) -> None:
        nonlocal count, errors
        if status == 200:
            count += 1
        else:
            errors += 1
        if loop.time() < stop_at and status:
            c.send(done)
        else:
            live[0] -= 1
            if live[0] == 0 and not finished.done():
                finished.set_result(None)

    t0 = loop.time()
    for c in clients:
        c.send(done)
    await asyncio.wait_for(finished, duration + 30)
    elapsed = loop.time() - t0
    for c in clients:
        c.t.close()
    return {
        "rps": count / elapsed,
        "count": count,
        "elapsed_s": elapsed,
        "errors": errors,
        "conns": conns,
    }


# -- the proxies ----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port}")


def _pin(cpu: int) -> Callable[[], None]:
    return lambda: os.sched_setaffinity(0, {cpu})


def start_gateway(
    ups: list[int], port: int, cpu: int, tmp: Path, extra: list[str]
) -> subprocess.Popen[bytes]:
    token = tmp / "token"
    token.write_text("bench-token\n")
    upstreams = (
        ["--upstream", f"http://127.0.0.1:{ups[0]}"]
        if len(ups) == 1
        else [a for i, u in enumerate(ups) for a in ("--upstream", f"r{i}=http://127.0.0.1:{u}")]
    )
    cmd = [
        sys.executable, "-m", "cotenant", "gateway", *upstreams,
        "--listen", f"127.0.0.1:{port}",
        "--control", f"127.0.0.1:{_free_port()}",
        "--token-file", str(token), "--log-level", "warning", *extra,
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, preexec_fn=_pin(cpu), stdout=subprocess.DEVNULL)
    _wait_port(port, proc, "cotenant gateway")
    return proc


NGINX_CONF = """
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log stderr warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    upstream backend {{ {balance} {servers} keepalive 256; }}
    server {{
        listen 127.0.0.1:{port};
        keepalive_requests 1000000;
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
}}
"""


def start_nginx(ups: list[int], port: int, cpu: int, tmp: Path) -> subprocess.Popen[bytes]:
    """nginx in front of ``ups``: one server, or several with ``least_conn``."""
    prefix = tmp / f"nginx-{port}"
    prefix.mkdir()
    conf = prefix / "nginx.conf"
    servers = " ".join(f"server 127.0.0.1:{u};" for u in ups)
    balance = "least_conn;" if len(ups) > 1 else ""
    conf.write_text(NGINX_CONF.format(tmp=prefix, servers=servers, balance=balance, port=port))
    proc = subprocess.Popen(
        [NGINX, "-p", str(prefix), "-c", str(conf), "-e", "stderr"], preexec_fn=_pin(cpu)
    )
    _wait_port(port, proc, "nginx")
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) used so far by ``pid`` and its live child processes (nginx's
    worker is a child of its master)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    total = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        total += sum(_cpu_seconds(int(c)) for c in children)
    return total


def span_cost(n: int) -> dict[str, float]:
    """CPU time per request on the proxy's thread, in µs: the builtin exporter's encoding of a
    request's two spans, against the OTel SDK's span creation and its OTLP encoding (which
    its batch exporter does later, on a thread sharing the GIL)."""
    sys.path.insert(0, str(ROOT))
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    from cotenant.gateway.finished import FinishedRequest
    from cotenant.gateway.otlp_spans import SpanEncoder
    from cotenant.gateway.telemetry import SpanEmitter

    req = dict(
        model="llama-3-8b", replica="r1", tenant="acme", priority=0, method="POST",
        path="/v1/completions", status=200, start_ns=time.time_ns(),
        admit_ns=time.time_ns() + 100_000, end_ns=time.time_ns() + 400_000, ttft_ns=None,
    )  # fmt: skip

    class Keep(SpanExporter):
        def __init__(self) -> None:
            self.spans: list[ReadableSpan] = []

        def export(self, spans: Any) -> SpanExportResult:
            self.spans.extend(spans)
            return SpanExportResult.SUCCESS

    keep = Keep()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(keep))
    sdk = SpanEmitter(provider.get_tracer("bench"))
    enc = SpanEncoder()
    out: dict[str, list[float]] = {"builtin_encode_us": [], "sdk_spans_us": [], "sdk_encode_us": []}
    for _ in range(5):
        t = time.process_time()
        for _ in range(n):
            enc.encode(FinishedRequest(**req))
        out["builtin_encode_us"].append((time.process_time() - t) / n * 1e6)
        keep.spans.clear()
        t = time.process_time()
        for _ in range(n):
            sdk.emit(FinishedRequest(**req))
        out["sdk_spans_us"].append((time.process_time() - t) / n * 1e6)
        t = time.process_time()
        for i in range(0, len(keep.spans), 512):  # the batch exporter's batches
            encode_spans(keep.spans[i : i + 512]).SerializeToString()
        out["sdk_encode_us"].append((time.process_time() - t) / n * 1e6)
    return {k: statistics.median(v) for k, v in out.items()}


def parser_cost(n: int) -> dict[str, dict[str, float]]:
    """CPU time to read one request, in µs, for each request parser (medians of 5 rounds,
    taken in turn): the bench's request, the same chunked, and one with 20 headers (an SDK
    client's), each fed to one parser per connection as keep-alive requests are."""
    sys.path.insert(0, str(ROOT))
    from cotenant.gateway.request_parser import PARSERS, make_request_parser

    plain = _request(8080)
    chunked = (
        b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1:8080\r\nuser-agent: bench\r\n"
        b"content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
        b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)
    )
    extra = b"".join(b"x-stainless-header-%d: value-%d\r\n" % (i, i) for i in range(15))
    many = plain.replace(b"x-tenant: acme\r\n", b"x-tenant: acme\r\n" + extra)
    shapes = {"plain": plain, "chunked": chunked, "20 headers": many}
    out: dict[str, dict[str, list[float]]] = {k: {s: [] for s in shapes} for k in PARSERS}
    for _ in range(5):
        for shape, data in shapes.items():
            for kind in PARSERS:
                parser = make_request_parser(kind, 1 << 24)
                t = time.process_time()
                for _ in range(n):
                    parser.feed(data)
                    parser.ready.popleft()
                out[kind][shape].append((time.process_time() - t) / n * 1e6)
    return {k: {s: statistics.median(v) for s, v in d.items()} for k, d in out.items()}


PATHS = (
    "direct",
    "gateway",
    "gw+sdk",
    "gw+builtin",
    "gw ll x4",
    "gw ll x4+spans",
    "nginx",
    "nginx lc x4",
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rate", type=float, default=1000.0, help="open-loop rate (rps)")
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    ap.add_argument("--repeats", type=int, default=3, help="repeats (medians reported)")
    ap.add_argument("--conns", type=int, default=32, help="connections of the closed loop")
    ap.add_argument("--upstreams", type=int, default=2, help="upstream processes")
    ap.add_argument("--replicas", type=int, default=4, help="replicas of the 'x4' paths")
    ap.add_argument("--proxy-cpu", type=int, default=0, help="the core the proxy is pinned to")
    ap.add_argument("--gateway-args", default="", help="extra flags for cotenant gateway")
    ap.add_argument("--no-spans", action="store_true", help="skip the traced gateway paths")
    ap.add_argument(
        "--only",
        default="",
        help=f"comma-separated paths to measure (direct always runs): {', '.join(PATHS)}",
    )
    ap.add_argument(
        "--compare-loops",
        action="store_true",
        help="also run the gateway with --loop asyncio (the default picks uvloop when installed)",
    )
    ap.add_argument(
        "--compare-parsers",
        action="store_true",
        help="also run the gateway (one upstream, and least-loaded x4) with --http-parser "
        "builtin, beside the default httptools (llhttp), in the same session",
    )
    ap.add_argument(
        "--span-cost",
        type=int,
        metavar="N",
        help="only time N requests' spans built by the builtin exporter and by the OTel SDK "
        "(CPU µs per request, medians of 5), then exit",
    )
    ap.add_argument(
        "--parser-cost",
        type=int,
        metavar="N",
        help="only time N requests read by each HTTP/1 request parser (CPU µs per request, "
        "medians of 5), then exit",
    )
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--upstream-only", metavar="PORTS", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.upstream_only:
        run_upstream([int(p) for p in args.upstream_only.split(",")])
        return 0
    if args.parser_cost:
        costs = parser_cost(args.parser_cost)
        shapes = list(next(iter(costs.values())))
        print(f"{'parser':10s} " + " ".join(f"{s:>11s}" for s in shapes) + "   (CPU µs/request)")
        for kind, row in costs.items():
            print(f"{kind:10s} " + " ".join(f"{row[s]:11.2f}" for s in shapes))
        for s in shapes:
            print(f"httptools/builtin {s}: {costs['httptools'][s] / costs['builtin'][s]:.2f}")
        return 0
    if args.span_cost:
        cost = span_cost(args.span_cost)
        for k, v in cost.items():
            print(f"{k:20s} {v:8.1f}")
        sdk = cost["sdk_spans_us"] + cost["sdk_encode_us"]
        print(f"SDK / builtin CPU per request: {sdk / cost['builtin_encode_us']:.1f}x")
        return 0
    wanted = set(PATHS) if not args.only else {"direct", *args.only.split(",")}
    if args.no_spans:
        wanted -= {"gw+sdk", "gw+builtin", "gw ll x4+spans"}
    if not Path(NGINX).exists():
        wanted -= {"nginx", "nginx lc x4"}
    cpus = sorted(os.sched_getaffinity(0))
    others = set(cpus) - {args.proxy_cpu} or set(cpus)
    os.sched_setaffinity(0, others)  # the load generator stays off the proxy's core
    tmp = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    up = _free_port()
    reps = [_free_port() for _ in range(args.replicas)]
    procs: list[subprocess.Popen[bytes]] = []
    extra = args.gateway_args.split()
    otlp = ["--otlp-endpoint", f"http://127.0.0.1:{up}"]  # the responder answers OTLP too
    ll = ["--routing", "least-loaded"]
    gateways: dict[str, tuple[list[int], list[str]]] = {
        "gateway": ([up], []),
        "gw+sdk": ([up], [*otlp, "--otlp-exporter", "sdk"]),
        "gw+builtin": ([up], [*otlp, "--otlp-exporter", "builtin"]),
        "gw ll x4": (reps, ll),
        "gw ll x4+spans": (reps, [*ll, *otlp, "--otlp-exporter", "builtin"]),
    }
    if args.compare_loops:
        gateways["gw asyncio"] = ([up], ["--loop", "asyncio"])
        wanted.add("gw asyncio")
    if args.compare_parsers:
        gateways["gw builtin"] = ([up], ["--http-parser", "builtin"])
        gateways["gw ll x4 bltn"] = (reps, [*ll, "--http-parser", "builtin"])
        wanted |= {"gw builtin", "gw ll x4 bltn"}
    try:
        ports = ",".join(str(p) for p in [up, *reps])
        for _ in range(args.upstreams):
            p = subprocess.Popen([sys.executable, __file__, "--upstream-only", ports])
            procs.append(p)
            for port in (up, *reps):
                _wait_port(port, p, "upstream")
        targets = {"direct": up}
        proxy_pid: dict[str, int] = {}
        for name, (ups, flags) in gateways.items():
            if name not in wanted:
                continue
            port = _free_port()
            gw = start_gateway(ups, port, args.proxy_cpu, tmp, [*flags, *extra])
            procs.append(gw)
            targets[name] = port
            proxy_pid[name] = gw.pid
        for name, ups in (("nginx", [up]), ("nginx lc x4", reps)):
            if name in wanted:
                port = _free_port()
                ng = start_nginx(ups, port, args.proxy_cpu, tmp)
                procs.append(ng)
                targets[name] = port
                proxy_pid[name] = ng.pid
        results: dict[str, dict[str, list[dict[str, float]]]] = {
            t: {"latency": [], "throughput": []} for t in targets
        }
        # warm up every path (connection pools, imports, caches)
        for port in targets.values():
            asyncio.run(closed_loop(port, 1.0, args.conns))
        for rep in range(args.repeats):
            for name, port in targets.items():
                pid = proxy_pid.get(name)
                # only the proxy under test runs: the others are stopped (SIGSTOP), so their
                # background work (a traced gateway's exporter thread) stays off its core
                for other, opid in proxy_pid.items():
                    os.kill(opid, signal.SIGCONT if other == name else signal.SIGSTOP)
                c0 = _cpu_seconds(pid) if pid else 0.0
                lat = asyncio.run(open_loop(port, args.rate, args.duration, 64))
                if pid:
                    lat["cpu_us_per_req"] = (_cpu_seconds(pid) - c0) / lat["sent"] * 1e6
                results[name]["latency"].append(lat)
                c0 = _cpu_seconds(pid) if pid else 0.0
                thr = asyncio.run(closed_loop(port, args.duration, args.conns))
                if pid:
                    cpu = _cpu_seconds(pid) - c0
                    thr["cpu_cores"] = cpu / thr["elapsed_s"]
                    thr["rps_per_cpu_s"] = thr["count"] / cpu if cpu else 0.0
                results[name]["throughput"].append(thr)
                print(
                    f"rep {rep + 1} {name:14s} @{args.rate:.0f} rps: p50 {lat['p50_ms']:.3f} ms "
                    f"p99 {lat['p99_ms']:.3f} ms (errors {lat['errors']:.0f}, "
                    f"late {lat['late_no_free_conn']:.0f}) | max {thr['rps']:,.0f} rps "
                    f"(errors {thr['errors']:.0f}"
                    + (
                        f", {thr['cpu_cores']:.2f} cores, {thr['rps_per_cpu_s']:,.0f} req per "
                        "CPU-second)"
                        if pid
                        else ")"
                    ),
                    flush=True,
                )
    finally:
        for p in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGCONT)
            _stop(p)
        shutil.rmtree(tmp, ignore_errors=True)

    def med(name: str, kind: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name][kind])

    summary: dict[str, dict[str, float]] = {}
    for name in targets:
        summary[name] = {
            "p50_ms": med(name, "latency", "p50_ms"),
            "p90_ms": med(name, "latency", "p90_ms"),
            "p99_ms": med(name, "latency", "p99_ms"),
            "best_p99_ms": min(r["p99_ms"] for r in results[name]["latency"]),
            "max_rps": med(name, "throughput", "rps"),
        }
        if name in proxy_pid:
            summary[name]["rps_per_cpu_s"] = med(name, "throughput", "rps_per_cpu_s")
            summary[name]["cpu_cores"] = med(name, "throughput", "cpu_cores")
            summary[name]["cpu_us_per_req_at_rate"] = med(name, "latency", "cpu_us_per_req")
    direct = summary["direct"]
    loadavg = os.getloadavg()[0]
    print(
        f"\nmedians of {args.repeats} repeats, {args.duration:g} s each; proxy pinned to cpu "
        f"{args.proxy_cpu}; nproc {len(cpus)}; load average {loadavg:.2f}"
    )
    print(
        f"{'path':14s} {'p50 ms':>7s} {'p90 ms':>7s} {'p99 ms':>7s} {'+p50':>6s} {'+p99':>6s} "
        f"{'best+p99':>8s} {'max rps':>8s} {'cores':>5s} {'req/CPU-s':>9s} {'CPU us/req':>10s}"
    )
    for name, s in summary.items():
        s["added_p50_ms"] = s["p50_ms"] - direct["p50_ms"]
        s["added_p99_ms"] = s["p99_ms"] - direct["p99_ms"]
        s["best_added_p99_ms"] = s["best_p99_ms"] - direct["best_p99_ms"]
        print(
            f"{name:14s} {s['p50_ms']:7.3f} {s['p90_ms']:7.3f} {s['p99_ms']:7.3f} "
            f"{s['added_p50_ms']:6.3f} {s['added_p99_ms']:6.3f} {s['best_added_p99_ms']:8.3f} "
            f"{s['max_rps']:8,.0f} {s.get('cpu_cores', float('nan')):5.2f} "
            f"{s.get('rps_per_cpu_s', float('nan')):9,.0f} "
            f"{s.get('cpu_us_per_req_at_rate', float('nan')):10.1f}"
        )

    def ratio(a: str, b: str, key: str) -> float | None:
        if a in summary and b in summary and summary[b].get(key):
            return summary[a][key] / summary[b][key]
        return None

    ratios = {
        "gateway/nginx req per CPU-s": ratio("gateway", "nginx", "rps_per_cpu_s"),
        "gw ll x4/nginx lc x4 req per CPU-s": ratio("gw ll x4", "nginx lc x4", "rps_per_cpu_s"),
        "gw+builtin/gw+sdk CPU us per req": ratio("gw+builtin", "gw+sdk", "cpu_us_per_req_at_rate"),
        "httptools/builtin parser added p99": ratio("gateway", "gw builtin", "added_p99_ms"),
        "httptools/builtin parser CPU us per req": ratio(
            "gateway", "gw builtin", "cpu_us_per_req_at_rate"
        ),
        "httptools/builtin parser req per CPU-s": ratio("gateway", "gw builtin", "rps_per_cpu_s"),
        "httptools/builtin ll x4 added p99": ratio("gw ll x4", "gw ll x4 bltn", "added_p99_ms"),
        "httptools/builtin ll x4 req per CPU-s": ratio(
            "gw ll x4", "gw ll x4 bltn", "rps_per_cpu_s"
        ),
    }
    for k, v in ratios.items():
        if v is not None:
            print(f"{k}: {v:.2f}")
    goals: dict[str, bool] = {}
    if "gateway" in summary:
        goals["added_p99_le_1ms"] = summary["gateway"]["added_p99_ms"] <= 1.0
        goals["throughput_ge_3000rps"] = summary["gateway"]["max_rps"] >= 3000
    if "gw ll x4" in summary:
        goals["ll_x4_added_p99_le_1ms"] = summary["gw ll x4"]["added_p99_ms"] <= 1.0
    if "gw ll x4 bltn" in summary:
        goals["ll_x4_builtin_added_p99_le_1ms"] = summary["gw ll x4 bltn"]["added_p99_ms"] <= 1.0
    if "gw ll x4+spans" in summary:
        goals["ll_x4_traced_added_p99_le_2ms"] = summary["gw ll x4+spans"]["added_p99_ms"] <= 2.0
    if "gw+builtin" in summary:
        goals["traced_added_p99_le_2ms"] = summary["gw+builtin"]["added_p99_ms"] <= 2.0
    print("goals:", ", ".join(f"{k}={'met' if v else 'NOT met'}" for k, v in goals.items()))
    if args.json:
        doc = {
            "summary": summary,
            "ratios": ratios,
            "raw": results,
            "goals": goals,
            "loadavg_1m": loadavg,
            "nproc": len(cpus),
            "args": vars(args) | {"json": str(args.json)},
        }
        args.json.write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
