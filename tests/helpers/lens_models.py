"""Tiny models for the lens tests: Llama / OLMo 2 / Gemma 2 (d = 32, 4 layers, vocab 100, fp32).

Built from their config classes and trained a few steps on a synthetic pattern (noisy bigram chain,
then a copy of it), so that the final distribution is peaked and the lens has something to learn.
Used by tests/test_lens.py, also in the subprocess of its SIGKILL resume test.
"""

from __future__ import annotations

import torch
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Olmo2Config,
    Olmo2ForCausalLM,
)

VOCAB, D, N_LAYERS = 100, 32, 4
#: the lens options of the resume tests (small: a lens checkpointed every 7 of 60 steps)
RESUME = dict(
    steps=60,
    eval_every=10,
    patience=5,
    tol=1e-4,
    optimizer="adam",
    lr=3e-3,
    warmup_steps=5,
    tokens_per_step=100,
    progress=False,
)

#: The options these tests fix where they give none (one batch per step, SGD-Nesterov at its
#: effective step 1.0, no warmup, constant lr, eval every 10, patience 5, tol 1e-3), so that they
#: do not follow the config schema's lens defaults (tests/test_lens.py::test_options_default_to_the_schema).
PINNED = dict(
    steps=250,
    tokens_per_step=None,
    optimizer="sgd_nesterov",
    lr=None,
    warmup_steps=0,
    lr_schedule="constant",
    eval_every=10,
    patience=5,
    tol=1e-3,
)
PINNED_RESUME = {**PINNED, **RESUME}


def synthetic_batches(n: int, seed: int, batch: int = 8, length: int = 32) -> list[torch.Tensor]:
    """Noisy bigram chain x_{t+1} = 3 x_t + 7 (mod V) with 20 % random tokens, then a copy of it."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        half = length // 2
        x = torch.zeros(batch, half, dtype=torch.long)
        x[:, 0] = torch.randint(0, VOCAB, (batch,), generator=g)
        for t in range(1, half):
            noise = torch.rand(batch, generator=g) < 0.2
            x[:, t] = torch.where(noise, torch.randint(0, VOCAB, (batch,), generator=g), (3 * x[:, t - 1] + 7) % VOCAB)
        out.append(torch.cat([x, x], dim=1))
    return out


def common_config(cls, **extra):
    return cls(
        vocab_size=VOCAB,
        hidden_size=D,
        intermediate_size=64,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
        **extra,
    )


def build(family: str, seed: int = 0, pretrain_steps: int = 150) -> torch.nn.Module:
    torch.manual_seed(seed)
    if family == "llama":
        model = LlamaForCausalLM(common_config(LlamaConfig))
    elif family == "olmo2":
        model = Olmo2ForCausalLM(common_config(Olmo2Config))
    elif family == "gemma2":
        model = Gemma2ForCausalLM(
            common_config(Gemma2Config, head_dim=8, final_logit_softcapping=2.0, attn_implementation="eager")
        )
    else:
        raise ValueError(family)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for ids in synthetic_batches(pretrain_steps, seed=100 + seed):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    return model.eval()
