"""What the router predicts a pod holds of a prompt: the router's own prefix index, beside the
picker's. Pure.

The endpoint picker scores pods by the prompt prefix it has sent each of them; it does not say
what it predicted. The router keeps the same kind of index (the prompt's text in blocks of
BLOCK_CHARS, each block's hash chained to the one before, so a block matches only with all of
its prefix; per pod an LRU of the blocks sent there), and for each request counts how much of
the prompt the chosen pod should still hold. Set against the engines' own count of cached
prompt tokens (`glm_router_prompt_tokens_cached_total`), it tells a placement that missed
from an engine that evicted.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

BLOCK_CHARS = 64
BLOCKS_PER_POD = 32_768  # about 2 million characters of prompt per pod
MAX_BLOCKS = 4_096  # of one prompt: about 256 k characters looked at


def prompt_text(body: dict[str, Any]) -> str:
    """The prompt as the engine sees it, enough for prefixes: every message's text in order
    (each ended with its role, so two conversations that differ only in who said what do not
    match), or the completions prompt."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    parts: list[str] = []
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in messages:
            if not isinstance(message, dict):
                continue
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(part["text"] for part in content
                                  if isinstance(part, dict) and isinstance(part.get("text"), str))
            if isinstance(content, str):
                parts.append(content)
                parts.append(f"\x00{message.get('role')}\x00")
    return "".join(parts)


def block_hashes(text: str) -> Iterator[int]:
    """The chained hashes of the prompt's whole blocks (a last partial block is left out)."""
    previous = 0
    for start in range(0, min(len(text), MAX_BLOCKS * BLOCK_CHARS) - BLOCK_CHARS + 1,
                       BLOCK_CHARS):
        previous = hash((previous, text[start:start + BLOCK_CHARS]))
        yield previous


class PrefixIndex:
    def __init__(self, blocks_per_pod: int = BLOCKS_PER_POD) -> None:
        self._capacity = blocks_per_pod
        self._pods: dict[str, OrderedDict[int, None]] = {}

    def predict_and_record(self, pod: str, text: str) -> int:
        """The characters of `text` that `pod` should hold (its leading blocks sent there
        before); then `text`'s blocks are recorded as sent to `pod`."""
        blocks = self._pods.setdefault(pod, OrderedDict())
        matched = 0
        still_matching = True
        for block in block_hashes(text):
            if still_matching and block in blocks:
                matched += 1
            else:
                still_matching = False
            blocks[block] = None
            blocks.move_to_end(block)
        while len(blocks) > self._capacity:
            blocks.popitem(last=False)
        return matched * BLOCK_CHARS

    def keep_only(self, pods: set[str]) -> None:
        for gone in [pod for pod in self._pods if pod not in pods]:
            del self._pods[gone]
