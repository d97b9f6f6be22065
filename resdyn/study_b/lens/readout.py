"""The translator and the model's own readout: one code path for tuned lens, logit lens and the
reference index n; the readout's identity (hashes) and the shapes a lens is fitted against."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import nn

from resdyn.lm import structure
from resdyn.study_b.lens.options import is_int


def apply_translator(hidden: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
    """``T(h) = h + W h + b`` on the last axis, computed in float32, returned in h's dtype.

    Shapes: a single translator ``weight (d, d)``, ``bias (d,)`` acts on ``hidden (..., d)``;
    stacked translators ``weight (L, d, d)``, ``bias (L, d)`` act on ``hidden (L, N, d)``
    (layer-major). ``weight = bias = None`` is the identity translator (logit lens, index n):
    ``h`` is returned untouched, so that readout is bit-for-bit the model's own.
    """
    if weight is None and bias is None:
        return hidden
    x = hidden.float()
    out = x
    if weight is not None:
        out = out + torch.matmul(x, weight.mT)
    if bias is not None:
        out = out + (bias.unsqueeze(-2) if bias.dim() == 2 else bias)
    # Cast back: the readout's norm and head run in the model's dtype (bf16 heads reject fp32).
    return out.to(hidden.dtype)


def lens_readout(
    model: nn.Module, hidden: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None
) -> torch.Tensor:
    """Lens logits ``unembed_logits(model, T(h))`` (..., V); W = b = None gives the logit lens."""
    return structure.unembed_logits(model, apply_translator(hidden, weight, bias))


def logit_lens_logits(model: nn.Module, hidden: torch.Tensor, layer: int) -> torch.Tensor:
    """Logit-lens logits of the stream ``hidden (..., d)`` at index ``layer`` ∈ [0, n].

    The identity translator (W = 0, b = 0) read out through the model's own head; the same code
    path as the tuned lens (:func:`lens_readout`). At ``layer = n`` it equals the model's logits.
    """
    check_layer(layer, len(structure.decoder_layers(model)), allow_reference=True)
    return lens_readout(model, hidden, None, None)


def check_layer(layer: int, n_layers: int, allow_reference: bool) -> None:
    """Raise ValueError unless ``layer`` is an integer in 0..n−1 (0..n with the reference index n)."""
    top = n_layers if allow_reference else n_layers - 1
    if not is_int(layer) or not 0 <= layer <= top:
        raise ValueError(f"layer={layer!r}; allowed: integers 0..{top} (n_layers = {n_layers})")


def model_device(model: nn.Module) -> torch.device:
    """Device of the model's output embedding (where the readout runs)."""
    return model.get_output_embeddings().weight.device


def n_layers_of(model: nn.Module) -> int:
    """Number of decoder layers n (translators 0..n−1, reference index n)."""
    return len(structure.decoder_layers(model))


@contextmanager
def frozen(model: nn.Module) -> Iterator[nn.Module]:
    """Eval mode and ``requires_grad=False`` on every model parameter, restored afterwards.

    Gradients must flow *through* the final norm and head to the translators but never into
    the model (that would waste a V×d weight-gradient matmul per chunk and touch ``.grad``).
    """
    was_training = model.training
    flags = [(p, p.requires_grad) for p in model.parameters()]
    model.eval()
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield model
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
        model.train(was_training)


def _readout_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    head = model.get_output_embeddings()
    named = [(f"lm_head.{k}", v) for k, v in head.named_parameters()]
    named += [(f"final_norm.{k}", v) for k, v in structure.final_norm(model).named_parameters()]
    named += [(f"final_norm.{k}", v) for k, v in structure.final_norm(model).named_buffers()]
    return named


def softcap(model: nn.Module) -> float | None:
    """The model's final-logit softcap (Gemma), or None when it has none."""
    cfg = getattr(model, "config", None)
    cap = getattr(cfg, "final_logit_softcapping", None)
    if cap is None and cfg is not None and hasattr(cfg, "get_text_config"):
        cap = getattr(cfg.get_text_config(), "final_logit_softcapping", None)
    return float(cap) if cap else None


def unembed_hash(model: nn.Module) -> str:
    """Hex SHA-256 identifying the readout a lens was trained through.

    Hashes (name, shape, float32 bytes) of the head's parameters and the final norm's
    parameters and buffers, then the softcap value: stricter than tuned-lens's hash of the
    unembedding alone, since our lens reads out through all three. float32 bytes make the hash
    independent of loading a bf16 checkpoint in bf16 or fp32. Streamed in row blocks (a 150k×5k
    head would otherwise need a 3 GB float32 copy), which is why io.sha256_array is not used.
    """
    h = hashlib.sha256()
    for name, t in _readout_tensors(model):
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        flat = t.detach().reshape(t.shape[0], -1) if t.dim() > 1 else t.detach().reshape(1, -1)
        for start in range(0, flat.shape[0], 4096):
            h.update(flat[start : start + 4096].to("cpu", torch.float32).contiguous().numpy().tobytes())
    h.update(f"softcap={softcap(model)!r}".encode())
    if structure.readout_scale(model) is not None:  # Granite only: other readouts hash without this term
        h.update(f"logits_scaling={structure.readout_scale(model)!r}".encode())
    return h.hexdigest()


def tuned_lens_unembed_hash(model: nn.Module) -> str:
    """The hash tuned-lens 0.2.0 stores as ``unembed_hash`` (``Unembed.unembedding_hash``).

    Its formula: SHA-256 of ``np.array_str(W, precision=1)`` of the float32 unembedding matrix
    (a printed summary, so robust to dtype). It depends on numpy's print format, so tuned-lens
    only warns on a mismatch; written so that the warning does not fire for our exports.
    """
    w = model.get_output_embeddings().weight.detach().cpu().float().numpy()
    return hashlib.sha256(str.encode(np.array_str(w, precision=1))).hexdigest()


class TunedLensReadout(nn.Module):
    """The model's own readout in the shape of tuned-lens's ``Unembed``, for any family.

    tuned-lens 0.2.0 resolves the final norm only for the families it lists (not OLMo 2,
    Gemma 2/3/4, …) and applies no final-logit softcap. Passing this object instead,
    ``TunedLens.from_unembed_and_pretrained(TunedLensReadout(model), <exported dir>)``, gives
    tuned-lens users exactly our readout: ``forward(h) = structure.unembed_logits(model, h)``.
    It exposes what TunedLens reads (``unembedding`` with ``.weight``, ``final_norm``,
    ``unembedding_hash()``). The model's modules are held as plain attributes, not submodules,
    so ``lens.parameters()`` never includes (and an optimizer never trains) the model's head.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "unembedding", model.get_output_embeddings())
        object.__setattr__(self, "final_norm", structure.final_norm(model))

    def unembedding_hash(self) -> str:
        """tuned-lens's hash of the unembedding matrix (:func:`tuned_lens_unembed_hash`)."""
        return tuned_lens_unembed_hash(self.model)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """``softcap(lm_head(final_norm(h)))`` — the model's own readout."""
        return structure.unembed_logits(self.model, h)


def model_info(model: nn.Module) -> dict[str, Any]:
    """The shapes a lens is fitted against: ``d_model``, ``vocab_size`` (of the unembedding), ``n_layers``."""
    head = model.get_output_embeddings()
    return {
        "d_model": int(head.weight.shape[1]),
        "vocab_size": int(head.weight.shape[0]),
        "n_layers": n_layers_of(model),
    }


def dtype_of(model: nn.Module) -> torch.dtype:
    """Dtype of the model's output embedding (that of its cached residual states)."""
    return model.get_output_embeddings().weight.dtype


def linear_readout_weight(model: nn.Module, dtype: torch.dtype) -> torch.Tensor | None:
    """The head's weight W (V, d) in ``dtype`` when the readout is ``W · final_norm(h)`` (no head
    bias, no softcap, no logit scaling) so that :func:`resdyn.study_b.lens.kl.linear_head_kl` applies; None otherwise
    (Gemma's softcap, Granite's logits_scaling)."""
    head = model.get_output_embeddings()
    if (
        not isinstance(head, nn.Linear)
        or head.bias is not None
        or softcap(model) is not None
        or structure.readout_scale(model) is not None
    ):
        return None
    return head.weight.detach().to(dtype)
