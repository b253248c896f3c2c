"""An engine that fails the way engines fail in the field, for the canary's judge to catch.

    python -m e2e.misbehaving_engine --port P --mode good|hang|break|slow-long

It answers like llama-server's OpenAI endpoints (chat and completions, whole or streamed
with `data: [DONE]` last) and its `/health`, with one fault per mode:
- good: every answer after 20 ms (streams: five chunks 5 ms apart);
- hang: accepts every request and never answers (its `/health` stays 200, as a deadlocked
  server's can);
- break: a stream stops after two chunks and the connection is dropped (an engine killed or
  crashed mid-generation); whole answers are fine;
- slow-long: prompts over 200 characters take 3 s (a regression on long contexts only);
  short ones are as fast as good.
Real gateway processes stand in front of it (e2e/test_canary_judgement.py); nothing here
publishes metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from aiohttp import web

MODES = ("good", "hang", "break", "slow-long")
LONG_PROMPT_CHARS = 200
SLOW_SECONDS = 3.0


def _chunk(content: str, finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": {"content": content} if content else {},
              "finish_reason": finish}
    return b"data: " + json.dumps({"object": "chat.completion.chunk",
                                   "choices": [choice]}).encode() + b"\n\n"


class Engine:
    def __init__(self, mode: str) -> None:
        self.mode = mode

    def app(self) -> web.Application:
        app = web.Application(client_max_size=8 << 20)
        app.router.add_get("/health", self.health)
        app.router.add_post("/v1/chat/completions", self.answer)
        app.router.add_post("/v1/completions", self.answer)
        return app

    async def health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def answer(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if self.mode == "hang":
            await asyncio.Event().wait()  # never set: the request is held until it is dropped
        prompt = json.dumps(body.get("messages", body.get("prompt")))
        delay = SLOW_SECONDS if self.mode == "slow-long" and len(prompt) > LONG_PROMPT_CHARS \
            else 0.02
        await asyncio.sleep(delay)
        if not body.get("stream"):
            return web.json_response({
                "object": "chat.completion",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "fine"}}],
                "usage": {"prompt_tokens": len(prompt) // 4, "completion_tokens": 5}})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for index in range(5):
            if self.mode == "break" and index == 2:
                assert request.transport is not None
                request.transport.abort()  # the engine died mid-stream
                return response
            await response.write(_chunk("tok "))
            await asyncio.sleep(0.005)
        await response.write(_chunk("", "stop"))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", choices=MODES, default="good")
    args = parser.parse_args()
    web.run_app(Engine(args.mode).app(), host="127.0.0.1", port=args.port, print=None,
                access_log=None)


if __name__ == "__main__":
    main()
