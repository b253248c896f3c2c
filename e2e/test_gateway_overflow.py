"""Long-context overflow between two real llama-servers: a prompt too long for the main
pool's 512-token context is answered by the long-context pool (8192 tokens), through its own
gateway, with the client's key; nothing is truncated."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from e2e.gateway_process import GatewayProcess
from e2e.llama import LlamaServer, llama_server_binary
from e2e.models import TinyLlamaSpec, prompt_of_tokens, write_tiny_llama
from e2e.test_gateway import metric_value, wait_metric

pytestmark = pytest.mark.llama

KEY = "sk-overflow"


@pytest.fixture(scope="module")
def pools(tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[GatewayProcess, GatewayProcess, LlamaServer, LlamaServer]]:
    binary = llama_server_binary()
    root = tmp_path_factory.mktemp("overflow")
    model = write_tiny_llama(root / "tiny.gguf", TinyLlamaSpec(n_ctx_train=16384))
    keys = root / "keys"
    keys.mkdir()
    (keys / "k").write_text(KEY)
    common = ["-m", str(model), "-np", "1", "--metrics", "-t", "1"]
    with LlamaServer.start([str(binary), *common, "-c", "512"], root) as small, \
            LlamaServer.start([str(binary), *common, "-c", "8192"], root) as large, \
            GatewayProcess.start(large.url, root, ["--pool", "long-context", "--api-keys",
                                                   str(keys), "--model-version", "v1"],
                                 service_name="glm") as long_gw, \
            GatewayProcess.start(small.url, root, ["--pool", "main", "--api-keys", str(keys),
                                                   "--model-version", "v1",
                                                   "--long-context-url", long_gw.url],
                                 service_name="glm") as main_gw:
        yield main_gw, long_gw, small, large


def test_long_prompt_goes_to_the_long_context_pool(
    pools: tuple[GatewayProcess, GatewayProcess, LlamaServer, LlamaServer],
) -> None:
    main_gw, long_gw, small, large = pools
    client = openai.OpenAI(base_url=main_gw.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    # ignore_eos: the random-weight model may pick its end token early, and the engine
    # counters below expect exactly 4 generated tokens.
    short = client.chat.completions.create(model="glm", messages=[{"role": "user",
                                                                    "content": "hi"}],
                                           max_tokens=4, extra_body={"ignore_eos": True})
    assert short.usage is not None and short.usage.completion_tokens == 4
    long_prompt = prompt_of_tokens(2000)
    reply = client.chat.completions.create(
        model="glm", messages=[{"role": "user", "content": long_prompt}], max_tokens=8,
        extra_body={"ignore_eos": True},
    )
    assert reply.usage is not None
    assert reply.usage.prompt_tokens > 2000  # the whole prompt: not truncated to 512
    assert reply.usage.completion_tokens == 8
    chunks = list(client.chat.completions.create(
        model="glm", messages=[{"role": "user", "content": long_prompt}], max_tokens=8,
        stream=True, extra_body={"ignore_eos": True},
    ))
    assert chunks[-1].choices[0].finish_reason == "length"

    # The last line is counted just after the client has its [DONE].
    wait_metric(main_gw, "glm_gateway_requests_total", 3, code="200", pool="main")
    main_metrics, long_metrics = main_gw.metrics_text(), long_gw.metrics_text()
    assert metric_value(main_metrics, "glm_gateway_overflow_total", outcome="routed") == 2
    assert metric_value(long_metrics, "glm_gateway_requests_total", code="200",
                        pool="long-context") == 2
    assert metric_value(main_metrics, "glm_gateway_requests_total", code="200",
                        pool="main") == 3
    # Each engine saw what it should: the large one generated both long answers (its
    # prompt cache serves the second prompt), the small one only the short answer; each
    # also made the 1 token of its gateway's warm-up.
    assert large.metric("llamacpp:tokens_predicted_total") == 1 + 16
    assert (large.metric("llamacpp:prompt_tokens_total") or 0) > 2000
    assert small.metric("llamacpp:tokens_predicted_total") == 1 + 4


def test_too_long_even_for_the_long_pool_is_a_clear_400(
    pools: tuple[GatewayProcess, GatewayProcess, LlamaServer, LlamaServer],
) -> None:
    main_gw, _, _, _ = pools
    client = openai.OpenAI(base_url=main_gw.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="glm", messages=[{"role": "user", "content": prompt_of_tokens(9000)}],
            max_tokens=4,
        )
    body = refused.value.body
    assert body["code"] == "context_length_exceeded"  # type: ignore[index]
    assert "8192" in body["message"]  # type: ignore[index]


def test_wrong_key_is_refused_before_any_overflow(
    pools: tuple[GatewayProcess, GatewayProcess, LlamaServer, LlamaServer],
) -> None:
    main_gw, _, _, _ = pools
    client = openai.OpenAI(base_url=main_gw.url + "/v1", api_key="sk-bad", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(
            model="glm", messages=[{"role": "user", "content": prompt_of_tokens(2000)}])
