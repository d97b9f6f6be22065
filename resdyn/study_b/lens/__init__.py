"""Tuned lens and logit lens: per-layer affine translators read out through the model's own head.

Definitions (docs/design.md, "Lens translator"):

- Translator of layer L (L = 0 … n−1, n = number of decoder layers) acts on the raw residual
  stream *entering* layer L (L = 0: the embedding output)::

      T_L(h) = h + W_L h + b_L = A_L h + b_L,        A_L = I + W_L,   W_L, b_L initialised at 0

  The residual parametrisation means weight decay pulls toward the identity, i.e. toward the
  logit lens, not toward the zero map.
- Readout: ``logits = structure.unembed_logits(model, T_L(h))`` = softcap(lm_head(final_norm(·))),
  the model's own head including Gemma's final logit softcap.
- Loss (distillation): ``KL(p_final ‖ p_lens) = Σ_v p_final(v) (log p_final(v) − log p_lens(v))``
  averaged over tokens, where ``p_final = softmax(model logits)``; the model is frozen.
- Index n (the last layer's output) is the identity reference: W = 0, b = 0, so the lens there
  *is* the model's own readout and its KL is exactly 0. The logit lens is the same code path
  with W = 0, b = 0 at every layer (:func:`logit_lens_logits`).

Training (:func:`train_lens`) caches the residual states of a batch once (one frozen forward)
and trains all n translators on them in the same pass: the translators are stacked into one
(n, d, d) weight and one (n, d) bias and applied with a batched matmul, and the readout of
several layers runs as one matmul. Every optimizer used here acts elementwise, so this is
mathematically tuned-lens's per-layer loop (global gradient clipping, its default) or, with
``clip_scope="layer"``, n fully independent trainings.

Convergence: held-out KL is evaluated every ``eval_every`` steps (and at step 0, which is the
logit lens). For layer L with held-out history K_L(e) over evals e, the relative improvement over
the last ``patience`` evals is ``r_L = (K_L(e−patience) − min_{e−patience<j≤e} K_L(j)) /
K_L(e−patience)``; layer L counts as converged while ``r_L < tol``. Training stops at the first
eval where every layer has converged (windows must start after the LR warmup), or at ``steps``.

Resume: with ``checkpoint=PATH``, :func:`train_lens` saves the loop's whole state (translators,
optimizer state, step, curves, held-out history, convergence counters, position in the token
stream and the stream it belongs to) atomically to PATH every ``checkpoint_every`` steps, and a
rerun with the same model, tokens and options continues from it bit-identically (the cached
states are recomputed by the same deterministic forward). A checkpoint written for another model,
other options or held-out tokens is ignored with a warning; one of another training stream (or a
position past the end of a stream used once) stops the job with one line. It is removed when
training finishes.

Fresh tokens (``fresh_tokens=True``, config ``lens.train_tokens``): the training batches are a
stream each token of which is used once, never cycled; ``curves`` log the tokens seen at each eval.

Files: :meth:`Lens.save` writes a lens folder (translators, curves, config; format
``resdyn.lens/1``) and the training checkpoint is a file; both formats, their writers and readers
are :class:`resdyn.artifacts.LensFolder` and :class:`resdyn.artifacts.LensCheckpoint`.

:meth:`Lens.export_tuned_lens` writes the EleutherAI ``tuned-lens`` format (params.pt +
config.json) so that ``tuned_lens.nn.TunedLens`` users can load our translators.

Modules, one concept each: :mod:`~resdyn.study_b.lens.options` (:class:`LensOptions`, defaults from
the config schema), :mod:`~resdyn.study_b.lens.readout` (the translator, the model's readout and
its hashes), :mod:`~resdyn.study_b.lens.kl` (the KL target and its two autograd Functions,
chunking, held-out KL), :mod:`~resdyn.study_b.lens.stream` (cached residual states as a token
stream), :mod:`~resdyn.study_b.lens.translators` (:class:`Lens`: save, load, export),
:mod:`~resdyn.study_b.lens.trainer` (:func:`train_lens`, convergence, resume) and
:mod:`~resdyn.study_b.lens.metrics` (:func:`lens_metrics`). Every public name is importable from
the package.
"""

from resdyn.study_b.lens.kl import (  # noqa: F401
    Target,
    blocks,
    default_chunk_elements,
    final_target,
    flash_head_kl,
    flash_kl_usable,
    fused_kl,
    kl_from_logq,
    kl_to_target,
    layer_kl,
    linear_head_kl,
    teacher_stats,
)
from resdyn.study_b.lens.metrics import (  # noqa: F401
    METRIC_COLUMNS,
    lens_metrics,
)
from resdyn.study_b.lens.options import (  # noqa: F401
    CLIP_SCOPES,
    DEFAULT_LR,
    KL_KERNELS,
    LR_SCHEDULES,
    OPTIMIZERS,
    READOUT_DTYPES,
    SCHEMA_DEFAULTS,
    SCHEMA_NAMES,
    LensOptions,
    is_int,
)
from resdyn.study_b.lens.readout import (  # noqa: F401
    TunedLensReadout,
    apply_translator,
    check_layer,
    dtype_of,
    frozen,
    lens_readout,
    linear_readout_weight,
    logit_lens_logits,
    model_device,
    model_info,
    n_layers_of,
    softcap,
    tuned_lens_unembed_hash,
    unembed_hash,
)
from resdyn.study_b.lens.stream import (  # noqa: F401
    TokenStream,
    as_batches,
    layer_major_states,
    shuffled_rows,
    stream_source,
    token_batches,
)
from resdyn.study_b.lens.trainer import (  # noqa: F401
    CHECKPOINT_FORMAT,
    clip_grads_,
    convergence_window,
    lr_factor,
    train_lens,
)
from resdyn.study_b.lens.translators import (  # noqa: F401
    CONVERGENCE_COLUMNS,
    CURVE_COLUMNS,
    FORMAT,
    Lens,
)
