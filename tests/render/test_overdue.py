"""When a running request counts as failing for the canary's judge: the gateway's overdue
bounds, rendered from the pool's longest generation and the rollout's TTFT gate."""

from __future__ import annotations

import argparse
import math
from typing import Any

from glm_operator.gateway import config as gateway_config
from glm_operator.render.pod import DEFAULT_FIRST_TOKEN_OVERDUE_SECONDS
from glm_operator.render.service import render_service

from render.cases import inputs, model_version, service


def gateway_config_of(svc: Any) -> gateway_config.GatewayConfig:
    deployment = next(o for o in render_service(inputs(svc, model_version("gguf")))
                      if o["kind"] == "Deployment")
    gateway = next(c for c in deployment["spec"]["template"]["spec"]["containers"]
                   if c["name"] == "gateway")
    parser = argparse.ArgumentParser()
    gateway_config.add_arguments(parser)
    return gateway_config.from_args(parser.parse_args(gateway["args"][1:]))


def test_a_request_is_overdue_past_the_longest_generation_a_stream_past_its_first_token_gate(
        ) -> None:
    plain = gateway_config_of(service("llamacpp", "a10", contextLength=2048))
    assert plain.request_overdue_seconds == math.ceil(2048 / 20)  # the decode floor
    assert plain.first_token_overdue_seconds == DEFAULT_FIRST_TOKEN_OVERDUE_SECONDS
    gated = gateway_config_of(service("llamacpp", "a10", contextLength=2048, rollout={
        "strategy": "canary", "analysis": {"maxTimeToFirstTokenP99Ms": 2500}}))
    assert gated.first_token_overdue_seconds == 2.5
    short = gateway_config_of(service("llamacpp", "a10", contextLength=512))
    assert short.request_overdue_seconds == math.ceil(512 / 20)
    # never above the whole bound
    assert short.first_token_overdue_seconds == short.request_overdue_seconds
