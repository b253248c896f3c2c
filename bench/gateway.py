"""Gateway overhead: the same load direct to llama-server and through the gateway, side by side.

    python -m bench.gateway [--levels 1,8,32] [--tokens 128] [--rounds 2]
                            [--event-loops auto|uvloop,asyncio] [--baseline REF[,REF]]
                            [--router auto|off] [--engine llama|paced]
                            [--engine-hops socket|tcp|socket,tcp] [--floor]
                            [--token-gap-ms 2] [--json out.json]
    pytest bench/gateway.py -m bench -s

One llama-server (the pinned build, a tiny random-weight model, one slot per client) and, in
front of it, one gateway process per event loop, optionally one per git revision running that
revision's gateway code (`--baseline`, for before/after in one run) and vllm-router (the Rust
router, `pip install -e '.[bench]'`; no keys, limits or audit) as the reference column. For
each mode (non-streaming, streaming) and concurrency level the load runs alternately direct
and through each path (`rounds` times each, so a drift in machine load hits all alike).
Every request asks for exactly `tokens` generated tokens (`ignore_eos`).

The engine listens on TCP and on an abstract Unix socket, as the rendered llama.cpp pods do;
each gateway sends answers over the socket (`--engine-socket`, as rendered), and with
`--engine-hops socket,tcp` one more gateway per event loop over TCP ("<loop> tcp") measures
what the socket saves. Direct load, vllm-router and `--baseline` gateways whose code has no
`--engine-socket` go over TCP. `--floor` adds bench/byte_relay.py, which copies bytes between
the sockets and does nothing else: what any relay in Python on uvloop pays per token.

`--engine paced` puts bench/paced_engine.py in llama-server's place: a chunk every
`--token-gap-ms` at almost no CPU. On two shared cores the real engine computes on the cores
the path and the load generator use, so with it a path's figures include the engine slowed
by the path; with the paced engine they are the path's own.

Reported per row and path: throughput (generated tokens/s) direct and through the path and
their ratio, p50 latency (non-streaming) or p50 time to first chunk (streaming) on both and
the difference, the path's CPU per request and per generated token, and the gateway's peak
RSS. Targets: ratio >= 0.97, added p50 <= 0.5 ms non-streaming and TTFT <= 1 ms streaming,
RSS < 60 MiB.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
import pytest
from glm_operator.render.engine_args import ENGINE_SOCKET

from bench.baseline import export_operator
from e2e.gateway_process import GatewayProcess
from e2e.llama import LlamaServer, http_json, llama_server_binary, local_socket
from e2e.models import TinyLlamaSpec, write_tiny_llama
from e2e.ports import free_port
from e2e.procstat import cpu_seconds, stop

TARGET_RATIO = {"non-streaming": 0.97, "streaming": 0.97}
TARGET_ADDED_MS = {"non-streaming": 0.5, "streaming": 1.0}
ROUTER = "vllm-router"
FLOOR = "byte relay"  # bench/byte_relay.py: copies bytes, the floor of any Python relay
TARGET_RSS_MIB = 60.0
PROMPT = [{"role": "user", "content": "Tell me a story about a lighthouse keeper."}]


@dataclass
class Sample:
    tokens_per_second: float
    p50_ms: float  # latency (non-streaming) or time to first chunk (streaming)


@dataclass
class Row:
    mode: str
    concurrency: int
    path: str  # a gateway event loop, "baseline <ref>", or vllm-router
    direct_tps: float
    gateway_tps: float
    ratio: float
    direct_p50_ms: float
    gateway_p50_ms: float
    added_ms: float
    gateway_cpu_ms_per_request: float  # the path's process: user + system CPU
    gateway_cpu_us_per_token: float


async def _one(session: aiohttp.ClientSession, url: str, body: bytes, stream: bool
               ) -> tuple[float, float]:
    started = time.perf_counter()
    first = 0.0
    async with session.post(url, data=body,
                            headers={"Content-Type": "application/json"}) as response:
        if response.status != 200:
            raise RuntimeError(f"{url}: HTTP {response.status}: {await response.text()}")
        if stream:
            async for _chunk in response.content.iter_any():
                if not first:
                    first = time.perf_counter() - started
        else:
            await response.read()
    total = time.perf_counter() - started
    return total, first


async def _load(base_url: str, concurrency: int, stream: bool, tokens: int, requests: int,
                key: str) -> Sample:
    body = json.dumps({"model": "bench", "messages": PROMPT, "max_tokens": tokens,
                       "temperature": 0, "ignore_eos": True, "stream": stream}).encode()
    url = base_url + "/v1/chat/completions"
    # llama-server (httplib) drops keep-alive connections after a streamed answer, so streamed
    # requests use a fresh client connection each, on both paths alike.
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=stream)
    headers = {"Authorization": f"Bearer {key}"}
    results: list[tuple[float, float]] = []
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
        await _one(session, url, body, stream)  # warm the connection and the engine
        queue = iter(range(requests))

        async def worker() -> None:
            for _ in queue:
                try:
                    results.append(await _one(session, url, body, stream))
                except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError):
                    # llama-server sometimes closes a keep-alive connection after a stream;
                    # the client retries once on a new one, on both paths alike.
                    results.append(await _one(session, url, body, stream))
                except RuntimeError as exc:
                    # An error answer (a 503 from a stale engine connection on a loaded
                    # machine): said, and retried once, so one does not lose the whole run.
                    print(f"  retried after {exc}", flush=True)
                    results.append(await _one(session, url, body, stream))

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    metric = [first for _, first in results] if stream else [total for total, _ in results]
    return Sample(tokens_per_second=requests * tokens / elapsed,
                  p50_ms=statistics.median(metric) * 1000)


def run_benchmark(levels: tuple[int, ...] = (1, 8, 32), tokens: int = 128, rounds: int = 2,
                  engine_threads: int = 1, work_dir: Path | None = None,
                  event_loops: tuple[str, ...] = ("auto",), baselines: tuple[str, ...] = (),
                  router: bool = True, engine_kind: str = "llama",
                  token_gap_ms: float = 2.0,
                  engine_hops: tuple[str, ...] = ("socket",),
                  floor: bool = False) -> dict[str, object]:
    """One gateway per event loop in `event_loops` (and one per git revision in `baselines`
    running that revision's code, and
    vllm-router when installed and `router`), all in front of the same engine and measured in
    the same rounds, so they compare side by side too."""
    work = work_dir or Path(tempfile.mkdtemp(prefix="glm-bench-gateway-"))
    binary = llama_server_binary() if engine_kind == "llama" else None
    max_level = max(levels)
    model = write_tiny_llama(work / "tiny.gguf", TinyLlamaSpec(n_ctx_train=65536))
    per_slot = 256
    keys = work / "keys"
    keys.mkdir(exist_ok=True)
    (keys / "bench").write_text("sk-bench")
    rows: list[Row] = []
    with contextlib.ExitStack() as stack:
        if engine_kind == "paced":
            engine_url, socket = stack.enter_context(
                _paced_engine(token_gap_ms, max_level, work))
        else:
            llama = stack.enter_context(LlamaServer.start(
                [str(binary), "-m", str(model), "-c", str(per_slot * max_level), "-np",
                 str(max_level), "-t", str(engine_threads), "--metrics",
                 "--host", f"127.0.0.1,{ENGINE_SOCKET}"], work))
            engine_url, socket = llama.url, llama.sockets[0]
        gateway_args = ["--api-keys", str(keys), "--engine-slots", str(max_level)]
        # Through the environment: a baseline whose code has no --engine-socket ignores it.
        hop_env = {"socket": {"GLM_GATEWAY_ENGINE_SOCKET": socket}, "tcp": {}}
        gateways = {
            loop if hop == "socket" else f"{loop} tcp": stack.enter_context(
                GatewayProcess.start(engine_url, work / f"{loop}-{hop}",
                                     [*gateway_args, "--event-loop", loop],
                                     service_name="bench", env=hop_env[hop]))
            for loop in event_loops for hop in engine_hops}
        for ref in baselines:
            source = export_operator(ref, work / "baseline" / ref)
            gateways[f"baseline {ref}"] = stack.enter_context(GatewayProcess.start(
                engine_url, work / "baseline" / ref, gateway_args, service_name="bench",
                env={"PYTHONPATH": str(source), **hop_env[engine_hops[0]]}))
        paths: dict[str, tuple[str, Callable[[], float]]] = {
            name: (gateway.url, gateway.cpu_seconds) for name, gateway in gateways.items()}
        router_binary = shutil.which(ROUTER, path=f"{Path(sys.executable).parent}:"
                                     f"{os.environ.get('PATH', '')}") if router else None
        if floor:
            paths[FLOOR] = stack.enter_context(_byte_relay(engine_url, work))
        if router_binary:
            paths[ROUTER] = stack.enter_context(_vllm_router(router_binary, engine_url, work))
        elif router:
            print(f"{ROUTER} not installed (pip install -e '.[bench]'): no reference column",
                  flush=True)
        for mode, stream in (("non-streaming", False), ("streaming", True)):
            for level in levels:
                requests = max(16, level * 4)
                direct: list[Sample] = []
                proxied: dict[str, list[Sample]] = {name: [] for name in paths}
                cpu = dict.fromkeys(paths, 0.0)
                for _ in range(rounds):
                    direct.append(asyncio.run(
                        _load(engine_url, level, stream, tokens, requests, "none")))
                    for name, (url, cpu_seconds) in paths.items():
                        before = cpu_seconds()
                        proxied[name].append(asyncio.run(
                            _load(url, level, stream, tokens, requests, "sk-bench")))
                        cpu[name] += cpu_seconds() - before
                d_tps = statistics.mean(s.tokens_per_second for s in direct)
                d_p50 = statistics.median(s.p50_ms for s in direct)
                for name, samples in proxied.items():
                    g_tps = statistics.mean(s.tokens_per_second for s in samples)
                    g_p50 = statistics.median(s.p50_ms for s in samples)
                    # +1: each load's warm-up request
                    cpu_ms = cpu[name] * 1000 / (rounds * (requests + 1))
                    row = Row(mode, level, name, round(d_tps, 1), round(g_tps, 1),
                              round(g_tps / d_tps, 3), round(d_p50, 2), round(g_p50, 2),
                              round(g_p50 - d_p50, 2), round(cpu_ms, 2),
                              round(cpu_ms * 1000 / tokens, 1))
                    rows.append(row)
                    print(f"{mode:14} c={level:<3} {name:12} direct {d_tps:8.1f} tok/s  via "
                          f"{g_tps:8.1f} tok/s  ratio {row.ratio:.3f}  p50 {d_p50:7.2f} -> "
                          f"{g_p50:7.2f} ms ({row.added_ms:+.2f})  CPU {cpu_ms:.2f} ms/request "
                          f"{row.gateway_cpu_us_per_token:.1f} us/token", flush=True)
        rss_mib = max(_peak_rss_mib(gateway) for gateway in gateways.values())
    print(f"gateway peak RSS {rss_mib:.1f} MiB", flush=True)
    return {"tokens": tokens, "rounds": rounds, "engine_threads": engine_threads,
            "engine": engine_kind if engine_kind == "llama" else f"paced {token_gap_ms:g} ms",
            "engine_hops": list(engine_hops),
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "rows": [asdict(r) for r in rows], "gateway_peak_rss_mib": round(rss_mib, 1)}


def _wait_healthy(process: subprocess.Popen[bytes], url: str, what: str, log_name: str,
                  timeout: float) -> None:
    """Until `url`/health answers 200; fails if the process exits or the time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited {process.returncode}: see {log_name}")
        with contextlib.suppress(OSError, urllib.error.URLError):
            if http_json(url + "/health", timeout=2)[0] == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not healthy after {timeout:g} s: see {log_name}")
        time.sleep(0.1)


@contextlib.contextmanager
def _paced_engine(token_gap_ms: float, slots: int, work: Path) -> Iterator[tuple[str, str]]:
    """bench/paced_engine.py in its own process; yields its URL and its Unix socket."""
    port = free_port()
    socket = local_socket(ENGINE_SOCKET, port)
    log = (work / "paced-engine.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.paced_engine", "--port", str(port), "--unix", socket,
         "--token-gap-ms", f"{token_gap_ms:g}", "--slots", str(slots)],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        cwd=Path(__file__).resolve().parent.parent)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(process, url, "paced engine", log.name, 30)
        yield url, socket
    finally:
        process.terminate()
        process.wait(10)


@contextlib.contextmanager
def _reference_path(name: str, argv: list[str], port: int, work: Path
                    ) -> Iterator[tuple[str, Callable[[], float]]]:
    """A reference path's process, listening on 127.0.0.1:<port>; yields its URL and CPU."""
    log = (work / f"{name.replace(' ', '-')}.log").open("wb")
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, start_new_session=True,
                               cwd=Path(__file__).resolve().parent.parent)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(process, url, name, log.name, 60)
        yield url, lambda: cpu_seconds(process.pid)
    finally:
        stop(process)
        log.close()


def _vllm_router(binary: str, engine_url: str, work: Path
                 ) -> contextlib.AbstractContextManager[tuple[str, Callable[[], float]]]:
    port = free_port()
    return _reference_path(ROUTER, [
        binary, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", engine_url,
        "--policy", "round_robin", "--log-level", "warning",
        # llama-server closes a keep-alive connection after each streamed answer; the
        # router counts those as worker failures and, at 32 streams, opens its breaker.
        "--disable-circuit-breaker"], port, work)


def _byte_relay(engine_url: str, work: Path
                ) -> contextlib.AbstractContextManager[tuple[str, Callable[[], float]]]:
    port = free_port()
    return _reference_path(FLOOR, [
        sys.executable, "-m", "bench.byte_relay", "--port", str(port),
        "--to", engine_url.removeprefix("http://")], port, work)



def _peak_rss_mib(gateway: GatewayProcess) -> float:
    for line in Path(f"/proc/{gateway.process.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return gateway.rss_bytes() / 2**20


def misses(result: dict[str, object]) -> list[str]:
    """The targets a result misses, in words."""
    out = []
    for row in result["rows"]:  # type: ignore[attr-defined]
        if (row["path"] in (ROUTER, FLOOR) or row["path"].startswith("baseline")
                or row["path"].endswith(" tcp")):
            continue  # reference columns, not the gateway as pods run it
        where = f"{row['mode']} c={row['concurrency']} ({row['path']})"
        if row["ratio"] < TARGET_RATIO[row["mode"]]:
            out.append(f"{where}: ratio {row['ratio']} < {TARGET_RATIO[row['mode']]}")
        added = TARGET_ADDED_MS[row["mode"]]
        if row["concurrency"] == 1 and row["added_ms"] > added:
            out.append(f"{where}: added {row['added_ms']} ms > {added} ms")
    rss = result["gateway_peak_rss_mib"]
    if rss >= TARGET_RSS_MIB:  # type: ignore[operator]
        out.append(f"gateway RSS {rss} MiB >= {TARGET_RSS_MIB} MiB")
    return out


@pytest.mark.bench
def test_gateway_overhead(tmp_path: Path) -> None:
    result = run_benchmark(work_dir=tmp_path)
    (tmp_path / "gateway.json").write_text(json.dumps(result, indent=2))
    assert result["gateway_peak_rss_mib"] < TARGET_RSS_MIB  # type: ignore[operator]
    missed = misses(result)
    assert not missed, "; ".join(missed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", default="1,8,32")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--engine-threads", type=int, default=1)
    parser.add_argument("--event-loops", default="auto",
                        help="comma-separated gateway event loops to compare (auto, uvloop, "
                             "asyncio), one gateway each, measured in the same rounds")
    parser.add_argument("--baseline", metavar="GIT_REF[,GIT_REF]", default="",
                        help="also run a gateway with the code of each git revision")
    parser.add_argument("--router", choices=("auto", "off"), default="auto",
                        help=f"auto: add {ROUTER} as a reference column when installed")
    parser.add_argument("--engine", choices=("llama", "paced"), default="llama",
                        help="llama: the pinned llama-server on a tiny model; paced: "
                             "bench/paced_engine.py, a chunk every --token-gap-ms at almost "
                             "no CPU, so a path's own cost is not hidden by the engine's")
    parser.add_argument("--token-gap-ms", type=float, default=2.0)
    parser.add_argument("--engine-hops", default="socket",
                        help="socket: gateways send answers over the engine's Unix socket, as "
                             "rendered pods do; socket,tcp: also one gateway per event loop "
                             "over TCP, to measure the difference")
    parser.add_argument("--floor", action="store_true",
                        help="also run bench/byte_relay.py, a relay that only copies bytes: "
                             "the floor of CPU per token for any relay in Python on uvloop")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if not set(args.engine_hops.split(",")) <= {"socket", "tcp"}:
        parser.error(f"--engine-hops takes socket and tcp, got {args.engine_hops!r}")
    result = run_benchmark(tuple(int(x) for x in args.levels.split(",")), args.tokens,
                           args.rounds, args.engine_threads,
                           event_loops=tuple(args.event_loops.split(",")),
                           baselines=tuple(filter(None, args.baseline.split(","))),
                           router=args.router == "auto", engine_kind=args.engine,
                           token_gap_ms=args.token_gap_ms,
                           engine_hops=tuple(args.engine_hops.split(",")),
                           floor=args.floor)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    missed = misses(result)
    for line in missed:
        print(f"MISSED: {line}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
