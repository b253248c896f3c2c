"""Which model architectures each pinned engine can load: one table per engine, here only.

An architecture the pinned engine cannot load is refused before anything is rendered (the
plan says why, naming the engine, its version and the architecture), never rendered into pods
that crash-loop on it. e2e/test_engine_architectures.py holds these tables against the engines
themselves: the llama.cpp names against the pinned tree's `LLM_ARCH_NAMES`
(src/llama-arch.cpp), the vLLM classes against the pinned vLLM's model registry.

Names are the ones ModelVersion facts carry: GGUF `general.architecture`, which the fetch Job
also uses for safetensors models (fetch/hf_config.py maps config.json's class to it).
"""

from __future__ import annotations

from glm_operator.planning.accelerators import VLLM_CUDA_IMAGE

LLAMA_CPP_VERSION = "llama-cpp-python 0.3.36"  # e2e/versions.toml; the tree it vendors
VLLM_VERSION = VLLM_CUDA_IMAGE.rpartition(":")[2]

# Every architecture the pinned llama.cpp tree registers (LLM_ARCH_NAMES), less "clip" (a
# dummy for llama-quantize) and "(unknown)": a GGUF naming anything else cannot load.
LLAMACPP_ARCHITECTURES = frozenset({
    "llama", "llama4", "deci", "falcon", "grok", "gpt2", "gptj", "gptneox", "mpt", "baichuan",
    "starcoder", "refact", "bert", "modern-bert", "nomic-bert", "nomic-bert-moe", "neo-bert",
    "jina-bert-v2", "jina-bert-v3", "eurobert", "bloom", "stablelm", "qwen", "qwen2",
    "qwen2moe", "qwen2vl", "qwen3", "qwen3moe", "qwen3next", "qwen3vl", "qwen3vlmoe", "qwen35",
    "qwen35moe", "qwen4exp", "phi2", "phi3", "phimoe", "plamo", "plamo2", "plamo3",
    "codeshell", "orion", "internlm2", "minicpm", "minicpm3", "gemma", "gemma2", "gemma3",
    "gemma3n", "gemma4", "gemma4-assistant", "gemma-embedding", "starcoder2", "mamba",
    "mamba2", "maple", "jamba", "falcon-h1", "xverse", "command-r", "cohere2", "cohere2moe",
    "dbrx", "olmo", "olmo2", "olmoe", "muse-glimmer", "openelm", "arctic", "deepseek",
    "deepseek2", "deepseek2-ocr", "deepseek32", "deepseek4", "chatglm", "glm4", "glm4moe",
    "glm-dsa", "bitnet", "t5", "t5encoder", "jais", "jais2", "nemotron", "nemotron_h",
    "nemotron_h_moe", "exaone", "exaone4", "exaone-moe", "rwkv6", "rwkv6qwen2", "rwkv7",
    "arwkv7", "granite", "granitemoe", "granitehybrid", "graniteswitch", "granite_swa",
    "chameleon", "wavtokenizer-dec", "plm", "bailingmoe", "bailingmoe2", "bailingmoe3",
    "dots1", "dots3note", "arcee", "afmoe", "laguna", "ernie4_5", "ernie4_5-moe",
    "hunyuan-moe", "hunyuan-dense", "hunyuan_vl", "hy_v3", "hy_v4", "smollm3", "gpt-oss",
    "lfm2", "lfm2moe", "dream", "smallthinker", "llada", "llada-moe", "seed_oss", "grovemoe",
    "apertus", "minimax-01", "hrm_text", "minimax-m2", "minimax-m3", "cogvlm", "rnd1",
    "pangu-embedded", "mistral3", "eagle3", "dflash", "mistral4", "paddleocr", "mimo2",
    "step35", "spark2_5", "llama-embed", "maincoder", "kimi-linear", "kimi-k3", "glm5-next",
    "talkie", "mellum", "nanbeige", "qwen3tts", "pockettts",
})

# The architectures the operator plans and renders specially (parsers, stops, MTP), with the
# classes of config.json's `architectures` that the pinned vLLM registers natively for each.
# Other names are left to vLLM, which serves any transformers model through its Transformers
# backend: the operator cannot say it will fail, so it does not refuse them. (A GGUF-only
# model never reaches vLLM: the plan refuses GGUF quantizations on it.)
VLLM_ARCHITECTURES: dict[str, tuple[str, ...]] = {
    "chatglm": ("ChatGLMModel", "ChatGLMForConditionalGeneration"),
    "glm4": ("Glm4ForCausalLM",),
    "glm4moe": ("Glm4MoeForCausalLM",),
    "glm-dsa": ("GlmMoeDsaForCausalLM",),
    "glm5-next": ("Glm5NextForCausalLM",),
    "llama": ("LlamaForCausalLM", "MistralForCausalLM"),
    "qwen2": ("Qwen2ForCausalLM",),
    "qwen2moe": ("Qwen2MoeForCausalLM",),
    "qwen3": ("Qwen3ForCausalLM",),
    "qwen3moe": ("Qwen3MoeForCausalLM",),
    "deepseek2": ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"),
}

# Architectures whose nextn (MTP) layers the pinned vLLM serves as speculative decoding
# (--speculative-config method mtp): its glm4_moe_mtp, glm_moe_dsa (GLM-5) and glm5_next_mtp
# drafters, and DeepSeek's (vllm/config/speculative.py).
VLLM_MTP_ARCHITECTURES = frozenset({"glm4moe", "glm-dsa", "glm5-next", "deepseek2"})


def unsupported(engine: str, architecture: str) -> str | None:
    """Why `engine`'s pinned version cannot load `architecture`, or None when it can."""
    name = architecture.strip()
    if engine == "llamacpp" and name not in LLAMACPP_ARCHITECTURES:
        return (f"llama.cpp ({LLAMA_CPP_VERSION}) cannot load architecture {name!r}: the "
                "pinned tree does not register it (its GGUF general.architecture must be one "
                "llama.cpp knows); serve it with engine vllm or convert it")
    return None

# The GLM-5 family (glm-dsa, one nextn layer) as config.json tells its generations apart:
# GLM-5 and GLM-5.1 train a 202,752-token context, GLM-5.2 and GLM-5.3 1M (1,048,576:
# max_position_embeddings; they also share indexers between layers, indexer_types).
GLM5_1M_CONTEXT = 1_048_576
# MTP draft tokens per step (--speculative-config num_speculative_tokens) the published
# recipes run: the GLM-5 authors' README and vLLM's GLM-5.1 recipe 3, vLLM's GLM-5.2 recipe 5
# (GLM-5.3 has no recipe of its own: taken as 5.2's). vLLM 0.33 runs the one MTP layer once
# per draft token (config/speculative.py: num_speculative_tokens must be a multiple of
# num_nextn_predict_layers, and it warns the acceptance rate may drop past the first).
GLM5_MTP_DEPTH = {"GLM-5/5.1": 3, "GLM-5.2/5.3": 5}


def glm5_generation(architecture: str, context_length: int) -> str | None:
    """Which GLM-5 generations a glm-dsa model's config.json can be, from its context."""
    if architecture != "glm-dsa":
        return None
    return "GLM-5.2/5.3" if context_length >= GLM5_1M_CONTEXT else "GLM-5/5.1"


def recipe_mtp_tokens(architecture: str, context_length: int, nextn_layers: int) -> int | None:
    """The recipes' MTP depth for the model, or None where no recipe gives one."""
    generation = glm5_generation(architecture, context_length)
    if generation is None or not nextn_layers:
        return None
    depth = GLM5_MTP_DEPTH[generation]
    return depth if depth % nextn_layers == 0 else nextn_layers
