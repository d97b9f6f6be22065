"""Per-layer readout quality of the tuned and the logit lens (:func:`lens_metrics`)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd
import torch
from torch import nn

from resdyn import artifacts
from resdyn.study_b.lens.kl import Target, blocks, default_chunk_elements, final_target, kl_from_logq
from resdyn.study_b.lens.readout import frozen, lens_readout, model_device
from resdyn.study_b.lens.stream import as_batches, layer_major_states
from resdyn.study_b.lens.translators import Lens

METRIC_COLUMNS = artifacts.LENS_METRIC_COLUMNS  # defined by resdyn.artifacts.LensMetrics


@torch.no_grad()
def lens_metrics(
    model: nn.Module, lens: Lens, token_batches: Iterable[torch.Tensor], chunk_elements: int | None = None
) -> pd.DataFrame:
    """Per-layer readout quality of the tuned and the logit lens on held-out token batches.

    For layer L ∈ 0..n (n: the model's own output, identity translator, KL = 0 exactly):
    ``kl`` = mean KL(p_final ‖ p_lens) over all tokens; ``ce`` = mean −log p_lens(x_{t+1}) over
    positions t < T−1; ``hit1`` = share of tokens whose lens top-1 equals the model's final top-1;
    ``hit5`` = share whose model top-1 is in the lens top-5. Columns ``converged``, ``steps``,
    ``converged_step``, ``final_heldout_kl`` come from training (tuned rows, layers < n; missing
    elsewhere). One row per (lens ∈ {tuned, logit}, layer).
    """
    batches = as_batches(token_batches, "token_batches")
    n = lens.n_layers
    budget = chunk_elements or default_chunk_elements(model_device(model))
    vocab = lens.vocab_size
    sums = {name: np.zeros((n + 1, 4)) for name in ("tuned", "logit")}  # kl, ce, hit1, hit5
    n_tok = n_ce = 0
    with frozen(model):
        for ids in batches:
            states = layer_major_states(model, ids)  # (n+1, B·T, d)
            bsz, t = ids.shape
            nxt = torch.full((bsz, t), -1, dtype=torch.long)
            nxt[:, :-1] = ids[:, 1:]
            nxt = nxt.reshape(-1).to(states.device)  # next token per position; −1: none
            for ts, _ in blocks(1, bsz * t, vocab, budget):
                tgt = final_target(model, states[-1, ts])
                for name in ("tuned", "logit"):
                    for layer in range(n + 1):
                        w, b = lens.translator_params(layer) if name == "tuned" else (None, None)
                        z = lens_readout(model, states[layer, ts], w, b)
                        sums[name][layer] += _readout_stats(z, tgt, nxt[ts])
            n_tok += bsz * t
            n_ce += int((nxt >= 0).sum())
    rows = []
    conv = lens.convergence.set_index("layer") if len(lens.convergence) else None
    for name in ("tuned", "logit"):
        for layer in range(n + 1):
            kl, ce, h1, h5 = sums[name][layer]
            row = {
                "lens": name,
                "layer": layer,
                "kl": kl / n_tok,
                "ce": ce / max(n_ce, 1),
                "hit1": h1 / n_tok,
                "hit5": h5 / n_tok,
                "n_tokens": n_tok,
            }
            if name == "tuned" and conv is not None and layer in conv.index:
                c = conv.loc[layer]
                row.update(
                    converged=bool(c["converged"]),
                    steps=int(c["steps"]),
                    converged_step=int(c["converged_step"]),
                    final_heldout_kl=float(c["final_heldout_kl"]),
                )
                row["reason"] = "" if np.isfinite(row["final_heldout_kl"]) else "no held-out batches: no held-out KL"
            else:  # why the training columns are empty
                row["reason"] = (
                    "logit lens: nothing trained"
                    if name == "logit"
                    else "last layer's output: read as is, no translator trained"
                )
            rows.append(row)
    return pd.DataFrame(rows, columns=METRIC_COLUMNS)


def _readout_stats(z: torch.Tensor, target: Target, nxt: torch.Tensor) -> np.ndarray:
    """Sums over a token chunk of (KL, next-token CE, hit@1, hit@5) for lens logits z (N, V).

    ``nxt (N,)``: the next token at each position, −1 where there is none (excluded from CE).
    """
    z = z.to(torch.promote_types(z.dtype, torch.float32))
    logq = torch.log_softmax(z, dim=-1)
    kl = kl_from_logq(logq, target)  # as kl_to_target: exactly 0 at index n
    has = nxt >= 0
    ce = -logq[has].gather(-1, nxt[has, None]).sum() if bool(has.any()) else z.new_zeros(())
    hit1 = (z.argmax(-1) == target.top1).sum()
    k = min(5, z.shape[-1])
    hit5 = (z.topk(k, dim=-1).indices == target.top1[:, None]).any(-1).sum()
    return np.array([float(kl.double().sum()), float(ce.double()), float(hit1), float(hit5)])
