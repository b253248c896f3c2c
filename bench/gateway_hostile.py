"""The gateway's memory under hostile clients, and whether it comes back when they leave.

    python -m bench.gateway_hostile [--connections 1000] [--baseline REF[,REF]]
                                    [--attacks a,b,...] [--hold 5] [--json out.json]

One gateway as rendered (API keys on, its default caps) in front of bench/paced_engine.py,
and, with `--baseline`, one more per git revision running that revision's code, attacked
one after the other in the same run. Each attack opens `connections` connections at once
from one client process, does its harm, holds them `hold` seconds, then closes them all.
Recorded per attack and gateway: RSS before, its peak while attacked (sampled every 50 ms),
RSS 3 s after the clients left, the slowest /healthz answer while attacked (an event loop
that copies buffers stalls), and what the attackers were answered.

Attacks:
- header-line: a header line that never ends, 1 MiB each in 16 KiB writes;
- unauth-body: POST /v1/chat/completions without a key, Expect: 100-continue,
  Content-Length 1 MiB, all but the last byte sent;
- slowloris: a request head one byte every 0.5 s, never finished;
- authed-partial: as unauth-body, with a valid key (what the buffered-bytes cap is for);
- idle: connections opened and left silent (the connection cap);
- pipelined-unread: cheap GETs (/metrics, /healthz) pipelined as fast as the gateway takes
  them, the answers never read (the answer queue must wait for the client);
- tiny-chunks: with a valid key, a chunked body of 2-byte chunks, never finished (memory per
  byte the buffered-bytes cap counts);
- squat: with a valid key, heads announcing bodies of 1 MiB and 16 KiB, then one byte every
  10 s (a reservation of the buffered-bytes cap held by bytes never sent).
The last three open at most PER_ATTACK_CONNECTIONS connections: each needs few to do harm.
Every attack also records what one other client's POST with a 64 KiB body is answered while
the attack holds (`victim`): the harm a squat does is to others, not to memory.

The container limit the operator renders for the gateway is 512 MiB: each attack's peak must
stay under it, and RSS after must come back near its baseline (no growth per wave).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.baseline import export_operator
from bench.gateway import _paced_engine
from e2e.gateway_process import GatewayProcess

KEY = "sk-bench"
BODY_BYTES = 1 << 20
ATTACKS = ("header-line", "unauth-body", "slowloris", "authed-partial", "idle",
           "pipelined-unread", "tiny-chunks", "squat")
# What each squatter announces: 63 of them leave the 64 MiB cap less room than the other
# client's body (VICTIM_CONTENT_BYTES) needs, as an attacker who knows the cap would choose.
SQUAT_BYTES = BODY_BYTES + 16384
VICTIM_CONTENT_BYTES = 65536  # a prompt of some 16 k tokens
# The attacks that need only a few connections (squat: 80 announced MiB pass the 64 MiB cap).
PER_ATTACK_CONNECTIONS = {"pipelined-unread": 3, "tiny-chunks": 5, "squat": 80}
CONTAINER_LIMIT_MIB = 512


@dataclass
class Result:
    gateway: str
    attack: str
    connections: int
    rss_before_mib: float
    rss_peak_mib: float
    rss_after_mib: float
    healthz_max_ms: float
    answers: dict[str, int]  # status line (or "closed"/"reset"/"none") -> connections
    victim: str  # another client's small POST while the attack held: its status line


Attack = Callable[[asyncio.StreamReader, asyncio.StreamWriter, asyncio.Event], Awaitable[None]]


async def _header_line(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       stop: asyncio.Event) -> None:
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: gw\r\nX-Long: ")
    piece = b"a" * 16384
    for _ in range(BODY_BYTES // len(piece)):
        if stop.is_set():
            return
        writer.write(piece)
        await writer.drain()


async def _partial_body(writer: asyncio.StreamWriter, stop: asyncio.Event, key: bool) -> None:
    auth = f"Authorization: Bearer {KEY}\r\n".encode() if key else b""
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n" + auth +
                 b"Content-Type: application/json\r\nExpect: 100-continue\r\n"
                 b"Content-Length: %d\r\n\r\n" % BODY_BYTES)
    await writer.drain()
    piece = b" " * 65536
    left = BODY_BYTES - 1
    while left > 0 and not stop.is_set():
        writer.write(piece[:left])
        left -= min(left, len(piece))
        await writer.drain()


async def _unauth_body(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       stop: asyncio.Event) -> None:
    await _partial_body(writer, stop, key=False)


async def _authed_partial(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                          stop: asyncio.Event) -> None:
    await _partial_body(writer, stop, key=True)


async def _slowloris(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     stop: asyncio.Event) -> None:
    for byte in b"GET /healthz HTTP/1.1\r\nHost: gw\r\nX-Slow: " + b"s" * 10_000:
        if stop.is_set():
            return
        writer.write(bytes([byte]))
        await writer.drain()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)


async def _idle(_reader: asyncio.StreamReader, _writer: asyncio.StreamWriter,
                stop: asyncio.Event) -> None:
    await stop.wait()


async def _pipelined_unread(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                            stop: asyncio.Event) -> None:
    requests = (b"GET /metrics HTTP/1.1\r\nHost: gw\r\n\r\n"
                b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n") * 64
    sent = 0
    while sent < 100 * BODY_BYTES and not stop.is_set():
        writer.write(requests)
        sent += len(requests)
        await writer.drain()  # waits only while the gateway stops reading


async def _tiny_chunks(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       stop: asyncio.Event) -> None:
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
                 b"Authorization: Bearer " + KEY.encode() + b"\r\n"
                 b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    piece = b"2\r\n  \r\n" * 8192  # 16 KiB of payload in 2-byte chunks
    for _ in range(BODY_BYTES // 16384):
        if stop.is_set():
            return
        writer.write(piece)
        await writer.drain()


async def _squat(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 stop: asyncio.Event) -> None:
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
                 b"Authorization: Bearer " + KEY.encode() + b"\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n{"
                 % SQUAT_BYTES)
    await writer.drain()
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 10)
        if not stop.is_set():
            writer.write(b" ")
            await writer.drain()


ATTACK_FUNCTIONS: dict[str, Attack] = {
    "header-line": _header_line, "unauth-body": _unauth_body, "slowloris": _slowloris,
    "authed-partial": _authed_partial, "idle": _idle, "pipelined-unread": _pipelined_unread,
    "tiny-chunks": _tiny_chunks, "squat": _squat}


async def _first_line(reader: asyncio.StreamReader) -> str:
    """What the gateway answered on a connection, by the end of the attack."""
    try:
        line = await asyncio.wait_for(reader.readline(), 0.01)
    except TimeoutError:
        return "none"
    except (ConnectionError, OSError):
        return "reset"
    if not line:
        return "closed"
    if line.startswith(b"HTTP/1.1 100"):  # a 100 Continue: the answer after it counts
        await reader.readline()
        return await _first_line(reader)
    return line.decode("latin-1").strip()


async def _attack(port: int, attack: Attack, connections: int, hold: float) -> dict[str, int]:
    stop = asyncio.Event()
    opened: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def one() -> None:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 16)
        except OSError:
            return
        opened.append((reader, writer))
        with contextlib.suppress(ConnectionError, OSError):
            await attack(reader, writer, stop)

    tasks = [asyncio.create_task(one()) for _ in range(connections)]
    await asyncio.sleep(hold)
    stop.set()
    answers: dict[str, int] = {}
    for reader, _ in opened:
        line = await _first_line(reader)
        answers[line] = answers.get(line, 0) + 1
    answers["refused"] = connections - len(opened)
    for task in tasks:
        task.cancel()
    for _, writer in opened:
        writer.transport.abort()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {k: v for k, v in answers.items() if v}


def _victim(port: int) -> str:
    """One other client's POST with a 64 KiB body and a valid key: its status line."""
    message = {"role": "user", "content": "h" * VICTIM_CONTENT_BYTES}
    body = json.dumps({"model": "bench", "max_tokens": 1, "messages": [message]}).encode()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
                         b"Authorization: Bearer " + KEY.encode() + b"\r\nConnection: close"
                         b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                         % len(body) + body)
            line = sock.makefile("rb").readline()
    except OSError as exc:
        return type(exc).__name__
    return line.decode("latin-1").strip() or "closed"


def _healthz_ms(port: int) -> float:
    started = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
            while sock.recv(65536):
                pass
    except OSError:
        return float("inf")
    return (time.perf_counter() - started) * 1000


def run_attack(name: str, gateway: GatewayProcess, attack: str, connections: int,
               hold: float) -> Result:
    time.sleep(1)
    before = gateway.rss_bytes()
    peak = before
    slowest = 0.0
    done = threading.Event()

    def watch() -> None:
        nonlocal peak, slowest
        last_probe = 0.0
        while not done.is_set():
            with contextlib.suppress(OSError, RuntimeError):
                peak = max(peak, gateway.rss_bytes())
            if time.monotonic() - last_probe > 0.5:
                last_probe = time.monotonic()
                slowest = max(slowest, _healthz_ms(gateway.port))
            time.sleep(0.05)

    victim = "none"

    def harm_others() -> None:
        nonlocal victim
        time.sleep(hold / 2)  # the attack in place
        victim = _victim(gateway.port)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    other = threading.Thread(target=harm_others, daemon=True)
    other.start()
    connections = min(connections, PER_ATTACK_CONNECTIONS.get(attack, connections))
    answers = asyncio.run(_attack(gateway.port, ATTACK_FUNCTIONS[attack], connections, hold))
    other.join()
    done.set()
    watcher.join()
    time.sleep(3)
    after = gateway.rss_bytes()
    mib = 1 << 20
    return Result(name, attack, connections, before / mib, peak / mib, after / mib, slowest,
                  answers, victim)


def run(connections: int, attacks: tuple[str, ...], hold: float,
        baselines: tuple[str, ...], work: Path) -> list[Result]:
    keys = work / "keys"
    keys.mkdir(exist_ok=True)
    (keys / "bench").write_text(KEY)
    results: list[Result] = []
    with contextlib.ExitStack() as stack:
        engine_url, _ = stack.enter_context(_paced_engine(2.0, 8, work))
        args = ["--api-keys", str(keys), "--kv-cache-poll-seconds", "0"]
        gateways = {"gateway": stack.enter_context(GatewayProcess.start(
            engine_url, work / "current", args, service_name="bench"))}
        for ref in baselines:
            source = export_operator(ref, work / "baseline" / ref)
            gateways[f"baseline {ref}"] = stack.enter_context(GatewayProcess.start(
                engine_url, work / "baseline" / ref, args, service_name="bench",
                env={"PYTHONPATH": str(source)}))
        for attack in attacks:
            for name, gateway in gateways.items():
                result = run_attack(name, gateway, attack, connections, hold)
                results.append(result)
                print(_row(result), flush=True)
    return results


def _row(r: Result) -> str:
    answers = ", ".join(f"{count} {line}" for line, count in sorted(r.answers.items()))
    return (f"{r.attack:15} {r.gateway:22} RSS {r.rss_before_mib:6.1f} -> peak "
            f"{r.rss_peak_mib:7.1f} -> after {r.rss_after_mib:6.1f} MiB   /healthz max "
            f"{r.healthz_max_ms:8.1f} ms   other client: {r.victim}   {answers}")


def summary(results: list[Result]) -> str:
    lines = ["", f"container limit {CONTAINER_LIMIT_MIB} MiB; peak / before, after / before:"]
    for r in results:
        lines.append(f"  {r.attack:15} {r.gateway:22} "
                     f"peak x{r.rss_peak_mib / r.rss_before_mib:5.2f}"
                     f"  after x{r.rss_after_mib / r.rss_before_mib:5.2f}"
                     f"  {'under' if r.rss_peak_mib < CONTAINER_LIMIT_MIB else 'OVER'} limit")
    peaks = [r.rss_peak_mib for r in results if r.gateway == "gateway"]
    if peaks:
        lines.append(f"  gateway: median peak {statistics.median(peaks):.1f} MiB, "
                     f"max {max(peaks):.1f} MiB")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--attacks", default=",".join(ATTACKS))
    parser.add_argument("--hold", type=float, default=5.0)
    parser.add_argument("--baseline", default="", help="git revisions to attack alike")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    attacks = tuple(a for a in args.attacks.split(",") if a)
    unknown = set(attacks) - set(ATTACKS)
    if unknown:
        parser.error(f"unknown attacks {sorted(unknown)}; choose from {ATTACKS}")
    work = Path(tempfile.mkdtemp(prefix="glm-bench-hostile-"))
    results = run(args.connections, attacks, args.hold,
                  tuple(r for r in args.baseline.split(",") if r), work)
    print(summary(results))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))


if __name__ == "__main__":
    main()
