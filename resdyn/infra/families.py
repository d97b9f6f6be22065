"""Which Hugging Face model types resdyn can split into sublayers (no torch import: config
validation reads these tables before any job; ``resdyn.infra.arch`` uses them to split models)."""

#: family name -> (HF config model types, HF decoder-layer class name)
SUPPORTED_FAMILIES: dict[str, tuple[tuple[str, ...], str]] = {
    "llama": (("llama",), "LlamaDecoderLayer"),
    "mistral": (("mistral",), "MistralDecoderLayer"),
    "qwen2": (("qwen2",), "Qwen2DecoderLayer"),
    "olmo2": (("olmo2",), "Olmo2DecoderLayer"),
    "olmo3": (("olmo3",), "Olmo3DecoderLayer"),
    "gemma4": (("gemma4", "gemma4_text"), "Gemma4TextDecoderLayer"),
    "gpt2": (("gpt2",), "GPT2Block"),
    "gpt_neox": (("gpt_neox",), "GPTNeoXLayer"),
}

# Known model types we refuse, with the reason (the residual is not one d-vector, or the two
# halves run in parallel without an adapter that treats the layer as one operator, as
# GPT-NeoX's does).
REFUSED_FAMILIES: dict[str, str] = {
    "gptj": "parallel residual: attention and MLP both read h_L, there is no pre-MLP boundary",
    "phi": "parallel residual: attention and MLP both read h_L, there is no pre-MLP boundary",
    "falcon": "parallel attention/MLP: there is no pre-MLP boundary",
    "gemma3n": "AltUp: the residual stream is several d-vectors, not one",
    "gemma3n_text": "AltUp: the residual stream is several d-vectors, not one",
}
