"""The gateway's arguments are written from its own table of flags (gateway/flags.py), and
every one the renderer writes parses back, through the gateway's own parser, to the value
the renderer meant."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from glm_operator.gateway import config as gateway_config
from glm_operator.gateway import flags as gateway_flags
from glm_operator.render import pod
from glm_operator.render.service import ServiceInputs, render_service

from render.cases import GOLDEN_SPECS, golden_inputs, inputs, model_version, service

STORE = {"redis": {"address": "redis.cache.svc:6379", "tls": False},
         "onUnavailable": "Allow", "timeout": "80ms"}
EXTRA: dict[str, ServiceInputs] = {
    # llama.cpp with a long-context pool, tokens and a shared store; no keys
    "llamacpp-store": inputs(service(
        "llamacpp", "a10", longContext={"enabled": True, "contextLength": 65536},
        gateway={"access": "Open",
                 "rateLimit": {"requestsPerMinute": 100, "tokensPerMinute": 50000,
                               "store": STORE}}), model_version("gguf")),
}
CASES: dict[str, ServiceInputs] = {
    **{f"{engine}-{accelerator}": golden_inputs(engine, accelerator)
       for engine, accelerator in GOLDEN_SPECS},
    **EXTRA,
}


def rendered_flags(monkeypatch: pytest.MonkeyPatch, case: ServiceInputs
                   ) -> list[tuple[dict[str, Any], list[str]]]:
    """(the values the renderer meant, the arguments it wrote) for every gateway it renders."""
    meant: list[dict[str, Any]] = []
    values_of = pod.gateway_flag_values

    def recording(ctx: pod.PoolContext) -> dict[str, Any]:
        meant.append(values := values_of(ctx))
        return values

    monkeypatch.setattr(pod, "gateway_flag_values", recording)
    written = [c["args"] for o in render_service(case) if o["kind"] == "Deployment"
               for c in o["spec"]["template"]["spec"]["containers"] if c["name"] == "gateway"]
    assert len(meant) == len(written) > 0
    return list(zip(meant, written, strict=True))


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_written_flag_parses_back_to_its_value(monkeypatch: pytest.MonkeyPatch,
                                                     name: str) -> None:
    parser = argparse.ArgumentParser()
    gateway_config.add_arguments(parser)
    for meant, args in rendered_flags(monkeypatch, CASES[name]):
        assert args[0] == "gateway"
        parsed = parser.parse_args(args[1:])
        gateway_config.from_args(parsed)  # a configuration the gateway accepts
        for dest, value in meant.items():
            flag = gateway_flags.BY_DEST[dest]
            got = getattr(parsed, dest)
            if flag.kind == "repeated":
                assert (got or []) == value, dest
            elif value is None:
                assert got == flag.default or flag.default_from is not None, dest
            elif isinstance(value, float):
                assert got == pytest.approx(value, rel=1e-5), dest  # written with 6 digits
            else:
                assert got == value and isinstance(got, flag.value_type), dest


def test_the_renderer_writes_only_the_tables_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    names = {flag.name for flag in gateway_flags.FLAGS}
    seen: set[str] = set()
    for case in CASES.values():
        for _, args in rendered_flags(monkeypatch, case):
            seen |= {a for a in args if a.startswith("--")}
    assert seen <= names
    # the cases cover keys, limits, the store, the long-context pool and the stops
    assert {"--api-keys", "--rate-limit-rps", "--rate-limit-tokens-per-minute",
            "--rate-limit-redis", "--rate-limit-redis-tls", "--rate-limit-store-timeout",
            "--long-context-url", "--long-context-deployment", "--wake-timeout",
            "--activity-lease", "--engine-socket", "--stop", "--audit-include-text"} <= seen


def test_a_flag_is_written_as_the_gateway_reads_it() -> None:
    by = gateway_flags.BY_DEST
    assert by["rate_limit_rps"].write(10 / 6) == ["--rate-limit-rps", "1.66667"]
    assert by["wake_timeout"].write(1200) == ["--wake-timeout", "1200"]
    assert by["rate_limit_redis_tls"].write(False) == []
    assert by["warmup"].write(False) == ["--no-warmup"] and by["warmup"].write(True) == []
    assert by["stop"].write(["a", "b"]) == ["--stop", "a", "--stop", "b"]
    assert by["engine_socket"].write(None) == []
    assert by["warmup"].env == "GLM_GATEWAY_WARMUP"
    assert by["rate_limit_store_unavailable"].env == "GLM_GATEWAY_RATE_LIMIT_STORE_UNAVAILABLE"


def test_the_table_imports_nothing_of_the_gateways_runtime() -> None:
    """render/pod.py imports the table: it must not pull the relay, asyncio or aiohttp."""
    import subprocess
    import sys

    probe = ("import sys, glm_operator.render.pod;"
             "print(sorted(m for m in sys.modules if m in ('asyncio', 'aiohttp', 'httptools')"
             " or m.startswith('glm_operator.gateway.') and m != 'glm_operator.gateway.flags'"
             " and m != 'glm_operator.gateway.metrics'))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"
