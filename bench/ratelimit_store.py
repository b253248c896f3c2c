"""What the shared rate-limit store costs a request: per-pod limits and Redis limits, side by side.

    python -m bench.ratelimit_store [--levels 1,8] [--tokens 4] [--rounds 4] [--json out.json]
    pytest bench/ratelimit_store.py -m bench -s

One llama-server (the pinned build, a tiny random-weight model) and two gateway processes in
front of it with the same request and token limits, set so high that nothing is refused:
one counts in its own buckets (no store), the other in a real redis-server on loopback
(`--rate-limit-redis`), so every request pays the admit script and the charge script. The
same non-streaming load runs through each, alternately, `rounds` times, so a drift in
machine load hits both alike. Few generated tokens per request, so the store's share of a
request is as large as it gets.

Reported per concurrency: p50 latency through each gateway and the difference (the store's
added latency per request), throughput ratio (store / no store) and each gateway's CPU per
request. Target: added p50 <= 1 ms at one client (two loopback round trips).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest
from glm_operator.gateway.flags import REDIS_PASSWORD_ENV

from bench.gateway import Sample, _load
from e2e.gateway_process import GatewayProcess
from e2e.llama import LlamaServer, llama_server_binary
from e2e.models import TinyLlamaSpec, write_tiny_llama
from e2e.redis import RedisServer

TARGET_ADDED_MS = 1.0
KEY = "sk-bench"
# Limits no load here reaches: every request is admitted and charged, none refused.
LIMITS = ["--rate-limit-rps", "100000", "--rate-limit-burst", "1000000",
          "--rate-limit-tokens-per-minute", "1000000000"]


@dataclass
class Row:
    concurrency: int
    local_p50_ms: float
    store_p50_ms: float
    added_ms: float
    local_rps: float
    store_rps: float
    ratio: float
    local_cpu_ms_per_request: float
    store_cpu_ms_per_request: float


def run_benchmark(levels: tuple[int, ...] = (1, 8), tokens: int = 4, rounds: int = 4,
                  work_dir: Path | None = None) -> dict[str, object]:
    work = work_dir or Path(tempfile.mkdtemp(prefix="glm-bench-store-"))
    model = write_tiny_llama(work / "tiny.gguf", TinyLlamaSpec(n_ctx_train=65536))
    keys = work / "keys"
    keys.mkdir(exist_ok=True)
    (keys / "bench").write_text(KEY)
    max_level = max(levels)
    rows: list[Row] = []
    with contextlib.ExitStack() as stack:
        store = stack.enter_context(RedisServer(password="bench"))
        engine = stack.enter_context(LlamaServer.start(
            [str(llama_server_binary()), "-m", str(model), "-c", str(256 * max_level),
             "-np", str(max_level), "-t", "1"], work))
        common = ["--api-keys", str(keys), "--engine-slots", str(max_level), *LIMITS]
        gateways = {
            "local": stack.enter_context(GatewayProcess.start(
                engine.url, work / "local", common, service_name="bench")),
            "store": stack.enter_context(GatewayProcess.start(
                engine.url, work / "store",
                [*common, "--rate-limit-redis", store.address, "--namespace", "bench"],
                service_name="bench", env={REDIS_PASSWORD_ENV: "bench"})),
        }
        for level in levels:
            requests = max(100, level * 25)
            samples: dict[str, list[Sample]] = {name: [] for name in gateways}
            cpu = dict.fromkeys(gateways, 0.0)
            for _ in range(rounds):
                for name, gateway in gateways.items():
                    before = gateway.cpu_seconds()
                    samples[name].append(asyncio.run(
                        _load(gateway.url, level, False, tokens, requests, KEY)))
                    cpu[name] += gateway.cpu_seconds() - before
            p50 = {n: statistics.median(s.p50_ms for s in v) for n, v in samples.items()}
            rps = {n: statistics.mean(s.tokens_per_second for s in v) / tokens
                   for n, v in samples.items()}
            cpu_ms = {n: cpu[n] * 1000 / (rounds * (requests + 1)) for n in gateways}
            row = Row(level, round(p50["local"], 2), round(p50["store"], 2),
                      round(p50["store"] - p50["local"], 2), round(rps["local"], 1),
                      round(rps["store"], 1), round(rps["store"] / rps["local"], 3),
                      round(cpu_ms["local"], 2), round(cpu_ms["store"], 2))
            rows.append(row)
            print(f"c={level:<3} p50 {row.local_p50_ms:6.2f} -> {row.store_p50_ms:6.2f} ms "
                  f"({row.added_ms:+.2f})  req/s {row.local_rps:7.1f} -> {row.store_rps:7.1f} "
                  f"(ratio {row.ratio:.3f})  gateway CPU {row.local_cpu_ms_per_request:.2f} -> "
                  f"{row.store_cpu_ms_per_request:.2f} ms/request", flush=True)
        stored = gateways["store"].metrics_text()
        assert "glm_gateway_rate_limit_store_up{" in stored  # the store was in use
    return {"tokens": tokens, "rounds": rounds, "rows": [asdict(r) for r in rows]}


def misses(result: dict[str, object]) -> list[str]:
    out = []
    for row in result["rows"]:  # type: ignore[attr-defined]
        if row["concurrency"] == 1 and row["added_ms"] > TARGET_ADDED_MS:
            out.append(f"c=1: the store adds {row['added_ms']} ms > {TARGET_ADDED_MS} ms")
    return out


@pytest.mark.bench
def test_rate_limit_store_overhead(tmp_path: Path) -> None:
    result = run_benchmark(work_dir=tmp_path)
    (tmp_path / "ratelimit_store.json").write_text(json.dumps(result, indent=2))
    missed = misses(result)
    assert not missed, "; ".join(missed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ratelimit_store", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", default="1,8")
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    result = run_benchmark(tuple(int(x) for x in args.levels.split(",")), args.tokens,
                           args.rounds)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    missed = misses(result)
    for line in missed:
        print(f"MISSED: {line}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
