"""The family table: every decoder family resdyn can split into sublayers, in ONE place.

No torch import: config validation (:mod:`resdyn.lm.hub`), the schema's family list
(:func:`resdyn.pipeline.config.load_schema`), the cost model (:func:`mlp_matrices`) and the docs'
table (checked by tests/test_arch.py) read this table before any job; :mod:`resdyn.lm.sublayers`
imports each family's adapter class from the module named here. Adding a family = one entry
here, its adapter (a :class:`resdyn.lm.sublayers.LayerSublayers` subclass, one module under
``resdyn/lm/adapters/``) and its oracle test (docs/architectures.md, "Adding a family").
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Family:
    """One decoder family.

    ``model_types``: HF ``config.model_type`` values (text config first; multimodal wrappers'
    outer types too). ``layer_class``: transformers' decoder-layer class name (another class
    under the same model type, e.g. remote code, is refused). ``adapter``: "module:Class" of its
    :class:`resdyn.lm.sublayers.LayerSublayers`. ``rms_norms``: RMSNorm class name -> weight
    offset c of ``(c + w) ⊙ x / sqrt(mean(x²) + eps)`` (Gemma 2/3 store w − 1: c = 1).
    ``mlp_matrices``: 3 for a gated MLP, 2 for ``W_2 act(W_1 x)`` (cost model).
    ``parallel_key``: config key that makes the layer parallel-residual (and its default).
    ``refused_settings``: (config key, value, reason) combinations refused before any job.
    ``summary``: the docs table's row (residual, norms, attention, MLP).
    """

    model_types: tuple[str, ...]
    layer_class: str
    adapter: str
    rms_norms: dict[str, float] = field(default_factory=dict)
    mlp_matrices: int = 3
    parallel_key: tuple[str, bool] | None = None
    refused_settings: tuple[tuple[str, object, str], ...] = ()
    summary: tuple[str, str, str, str] = ("", "", "", "")


_BIDIRECTIONAL = ("use_bidirectional_attention", True, "bidirectional attention is not a causal decoder")

FAMILIES: dict[str, Family] = {
    "llama": Family(
        ("llama",),
        "LlamaDecoderLayer",
        "resdyn.lm.sublayers:LayerSublayers",
        {"LlamaRMSNorm": 0.0},
        summary=("sequential, pre-norm", "RMSNorm", "RoPE, GQA", "gated"),
    ),
    "mistral": Family(
        ("mistral",),
        "MistralDecoderLayer",
        "resdyn.lm.sublayers:LayerSublayers",
        {"MistralRMSNorm": 0.0},
        summary=("sequential, pre-norm", "RMSNorm", "RoPE, sliding window", "gated"),
    ),
    "qwen2": Family(
        ("qwen2",),
        "Qwen2DecoderLayer",
        "resdyn.lm.sublayers:LayerSublayers",
        {"Qwen2RMSNorm": 0.0},
        summary=("sequential, pre-norm", "RMSNorm", "RoPE, q/k/v bias, sliding layers", "gated"),
    ),
    "olmo2": Family(
        ("olmo2",),
        "Olmo2DecoderLayer",
        "resdyn.lm.adapters.olmo2:PostNormSublayers",
        {"Olmo2RMSNorm": 0.0},
        summary=("sequential, post-norm", "RMSNorm", "full-width q/k norm", "gated"),
    ),
    "olmo3": Family(
        ("olmo3",),
        "Olmo3DecoderLayer",
        "resdyn.lm.adapters.olmo2:PostNormSublayers",
        {"Olmo3RMSNorm": 0.0},
        summary=("sequential, post-norm", "RMSNorm", "full-width q/k norm, sliding layers", "gated"),
    ),
    "gemma4": Family(
        ("gemma4", "gemma4_text"),
        "Gemma4TextDecoderLayer",
        "resdyn.lm.adapters.gemma4:Gemma4Sublayers",
        {"Gemma4RMSNorm": 0.0},
        refused_settings=(
            (
                "enable_moe_block",
                True,
                "the MoE block runs in parallel with the dense MLP from a router on m_L (gemma4 dense models only)",
            ),
            ("use_bidirectional_attention", "all", "bidirectional attention is not a causal decoder"),
        ),
        summary=(
            "sequential, sandwich norms",
            "RMSNorm",
            "per-head q/k/v norms, KV sharing, k = v layers",
            "gated + per-layer inputs, layer scalar",
        ),
    ),
    "gpt2": Family(
        ("gpt2",),
        "GPT2Block",
        "resdyn.lm.adapters.gpt2:GPT2Sublayers",
        mlp_matrices=2,
        refused_settings=(("add_cross_attention", True, "cross-attention is not a decoder-only model"),),
        summary=("sequential, pre-norm", "LayerNorm (bias)", "learned positions, fused Conv1D q/k/v", "plain (GELU)"),
    ),
    "gpt_neox": Family(
        ("gpt_neox",),
        "GPTNeoXLayer",
        "resdyn.lm.adapters.gpt_neox:GPTNeoXSublayers",
        mlp_matrices=2,
        parallel_key=("use_parallel_residual", True),
        summary=(
            "**parallel** (`use_parallel_residual: true`) or sequential",
            "LayerNorm (bias)",
            "partial rotary (`rotary_pct`), fused per-head q/k/v",
            "plain (GELU)",
        ),
    ),
    "qwen3": Family(
        ("qwen3",),
        "Qwen3DecoderLayer",
        "resdyn.lm.adapters.qwen3:Qwen3Sublayers",
        {"Qwen3RMSNorm": 0.0},
        summary=("sequential, pre-norm", "RMSNorm", "per-head q/k norm, sliding layers", "gated"),
    ),
    "gemma2": Family(
        ("gemma2",),
        "Gemma2DecoderLayer",
        "resdyn.lm.adapters.gemma2:Gemma2Sublayers",
        {"Gemma2RMSNorm": 1.0},
        summary=(
            "sequential, sandwich norms",
            "RMSNorm (1 + w)",
            "attention logit soft-capping, sliding/global layers",
            "gated (GELU-tanh)",
        ),
    ),
    "gemma3": Family(
        ("gemma3_text", "gemma3"),
        "Gemma3DecoderLayer",
        "resdyn.lm.adapters.gemma3:Gemma3Sublayers",
        {"Gemma3RMSNorm": 1.0},
        refused_settings=(_BIDIRECTIONAL,),
        summary=(
            "sequential, sandwich norms",
            "RMSNorm (1 + w)",
            "per-head q/k norm, sliding/global layers with their own RoPE",
            "gated (GELU-tanh)",
        ),
    ),
    "phi3": Family(
        ("phi3",),
        "Phi3DecoderLayer",
        "resdyn.lm.adapters.phi3:Phi3Sublayers",
        {"Phi3RMSNorm": 0.0},
        summary=("sequential, pre-norm", "RMSNorm", "fused q/k/v, partial rotary, sliding window", "fused gate/up"),
    ),
    "granite": Family(
        ("granite",),
        "GraniteDecoderLayer",
        "resdyn.lm.adapters.granite:GraniteSublayers",
        {"GraniteRMSNorm": 0.0},
        summary=("sequential, pre-norm, residual multiplier", "RMSNorm", "attention multiplier", "gated"),
    ),
    "smollm3": Family(
        ("smollm3",),
        "SmolLM3DecoderLayer",
        "resdyn.lm.adapters.smollm3:SmolLM3Sublayers",
        {"SmolLM3RMSNorm": 0.0},
        summary=("sequential, pre-norm", "RMSNorm", "RoPE and NoPE layers", "gated"),
    ),
}

#: family -> (HF config model types, HF decoder-layer class name), derived from :data:`FAMILIES`: the
#: supported list that error messages and tests iterate.
SUPPORTED_FAMILIES: dict[str, tuple[tuple[str, ...], str]] = {
    name: (fam.model_types, fam.layer_class) for name, fam in FAMILIES.items()
}

_MOE = "mixture-of-experts layers: the MLP half is a routed sum of experts, not one map; nearest supported: "
_ENC_DEC = "encoder-decoder: the decoder layers cross-attend to an encoder; nearest supported: a decoder-only "
# Known model types we refuse: the reason and the nearest supported alternative.
REFUSED_FAMILIES: dict[str, str] = {
    "gptj": "parallel residual (attention and MLP both read h_L) without an adapter; nearest supported: "
    "gpt_neox (Pythia, parallel residual)",
    "phi": "parallel residual with ONE shared input LayerNorm (Phi-1/1.5/2), no adapter yet; nearest supported: "
    "phi3 (Phi-3, Phi-4-mini) or gpt_neox (Pythia, parallel residual)",
    "falcon": "parallel attention/MLP with optional shared norms, no adapter; nearest supported: gpt_neox",
    "gemma3n": "AltUp: the residual stream is several d-vectors, not one; nearest supported: gemma3",
    "gemma3n_text": "AltUp: the residual stream is several d-vectors, not one; nearest supported: gemma3",
    "mixtral": _MOE + "mistral",
    "qwen2_moe": _MOE + "qwen2",
    "qwen3_moe": _MOE + "qwen3",
    "olmoe": _MOE + "olmo2",
    "granitemoe": _MOE + "granite",
    "granitemoeshared": _MOE + "granite",
    "phimoe": _MOE + "phi3",
    "deepseek_v2": _MOE + "llama",
    "deepseek_v3": _MOE + "llama",
    "gpt_oss": _MOE + "qwen3",
    "llama4": _MOE + "llama",
    "llama4_text": _MOE + "llama",
    "dbrx": _MOE + "llama",
    "jamba": _MOE + "mistral (and its Mamba layers have no attention half)",
    "t5": _ENC_DEC + "model of the same size, e.g. llama or qwen3",
    "mt5": _ENC_DEC + "model of the same size, e.g. llama or qwen3",
    "umt5": _ENC_DEC + "model of the same size, e.g. llama or qwen3",
    "bart": _ENC_DEC + "model of the same size, e.g. gpt2",
    "mbart": _ENC_DEC + "model of the same size, e.g. gpt2",
    "pegasus": _ENC_DEC + "model of the same size, e.g. gpt2",
    "whisper": _ENC_DEC + "model of the same size, e.g. gpt2",
    "t5gemma": _ENC_DEC + "gemma2 or gemma3 model",
}

#: Jacobian work of the generic path relative to the hand-written engines (forward mode through
#: HF's modules: three MLP GEMMs per direction instead of one, projections per direction, vmap
#: over HF's Python). ``benchmarks/jacobian.py --generic`` measured 1.8-9.8x (median 7.1x) at
#: d = 256, T = 128 on CPU (docs/architectures.md); the cost model prices it at 8x.
GENERIC_SLOWDOWN = 8.0

#: config.json key whose presence means the model's code comes from its repository
REMOTE_CODE_KEY = "auto_map"


def family_of_type(model_type: str | None, outer_type: str | None = None) -> str | None:
    """The family whose model types include ``model_type`` (or, failing that, ``outer_type``)."""
    for mt in (model_type, outer_type):
        found = next((name for name, fam in FAMILIES.items() if mt in fam.model_types), None)
        if found:
            return found
    return None


def refusal(
    model_type: str | None, outer_type: str | None, settings: dict, remote_code: bool = False, generic: bool = False
) -> str | None:
    """Why a model cannot be split (one line: the reason and the nearest supported family), or None.

    ``settings``: the text config's keys (config.json dict or ``vars`` of a config object);
    ``remote_code``: the checkpoint ships its own modelling code (config.json ``auto_map``);
    ``generic``: the model is to run through the generic path (config ``family: generic``), which
    accepts any type not refused by name (its template and self-check decide at load time).
    """
    supported = ", ".join(FAMILIES)
    for mt in (model_type, outer_type):
        if mt in REFUSED_FAMILIES:
            return f"model type {mt!r} is not supported: {REFUSED_FAMILIES[mt]}; supported families: {supported}"
    name = family_of_type(model_type, outer_type)
    if generic and not remote_code:
        return None
    if remote_code:
        nearest = f"load it as {name!r} with transformers' own code" if name else "a supported family"
        return (
            f"model type {model_type or outer_type!r} ships remote code (config.json 'auto_map'): its layers "
            f"cannot be matched to an adapter; nearest supported: {nearest}; supported families: {supported}"
        )
    if name is None:
        return (
            f"model type {model_type or outer_type!r} is not supported; supported families: {supported} "
            "(no adapter; `family: generic` tries the generic path)"
        )
    for key, value, reason in FAMILIES[name].refused_settings:
        if settings.get(key) == value:
            return f"{name} with {key}={value!r} is not supported: {reason}; supported families: {supported}"
    return None


def docs_table() -> str:
    """The family table of docs/architectures.md (markdown), rendered from :data:`FAMILIES`.

    tests/test_arch.py checks that the docs hold exactly this.
    """
    lines = [
        "| family key (`models.*.family`) | HF `model_type` | residual | norms | attention | MLP |",
        "|---|---|---|---|---|---|",
    ]
    for name, fam in FAMILIES.items():
        lines.append(f"| `{name}` | {', '.join(fam.model_types)} | " + " | ".join(fam.summary) + " |")
    return "\n".join(lines)


def mlp_matrices(family: str | None) -> int:
    """Weight matrices of the family's MLP (3 gated, 2 plain); 3 for an unknown family."""
    fam = FAMILIES.get(family or "")
    return fam.mlp_matrices if fam else 3


def is_parallel(family: str | None, settings: dict) -> bool:
    """True when the family's layers are parallel-residual under these config settings."""
    fam = FAMILIES.get(family or "")
    if fam is None or fam.parallel_key is None:
        return False
    key, default = fam.parallel_key
    return bool(settings.get(key, default))
