"""An engine whose request handling is the pinned vLLM's own, up to where it would generate.

Executed by the Python of the pinned vLLM's venv (e2e/vllm_cli.py), never imported by the
tests:

    python e2e/vllm_request_check.py --port P --served-model-name NAME

Each POST to /v1/chat/completions or /v1/completions is parsed by vLLM's own request models
(`ChatCompletionRequest`, `CompletionRequest`) and checked by vLLM's own `_check_model`
(`BaseServing`, over the `OpenAIModelRegistry` of `--served-model-name`, the registry vLLM
builds for CPU-only contexts): a name vLLM does not serve gets vLLM's own 404 error body, a
body its models refuse a 400; an accepted request gets a one-word answer naming the model as
vLLM would. Every body received is appended to --log as a JSON line, for the test to read.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from aiohttp import web
from pydantic import ValidationError
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.entrypoints.openai.models.protocol import BaseModelPath
from vllm.entrypoints.openai.models.serving import OpenAIModelRegistry
from vllm.entrypoints.serve.engine.serving import BaseServing


def serving(served_name: str) -> BaseServing:
    registry = OpenAIModelRegistry(
        model_config=None,  # type: ignore[arg-type]  # not read by the name check
        base_model_paths=[BaseModelPath(name=served_name, model_path="/models/model")])
    return BaseServing(models=registry, model_config=None)  # type: ignore[arg-type]


def app(served_name: str, log_path: str) -> web.Application:
    checker = serving(served_name)
    models: dict[str, Any] = {"/v1/chat/completions": ChatCompletionRequest,
                              "/v1/completions": CompletionRequest}

    async def answer(request: web.Request) -> web.Response:
        raw = await request.read()
        with open(log_path, "a") as log:
            log.write(json.dumps({"path": request.path, "body": raw.decode()}) + "\n")
        try:
            parsed = models[request.path].model_validate_json(raw)
        except ValidationError as exc:
            return web.json_response({"error": {"message": str(exc), "code": 400}}, status=400)
        error = await checker._check_model(parsed)
        if error is not None:
            return web.json_response(error.model_dump(), status=error.error.code)
        content = {"role": "assistant", "content": "fine"}
        choice = ({"index": 0, "message": content, "finish_reason": "stop"}
                  if request.path.endswith("chat/completions")
                  else {"index": 0, "text": "fine", "finish_reason": "stop"})
        return web.json_response({"object": "chat.completion", "model": parsed.model,
                                  "choices": [choice],
                                  "usage": {"prompt_tokens": 3, "completion_tokens": 1}})

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="")

    application = web.Application()
    application.router.add_get("/health", health)
    application.router.add_post("/v1/chat/completions", answer)
    application.router.add_post("/v1/completions", answer)
    return application


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--served-model-name", required=True)
    parser.add_argument("--log", required=True)
    args = parser.parse_args()
    web.run_app(app(args.served_model_name, args.log), host="127.0.0.1", port=args.port,
                print=None, access_log=None)


if __name__ == "__main__":
    main()
