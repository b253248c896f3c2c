"""The gateway's KV-cache gauge against the real llama-server: it rises with concurrent long
generations, by the tokens they hold, and falls back to 0 when they end."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from glm_operator.gateway.metrics import KV_CACHE_USAGE_RATIO

from e2e.gateway_process import GatewayProcess
from e2e.llama import LlamaServer, llama_server_binary
from e2e.models import TinyLlamaSpec, prompt_of_tokens, write_tiny_llama
from e2e.test_gateway import metric_value

pytestmark = pytest.mark.llama

SLOTS = 2
CTX = 8192  # 2 slots of 4096 tokens
PROMPT_TOKENS = 2200  # two prompts fill more than half the cache, one cannot
MAX_TOKENS = 1500  # prompt + answer stay within a 4096-token slot
POLL_SECONDS = 0.2


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    model = write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny.gguf",
                             TinyLlamaSpec(n_ctx_train=65536))
    argv = [str(llama_server_binary()), "-m", str(model), "-c", str(CTX), "-np", str(SLOTS),
            "--metrics", "-t", "1"]
    with LlamaServer.start(argv, tmp_path_factory.mktemp("engine")) as server:
        yield server


def kv_ratio(gateway: GatewayProcess) -> float | None:
    text = gateway.metrics_text()
    if f"{KV_CACHE_USAGE_RATIO}{{" not in text:
        return None
    return metric_value(text, KV_CACHE_USAGE_RATIO, service="glm-test")


def wait_until(what: str, ok: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < deadline, f"{what} not seen within {timeout:g} s"
        time.sleep(0.05)


@contextlib.contextmanager
def generations(gateway: GatewayProcess, count: int) -> Iterator[None]:
    """`count` concurrent streamed generations with long prompts, cut when the block ends."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def generate(index: int) -> None:
        body = {"model": "glm-test", "stream": True, "max_tokens": MAX_TOKENS,
                "ignore_eos": True,
                "messages": [{"role": "user",
                              "content": f"{index} " + prompt_of_tokens(PROMPT_TOKENS)}]}
        try:
            with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body,
                              timeout=120) as response:
                assert response.status_code == 200
                for _ in response.iter_bytes():
                    if stop.is_set():
                        return  # closing the stream frees the slot
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=generate, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert not errors, errors


def test_kv_cache_gauge_follows_concurrent_generations(engine: LlamaServer,
                                                       tmp_path: Path) -> None:
    with GatewayProcess.start(engine.url, tmp_path / "gw",
                              ["--model-version", "v1",
                               "--kv-cache-poll-seconds", str(POLL_SECONDS)]) as gw:
        # Idle: the first reading is 0 (llama-server's idle slots hold nothing for a request).
        wait_until("a first reading", lambda: kv_ratio(gw) is not None, 10)
        assert kv_ratio(gw) == 0.0
        seen: list[float] = []

        def at_least(share: float) -> Callable[[], bool]:
            def check() -> bool:
                seen.append(kv_ratio(gw) or 0.0)
                return seen[-1] >= share
            return check

        # One request holds its prompt and what it has generated, in one slot of two: less
        # than half the cache (a "busy slots" figure would read 0.5 here).
        with generations(gw, 1):
            wait_until("one request's prompt", at_least(PROMPT_TOKENS / CTX), 60)
        assert max(seen) < 0.5, seen
        wait_until("the gauge back to 0 after one", lambda: kv_ratio(gw) == 0.0, 15)

        # Two hold both prompts: more than one request ever can.
        seen.clear()
        with generations(gw, SLOTS):
            wait_until("both requests' prompts", at_least(SLOTS * PROMPT_TOKENS / CTX), 60)
        assert 0.5 < seen[-1] <= 1.0, seen
        # The requests ended: back to 0, though the slots keep their prompts cached.
        wait_until("the gauge back to 0", lambda: kv_ratio(gw) == 0.0, 15)
