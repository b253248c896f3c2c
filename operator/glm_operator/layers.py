"""How models count their layers, in one place.

Multi-token-prediction layers (GLM-4.5's "nextn") are counted apart from the trunk. GGUF
headers of some architectures include them in `block_count`; Hugging Face's
`num_hidden_layers` never does. The API (`ModelVersion` facts, in GGUF names) follows the
GGUF convention; the planner counts trunk layers only. Every conversion between the two goes
through these functions, so the fetcher, the planner and the API agree.
"""

from __future__ import annotations

# Architectures whose GGUF block_count includes the nextn (MTP) layers (the pinned llama.cpp
# reads it as n_layer_all, trunk + nextn).
ARCHITECTURES_WITH_NEXTN_IN_BLOCK_COUNT = frozenset(
    {"glm4moe", "glm-dsa", "glm5-next", "deepseek2"}
)


def trunk_layers(architecture: str, block_count: int, nextn_layers: int) -> int:
    """Trunk layers from a GGUF-convention block_count."""
    if architecture in ARCHITECTURES_WITH_NEXTN_IN_BLOCK_COUNT:
        return block_count - nextn_layers
    return block_count


def gguf_block_count(architecture: str, trunk: int, nextn_layers: int) -> int:
    """A GGUF-convention block_count from trunk layers (Hugging Face's num_hidden_layers)."""
    if architecture in ARCHITECTURES_WITH_NEXTN_IN_BLOCK_COUNT:
        return trunk + nextn_layers
    return trunk
