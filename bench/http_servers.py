"""The gateway's HTTP front door against well-kept servers: the same work, side by side.

    python -m bench.http_servers [--levels 1,8] [--requests N|WORKLOAD=N,...] [--rounds 3]
                                 [--servers ours,uvicorn,uvicorn-httpx,granian,granian-rsgi]
                                 [--token-gap-ms 1] [--json out.json]

Issue 20 asks whether a maintained server now gives the speed that made the gateway keep its
own (gateway/wire/http.py: httptools under an asyncio Protocol). Each server runs in its own
process, with one worker, on uvloop, and does the same three things:

- `trivial`: GET /small answers a 28-byte JSON body: the server's own cost per request;
- `whole`: POST /whole forwards the body to the engine (bench/paced_engine.py, which answers
  like llama-server after `--whole-tokens` x `--token-gap-ms`) over a kept-alive connection
  and returns the engine's answer;
- `stream`: POST /stream forwards it with `"stream": true` and relays the answer's
  `--stream-tokens` chunks to the client as they come.

The servers:

- `ours`: wire/http.py's HttpServer and Router; whole answers through the gateway's engine
  pool (wire/engine_pool.py), written from the engine connection's callback as the gateway
  does (upstream.py's PooledEngine); streams through the gateway's relay (wire/relay.py's
  EngineConnector and EngineExchange.relay), which forwards the engine's chunk framing;
- `uvicorn`: uvicorn with `http="httptools"`, `loop="uvloop"`, no access log, an ASGI app
  whose engine client is one kept-alive aiohttp ClientSession; `uvicorn-httpx`: the same
  with an httpx AsyncClient instead (the trivial workload uses no client: not run there);
- `granian`: granian's ASGI interface (`--workers 1 --loop uvloop --http 1`), the same app;
- `granian-rsgi`: granian's own RSGI interface, the same handlers written for it;
  `--granian-args` adds options to both (its defaults otherwise).

Every engine connection is TCP (the gateway's pods also have a Unix socket; not used here).
The load generator is this process: raw asyncio sockets parsed by httptools on uvloop,
`level` kept-alive connections each sending its next request when the last is answered. For
each workload and level the servers run in turn, `--rounds` times (alternating, so a drift in
the machine's load hits all alike). Reported per server: requests/s (the median round),
p50 and p99 latency (all rounds' requests), the server process's CPU per request (its threads
and its children's, from /proc), and each as a ratio to ours.

`--requests N` is a cell's requests at concurrency 1 (a level c runs N * (c + 1) / 2); per
workload as `trivial=30000,whole=1000,stream=150` (the defaults). Never run by the tests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

OURS = "ours"
SERVERS = ("ours", "uvicorn", "uvicorn-httpx", "granian", "granian-rsgi")
WORKLOADS = ("trivial", "whole", "stream")
DEFAULT_REQUESTS = {"trivial": 30000, "whole": 1000, "stream": 150}
CLIENT_FREE = ("uvicorn-httpx",)  # the same server as another column when no client is used
SMALL = b'{"ok":true,"object":"bench"}'
ENGINE_PATH = "/v1/chat/completions"
ROOT = Path(__file__).resolve().parent.parent
PROMPT = [{"role": "user", "content": "Tell me a story about a lighthouse keeper."}]


# --- the servers (each in its own process) ---------------------------------------------------


async def _serve_ours(port: int, engine_url: str) -> None:
    from glm_operator.gateway.wire.engine import EngineAddress, EngineHead
    from glm_operator.gateway.wire.engine_pool import EnginePool
    from glm_operator.gateway.wire.framing import head_bytes
    from glm_operator.gateway.wire.messages import Request, Response, Router, Streamed
    from glm_operator.gateway.wire.relay import EngineConnector
    from glm_operator.gateway.wire.server import HttpServer

    address = EngineAddress.parse(engine_url)
    assert address is not None
    pool = EnginePool(address, 10.0, 60.0)
    connector = EngineConnector(address, 10.0, 60.0)

    async def small(_request: Request) -> Response:
        return Response(200, SMALL, {"Content-Type": "application/json"})

    async def whole(request: Request) -> Response | Streamed:
        written: Streamed | None = None

        def write_now(head: EngineHead, body: bytes) -> None:  # as upstream.PooledEngine
            nonlocal written
            if head.status == 200:
                written = request.write_now(Response(
                    200, body, {"Content-Type": head.content_type}))

        head, body = await pool.post(ENGINE_PATH, request.body, write_now)
        return written or Response(head.status, body, {"Content-Type": head.content_type})

    def ignore(_pieces: list[bytes]) -> None:
        return None

    async def stream(request: Request) -> Response | Streamed:
        exchange = await connector.open(ENGINE_PATH, request.body)
        try:
            head = await exchange.head
            if head.status != 200:
                body = await exchange.read_body()
                return Response(head.status, body, {"Content-Type": head.content_type})
            request.transport.write(head_bytes(200, {
                "Content-Type": head.content_type, "Cache-Control": "no-cache",
                "Transfer-Encoding": "chunked"}))
            exchange.relay(request.transport, ignore, request.drain)
            await exchange.done
        finally:
            exchange.abort()
        return Streamed(complete=True)

    async def not_found(_request: Request) -> Response:
        return Response(404, b"{}", {"Content-Type": "application/json"})

    router = Router(not_found)
    router.add("GET", "/small", small)
    router.add("POST", "/whole", whole)
    router.add("POST", "/stream", stream)
    server = HttpServer(router, 1 << 20)
    await server.start("127.0.0.1", port)
    await asyncio.Event().wait()


class _EngineClient:
    """The ASGI and RSGI apps' engine client: aiohttp or httpx, kept-alive, made lazily
    (inside the server's loop) on the first request."""

    def __init__(self) -> None:
        self.kind = os.environ.get("BENCH_ASGI_CLIENT", "aiohttp")
        self.url = os.environ.get("BENCH_ENGINE_URL", "") + ENGINE_PATH
        self._client: Any = None

    def client(self) -> Any:
        if self._client is None:
            if self.kind == "httpx":
                import httpx
                self._client = httpx.AsyncClient(
                    timeout=60.0, limits=httpx.Limits(max_connections=256,
                                                      max_keepalive_connections=256))
            else:
                import aiohttp
                self._client = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=256, keepalive_timeout=60.0),
                    timeout=aiohttp.ClientTimeout(total=60.0))
        return self._client

    async def whole(self, body: bytes) -> tuple[int, str, bytes]:
        client = self.client()
        headers = {"Content-Type": "application/json"}
        if self.kind == "httpx":
            answer = await client.post(self.url, content=body, headers=headers)
            return (answer.status_code, answer.headers.get("content-type", "application/json"),
                    answer.content)
        async with client.post(self.url, data=body, headers=headers) as answer:
            data = await answer.read()
            return answer.status, answer.headers.get("Content-Type", "application/json"), data

    @contextlib.asynccontextmanager
    async def stream(self, body: bytes) -> Any:
        """Yields (status, content type, an async iterator of the body's pieces)."""
        client = self.client()
        headers = {"Content-Type": "application/json"}
        if self.kind == "httpx":
            async with client.stream("POST", self.url, content=body,
                                     headers=headers) as answer:
                yield (answer.status_code,
                       answer.headers.get("content-type", "text/event-stream"),
                       answer.aiter_raw())
            return
        async with client.post(self.url, data=body, headers=headers) as answer:
            yield (answer.status, answer.headers.get("Content-Type", "text/event-stream"),
                   answer.content.iter_any())


_engine = _EngineClient()


async def asgi_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The ASGI app uvicorn and granian serve."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    path = scope["path"]
    if path == "/small":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": SMALL})
        return
    pieces = []
    while True:
        message = await receive()
        pieces.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    body = b"".join(pieces)
    if path == "/whole":
        status, content_type, answer = await _engine.whole(body)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", content_type.encode("latin-1"))]})
        await send({"type": "http.response.body", "body": answer})
    elif path == "/stream":
        async with _engine.stream(body) as (status, content_type, chunks):
            await send({"type": "http.response.start", "status": status, "headers": [
                (b"content-type", content_type.encode("latin-1")),
                (b"cache-control", b"no-cache")]})
            async for chunk in chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    else:
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b""})


async def rsgi_app(scope: Any, protocol: Any) -> None:
    """The same handlers on granian's RSGI interface."""
    if scope.proto != "http":
        return
    path = scope.path
    if path == "/small":
        protocol.response_bytes(200, [("content-type", "application/json")], SMALL)
        return
    body = await protocol()
    if path == "/whole":
        status, content_type, answer = await _engine.whole(body)
        protocol.response_bytes(status, [("content-type", content_type)], answer)
    elif path == "/stream":
        async with _engine.stream(body) as (status, content_type, chunks):
            transport = protocol.response_stream(status, [("content-type", content_type),
                                                          ("cache-control", "no-cache")])
            async for chunk in chunks:
                await transport.send_bytes(chunk)
    else:
        protocol.response_empty(404, [])


def _serve(kind: str, port: int, engine_url: str) -> None:
    """Run one server in this process (the `--serve` mode)."""
    import uvloop
    os.environ["BENCH_ENGINE_URL"] = engine_url
    if kind == OURS:
        uvloop.run(_serve_ours(port, engine_url))
    elif kind in ("uvicorn", "uvicorn-httpx"):
        import uvicorn  # the client is BENCH_ASGI_CLIENT's, set by the caller
        uvicorn.run(asgi_app, host="127.0.0.1", port=port, http="httptools", loop="uvloop",
                    log_level="warning", access_log=False, lifespan="on")
    else:
        raise SystemExit(f"unknown server {kind!r}")


def _server_argv(kind: str, port: int, engine_url: str, granian_args: tuple[str, ...] = ()
                 ) -> list[str]:
    if kind.startswith("granian"):
        interface, app = ("rsgi", "rsgi_app") if kind == "granian-rsgi" else ("asgi", "asgi_app")
        return [sys.executable, "-m", "granian", "--interface", interface, "--workers", "1",
                "--loop", "uvloop", "--http", "1", "--no-ws", "--log-level", "warning",
                "--no-access-log", "--host", "127.0.0.1", "--port", str(port),
                *granian_args, f"bench.http_servers:{app}"]
    return [sys.executable, "-m", "bench.http_servers", "--serve", kind, "--port", str(port),
            "--engine-url", engine_url]


# --- processes and their CPU -------------------------------------------------------------------


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants (granian's worker is a child of its supervisor)."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            with contextlib.suppress(OSError):
                todo += [int(x) for x in (task / "children").read_text().split()]
    return out


def tree_cpu_seconds(pid: int) -> float:
    from e2e.procstat import cpu_seconds
    total = 0.0
    for member in _tree(pid):
        with contextlib.suppress(OSError):
            total += cpu_seconds(member)
    return total


def _wait_answering(process: subprocess.Popen[bytes], url: str, what: str, log: Path,
                    timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited ({process.returncode}): "
                               f"{log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not answer {url} in {timeout:g} s")
        time.sleep(0.1)


@contextlib.contextmanager
def _process(argv: list[str], name: str, health_url: str, work: Path,
             env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    from e2e.procstat import stop
    log = work / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True, cwd=ROOT,
                                   env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    try:
        _wait_answering(process, health_url, name, log)
        yield process
    finally:
        stop(process)


# --- the load -----------------------------------------------------------------------------------


class _LoadConnection(asyncio.Protocol):
    """One kept-alive client connection: a request, its answer parsed by httptools, the next."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        import httptools
        self._loop = loop
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.answer: asyncio.Future[tuple[int, int]] | None = None
        self._bytes = 0
        self.keep_alive = True
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, request: bytes) -> asyncio.Future[tuple[int, int]]:
        assert self.transport is not None
        self.answer = self._loop.create_future()
        self._bytes = 0
        self.transport.write(request)
        return self.answer

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        self._bytes += len(body)

    def on_message_complete(self) -> None:
        self.keep_alive = self._parser.should_keep_alive()
        if self.answer is not None and not self.answer.done():
            self.answer.set_result((self._parser.get_status_code(), self._bytes))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.answer is not None and not self.answer.done():
            self.answer.set_exception(ConnectionResetError(f"server closed: {exc or 'EOF'}"))


def _request_bytes(workload: str, port: int, whole_tokens: int, stream_tokens: int) -> bytes:
    if workload == "trivial":
        return b"GET /small HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % port
    stream = workload == "stream"
    body = json.dumps({"model": "bench", "messages": PROMPT, "stream": stream,
                       "max_tokens": stream_tokens if stream else whole_tokens}).encode()
    return (b"POST /%b HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%b" % (workload.encode(), port, len(body), body))


@dataclass
class Round:
    requests: int
    seconds: float
    cpu_seconds: float
    latencies: list[float] = field(repr=False)


async def _load(port: int, request: bytes, level: int, requests: int) -> tuple[float,
                                                                               list[float]]:
    loop = asyncio.get_running_loop()
    left = iter(range(requests))
    latencies: list[float] = []

    async def connect() -> _LoadConnection:
        _, protocol = await loop.create_connection(lambda: _LoadConnection(loop), "127.0.0.1",
                                                   port)
        return protocol

    async def worker() -> None:
        connection = await connect()
        try:
            for _ in left:
                if connection.lost or not connection.keep_alive:
                    assert connection.transport is not None
                    connection.transport.close()
                    connection = await connect()
                started = time.perf_counter()
                status, size = await connection.send(request)
                latencies.append(time.perf_counter() - started)
                if status != 200 or not size:
                    raise RuntimeError(f"HTTP {status} with {size} body bytes")
        finally:
            if connection.transport is not None:
                connection.transport.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(level)))
    return time.perf_counter() - started, latencies


def _measure(port: int, pid: int, request: bytes, level: int, requests: int) -> Round:
    import uvloop
    before = tree_cpu_seconds(pid)
    seconds, latencies = uvloop.run(_load(port, request, level, requests))
    return Round(requests, seconds, tree_cpu_seconds(pid) - before, latencies)


# --- the run ------------------------------------------------------------------------------------


@dataclass
class Cell:
    workload: str
    level: int
    server: str
    requests_per_second: float  # the median round
    rps_min: float
    rps_max: float
    p50_ms: float
    p99_ms: float
    cpu_us_per_request: float
    rps_ratio: float = 1.0  # to ours
    p50_ratio: float = 1.0
    p99_ratio: float = 1.0
    cpu_ratio: float = 1.0


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _cell(workload: str, level: int, server: str, rounds: list[Round]) -> Cell:
    rates = [r.requests / r.seconds for r in rounds]
    latencies = [x for r in rounds for x in r.latencies]
    return Cell(workload, level, server, round(statistics.median(rates), 1),
                round(min(rates), 1), round(max(rates), 1),
                round(_quantile(latencies, 0.50) * 1000, 3),
                round(_quantile(latencies, 0.99) * 1000, 3),
                round(sum(r.cpu_seconds for r in rounds) * 1e6
                      / sum(r.requests for r in rounds), 1))


def run(levels: tuple[int, ...] = (1, 8), requests: dict[str, int] | None = None,
        rounds: int = 3, servers: tuple[str, ...] = SERVERS,
        workloads: tuple[str, ...] = WORKLOADS, token_gap_ms: float = 1.0,
        whole_tokens: int = 4, stream_tokens: int = 16, granian_args: tuple[str, ...] = (),
        work_dir: Path | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    from e2e.ports import free_port

    counts = {**DEFAULT_REQUESTS, **(requests or {})}
    ours_source = _source_fingerprint()  # what the servers' processes import, read at start
    work = work_dir or Path(tempfile.mkdtemp(prefix="glm-bench-http-servers-"))
    cells: list[Cell] = []
    with contextlib.ExitStack() as stack:
        engine_port = free_port()
        engine_url = f"http://127.0.0.1:{engine_port}"
        stack.enter_context(_process(
            [sys.executable, "-m", "bench.paced_engine", "--port", str(engine_port),
             "--token-gap-ms", f"{token_gap_ms:g}", "--slots", str(max(levels))],
            "paced-engine", engine_url + "/health", work))
        running: dict[str, tuple[int, int]] = {}  # server -> (port, pid)
        for server in servers:
            port = free_port()
            process = stack.enter_context(_process(
                _server_argv(server, port, engine_url, granian_args), server,
                f"http://127.0.0.1:{port}/small", work,
                env={"BENCH_ENGINE_URL": engine_url,
                     "BENCH_ASGI_CLIENT": "httpx" if server.endswith("httpx") else "aiohttp"}))
            running[server] = (port, process.pid)
        log(f"servers up: {', '.join(running)}; engine {engine_url} "
            f"(whole answer after {whole_tokens} x {token_gap_ms:g} ms, stream of "
            f"{stream_tokens} chunks {token_gap_ms:g} ms apart)")
        for workload in workloads:
            for level in levels:
                count = max(level, counts[workload] * (level + 1) // 2)
                here = [s for s in running if not (workload == "trivial" and s in CLIENT_FREE)]
                for server in here:  # warm: connections, the engine pool, the code paths
                    port, pid = running[server]
                    _measure(port, pid, _request_bytes(workload, port, whole_tokens,
                                                       stream_tokens), level,
                             max(level * 20, count // 20))
                samples: dict[str, list[Round]] = {s: [] for s in here}
                for index in range(rounds):
                    order = here if index % 2 == 0 else here[::-1]
                    for server in order:
                        port, pid = running[server]
                        samples[server].append(_measure(
                            port, pid, _request_bytes(workload, port, whole_tokens,
                                                      stream_tokens), level, count))
                row = [_cell(workload, level, s, samples[s]) for s in here]
                _ratios(row)
                cells += row
                log(_table(row, header=True))
    result = {"levels": list(levels), "rounds": rounds, "requests_at_1": counts,
              "token_gap_ms": token_gap_ms, "whole_tokens": whole_tokens,
              "stream_tokens": stream_tokens, "granian_args": list(granian_args),
              "cpus": os.cpu_count(),
              "load_average": os.getloadavg(), "versions": _versions(),
              "ours_source": ours_source,
              "cells": [asdict(c) for c in cells]}
    result["verdict"] = verdict(cells)
    return result


def _ratios(row: list[Cell]) -> None:
    ours = next((c for c in row if c.server == OURS), None)
    if ours is None:
        return
    for cell in row:
        cell.rps_ratio = round(cell.requests_per_second / ours.requests_per_second, 3)
        cell.p50_ratio = round(cell.p50_ms / ours.p50_ms, 3)
        cell.p99_ratio = round(cell.p99_ms / ours.p99_ms, 3)
        cell.cpu_ratio = round(cell.cpu_us_per_request / ours.cpu_us_per_request, 3)


def _source_fingerprint() -> dict[str, Any]:
    """The gateway's wire/ modules as this run found them (others may be editing them):
    the git revision, whether wire/ differs from it, and each file's lines and hash."""
    import hashlib
    wire = ROOT / "operator" / "glm_operator" / "gateway" / "wire"
    out: dict[str, Any] = {}
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        out["revision"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                         capture_output=True, text=True,
                                         check=True).stdout.strip()
        out["wire_modified"] = subprocess.run(
            ["git", "diff", "--quiet", "HEAD", "--", str(wire)], cwd=ROOT).returncode != 0
    for path in sorted(wire.glob("*.py")):
        data = path.read_bytes()
        lines = data.count(b"\n")
        out[path.name] = f"{lines} lines, sha256 {hashlib.sha256(data).hexdigest()[:12]}"
    return out


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version
    out = {}
    for name in ("uvicorn", "granian", "httptools", "uvloop", "aiohttp", "httpx"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "absent"
    return out


def _table(cells: list[Cell], header: bool = False) -> str:
    lines = []
    if header:
        lines.append("| workload | c | server | req/s (x ours) | p50 ms (x ours) | "
                     "p99 ms (x ours) | CPU us/req (x ours) |")
        lines.append("|---|---|---|---|---|---|---|")
    for c in cells:
        lines.append(
            f"| {c.workload} | {c.level} | {c.server} | {c.requests_per_second:,.0f} "
            f"({c.rps_ratio:.2f}) | {c.p50_ms:.3f} ({c.p50_ratio:.2f}) | {c.p99_ms:.3f} "
            f"({c.p99_ratio:.2f}) | {c.cpu_us_per_request:,.0f} ({c.cpu_ratio:.2f}) |")
    return "\n".join(lines)


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def verdict(cells: list[Cell], noise: float = 0.03) -> str:
    """One paragraph from the numbers: which server is ahead, by how much. A difference
    within `noise` (of requests/s or CPU per request) counts as even."""
    others = sorted({c.server for c in cells} - {OURS})
    if not others or not any(c.server == OURS for c in cells):
        return "Nothing to compare."
    rps = {s: _geomean([c.rps_ratio for c in cells if c.server == s]) for s in others}
    cpu = {s: _geomean([c.cpu_ratio for c in cells if c.server == s]) for s in others}
    p50 = {s: _geomean([c.p50_ratio for c in cells if c.server == s]) for s in others}
    closest = max(others, key=lambda s: rps[s])
    n_cells = sum(c.server == closest for c in cells)
    faster = [c for c in cells if c.server != OURS and c.rps_ratio > 1 + noise]
    leaner = [c for c in cells if c.server != OURS and c.cpu_ratio < 1 - noise]
    if rps[closest] < 1 - noise and min(cpu.values()) > 1 + noise:
        lead = (f"Ours is still ahead. The closest alternative, {closest}, reaches "
                f"{rps[closest]:.2f}x our requests/s (geometric mean over the {n_cells} "
                f"workload and level cells it ran) at {cpu[closest]:.2f}x our CPU per "
                f"request and {p50[closest]:.2f}x our p50 latency.")
        keep = "Keep ours."
    elif max(rps.values()) <= 1 + noise and min(cpu.values()) >= 1 - noise:
        lead = (f"Ours and the alternatives are about even: the closest, {closest}, reaches "
                f"{rps[closest]:.2f}x our requests/s at {cpu[closest]:.2f}x our CPU per "
                "request.")
        keep = "Ours is not behind, so a switch would buy no speed."
    else:
        lead = (f"Ours is not ahead: {closest} reaches {rps[closest]:.2f}x our requests/s "
                f"(geometric mean) at {cpu[closest]:.2f}x our CPU per request.")
        keep = "A switch deserves weighing."
    rest = "; ".join(
        f"{s} {rps[s]:.2f}x the requests/s ("
        f"{min(c.rps_ratio for c in cells if c.server == s):.2f}-"
        f"{max(c.rps_ratio for c in cells if c.server == s):.2f}) at {cpu[s]:.2f}x the CPU "
        f"per request" for s in others if s != closest)
    exceptions = ""
    if faster:
        exceptions += " Faster than ours by more than {:.0%} only in: {}.".format(
            noise, ", ".join(f"{c.server} on {c.workload} c={c.level} ({c.rps_ratio:.2f}x, "
                             f"at {c.cpu_ratio:.2f}x the CPU)" for c in faster))
    else:
        exceptions += f" No alternative is faster than ours by more than {noise:.0%} in any cell."
    if leaner:
        exceptions += " Less CPU per request than ours in: {}.".format(
            ", ".join(f"{c.server} on {c.workload} c={c.level} ({c.cpu_ratio:.2f}x)"
                      for c in leaner))
    else:
        exceptions += " None spends less CPU per request than ours in any cell."
    return f"{lead} The others: {rest}.{exceptions} {keep}"


def _parse_requests(text: str | None) -> dict[str, int]:
    if not text:
        return {}
    if "=" not in text:
        return dict.fromkeys(WORKLOADS, int(text))
    out = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        if name not in WORKLOADS:
            raise ValueError(f"unknown workload {name!r}")
        out[name] = int(value)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.http_servers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", default="1,8")
    parser.add_argument("--requests", help="N, or WORKLOAD=N,... (requests per cell at c=1)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--servers", default=",".join(SERVERS))
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--token-gap-ms", type=float, default=1.0)
    parser.add_argument("--whole-tokens", type=int, default=4)
    parser.add_argument("--stream-tokens", type=int, default=16)
    parser.add_argument("--granian-args", default="",
                        help="more granian options, e.g. '--runtime-mode st --task-impl rust'")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--serve", help=argparse.SUPPRESS)  # one server, in this process
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--engine-url", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        _serve(args.serve, args.port, args.engine_url)
        return 0
    servers = tuple(args.servers.split(","))
    if unknown := set(servers) - set(SERVERS):
        parser.error(f"unknown servers: {', '.join(sorted(unknown))}")
    result = run(tuple(int(x) for x in args.levels.split(",")), _parse_requests(args.requests),
                 args.rounds, servers, tuple(args.workloads.split(",")), args.token_gap_ms,
                 args.whole_tokens, args.stream_tokens, tuple(args.granian_args.split()))
    cells = [Cell(**c) for c in result["cells"]]
    print("\n" + _table(cells, header=True))
    print("\n" + result["verdict"])
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
