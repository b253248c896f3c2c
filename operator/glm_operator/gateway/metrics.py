"""The names and labels of the gateway's Prometheus metrics: a contract, since the HPA
(through prometheus-adapter) and the canary analysis query them; docs/gateway.md lists them.
Pure, so the operator imports it without the gateway's runtime; policy/metrics.py records
them.

Every series carries `service`, `model_version` and `pool`. The metric names below are the
ones to build queries from (a histogram's series add `_bucket`, `_sum`, `_count`).
"""

from __future__ import annotations

REQUESTS_TOTAL = "glm_gateway_requests_total"  # labels endpoint, code, outcome
REQUEST_DURATION = "glm_gateway_request_duration_seconds"  # histogram; endpoint, stream
TIME_TO_FIRST_TOKEN = "glm_gateway_time_to_first_token_seconds"  # histogram; endpoint
PROMPT_TOKENS_TOTAL = "glm_gateway_prompt_tokens_total"
COMPLETION_TOKENS_TOTAL = "glm_gateway_completion_tokens_total"
REQUESTS_IN_FLIGHT = "glm_gateway_requests_in_flight"
# Requests running longer than they may: no first token within --first-token-overdue, or
# longer than --request-overdue in all (both from the plan). A version that never answers
# shows here long before its requests end.
REQUESTS_OVERDUE = "glm_gateway_requests_overdue"
REQUESTS_QUEUED = "glm_gateway_requests_queued"
# The HTTP server's own refusals, which reach no handler (a 401 from the key check on the
# head, 503 too many connections / bytes held / shutting down, 408, 431, 400 bad framing):
# labels code and reason (wire/messages.py REFUSAL_REASONS). Not in REQUESTS_TOTAL: no
# version served them.
REFUSALS_TOTAL = "glm_gateway_refusals_total"
OVERFLOW_TOTAL = "glm_gateway_overflow_total"  # label outcome
LONG_CONTEXT_WAKES_TOTAL = "glm_gateway_long_context_wakes_total"
READY = "glm_gateway_ready"
# Share of the engine's KV cache in use, 0..1, the same name for every engine and accelerator.
KV_CACHE_USAGE_RATIO = "glm_gateway_kv_cache_usage_ratio"
# Only with a shared rate-limit store (gateway.rateLimit.store):
RATE_LIMIT_STORE_ERRORS_TOTAL = "glm_gateway_rate_limit_store_errors_total"  # label reason
RATE_LIMIT_STORE_UP = "glm_gateway_rate_limit_store_up"

BASE_LABELS = ("service", "model_version", "pool")
# How a request ended (policy/outcomes.py), the `outcome` label of REQUESTS_TOTAL.
REQUEST_OUTCOMES = ("completed", "client_error", "rate_limited", "server_error",
                    "engine_broken", "timed_out", "abandoned_before_first_token",
                    "abandoned_after_first_token")
# The outcomes that count against the version that served them (canary analysis): a client
# who gave up before the first token waited for nothing; one who left after tokens flowed,
# a client error or a 429 says nothing about the version.
FAILED_OUTCOMES = ("server_error", "engine_broken", "timed_out", "abandoned_before_first_token")
OVERFLOW_OUTCOMES = ("routed", "no_pool", "wake_timeout", "failed")
STORE_ERROR_REASONS = ("timeout", "connection", "error")
