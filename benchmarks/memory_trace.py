"""Peak GPU memory of every GPU rule at the paper presets' shapes, traced without a GPU, beside the plan.

For each model of configs/paper-a.yaml and configs/paper-b.yaml and each GPU rule it runs
(jacobians: the preset's heaviest block, the last; activations; lens training; lens metrics;
causal), the rule's own compute path runs on a model built on PyTorch's meta device from the
transformers config class of the model's config.json (the stand-ins of tests/helpers/hubcache.py,
the same files `resdyn plan` validates the presets against offline), under a dispatch mode that
counts live bytes (:mod:`resdyn.beyond.memtrace`). Prints one Markdown row per rule × model: the
traced peak, the plan's device memory (``resdyn.cluster.cost``, priced for an H100), their ratio.
Meta tensors do no arithmetic: the whole table takes a few minutes on one core. Asserts nothing.

    python benchmarks/memory_trace.py                     # both presets, every model
    python benchmarks/memory_trace.py --models llama31_8b,qwen25_32b --rules lens,jacobians
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

PRESETS = ("paper-a.yaml", "paper-b.yaml")
RULES = ("jacobians", "activations", "lens", "lens_metrics", "causal")


def hf_config(repo: str):
    """The transformers config object of a stand-in's config.json (a multimodal model's text tower)."""
    from transformers import AutoConfig

    from helpers import hubcache

    raw = dict(hubcache.PAPER_STANDINS[repo])
    raw = dict(raw["text_config"]) if "text_config" in raw else raw
    return AutoConfig.for_model(**raw)


def trace(rule: str, model, config: dict, name: str) -> float:
    """Traced device peak of one job of ``rule`` (bytes)."""
    from resdyn.beyond import memtrace
    from resdyn.pipeline import config as rc
    from resdyn.study_b.readout import k_from_fraction

    mc, T = rc.model_config(config, name), config["samples"]["length"]
    if rule == "jacobians":
        layers = rc.block_layers(rc.layer_blocks(config, name)[-1])
        return memtrace.trace_jacobians(model, layers, T, mc["jacobian"]["positions"])
    if rule == "activations":
        return memtrace.trace_activations(model, T, mc["activations"]["skip_positions"], mc["activations"]["dtype"])
    if rule == "lens":
        return memtrace.trace_lens(model, T, mc["lens"])
    if rule == "lens_metrics":
        return memtrace.trace_lens_metrics(model, T)
    cc = mc["causal"]
    k = k_from_fraction(model.config.hidden_size, cc["k_fraction"])
    return memtrace.trace_causal(model, T, min(cc["n_samples"], mc["samples"]["n"]), k)


def planned(rule: str, config: dict, name: str) -> float:
    """The plan's device memory of the same job (bytes), priced for an H100."""
    from resdyn.pipeline import config as rc
    from resdyn.pipeline import dag

    w = {"model": name, "ckpt": rc.checkpoints(config, name)[-1]}
    if rule == "jacobians":
        w["block"] = rc.layer_blocks(config, name)[-1]
    return dag.job_cost(config, rule, w, "h100").device_bytes


def rules_of(config: dict) -> list[str]:
    from resdyn.pipeline import config as rc

    out = ["jacobians"] if rc.runs(config, "A") else []
    return out + ["activations"] + (["lens", "lens_metrics", "causal"] if rc.runs(config, "B") else [])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="", help="comma-separated model keys (default: every model of both presets)")
    ap.add_argument("--rules", default="", help=f"comma-separated rules of {RULES} (default: all)")
    args = ap.parse_args()
    only_models = {m for m in args.models.split(",") if m}
    only_rules = {r for r in args.rules.split(",") if r}

    import torch

    from helpers import hubcache

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as cache:
        hubcache.build_paper_standins(Path(cache), [REPO / "configs" / p for p in PRESETS])
        os.environ.update(HF_HUB_CACHE=cache, HF_HUB_OFFLINE="1")
        from resdyn.beyond import memtrace
        from resdyn.pipeline import config as rc

        print("| preset | model | rule | traced GB | plan GB | plan / traced | trace s |")
        print("|---|---|---|---:|---:|---:|---:|")
        for preset in PRESETS:
            config = rc.load_config(REPO / "configs" / preset)
            for name, m in config["models"].items():
                if only_models and name not in only_models:
                    continue
                model = memtrace.meta_model(hf_config(m["repo"]), getattr(torch, m.get("dtype", "float32")))
                for rule in rules_of(config):
                    if only_rules and rule not in only_rules:
                        continue
                    t0 = time.process_time()
                    got = trace(rule, model, config, name)
                    plan = planned(rule, config, name)
                    print(
                        f"| {preset.removesuffix('.yaml')} | {name} | {rule} | {got / 1e9:.2f} | {plan / 1e9:.2f} "
                        f"| {plan / got:.2f} | {time.process_time() - t0:.0f} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
