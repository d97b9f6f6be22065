"""Fit one tuned-lens translator per layer by distillation; save ours and the tuned-lens format."""

from pathlib import Path

from resdyn import artifacts
from resdyn.lm import models
from resdyn.provenance import sidecars
from resdyn.study_b import lens, lens_import

with sidecars.step(snakemake) as step:
    p = snakemake.params
    step.pin_numerics(models.pick_device(p.device))
    record = artifacts.CheckpointRecord.read(snakemake.input.ckpt)
    model, _ = models.load_model(record, p.device, placement=p.placement)
    meta = dict(
        model_id=record.get("repo") or record["model"],
        model_revision=record.get("revision") or record["checkpoint"],
        model_hash=record["content_hash"],
    )
    out = Path(snakemake.output[0])
    if p.source:  # a published tuned lens, checked against this model, instead of training
        folder = lens_import.fetch_tuned_lens(
            p.source["path"], p.source["repo"], p.source["revision"], p.source["repo_type"]
        )
        fitted = lens_import.import_tuned_lens(folder, model, source=p.source, meta=meta)
    else:
        ids, _, sattrs = artifacts.Samples.read(snakemake.input.tokens)
        opts = dict(p.options)
        opts["warmup_steps"] = opts.pop("warmup")
        batch = max(1, opts["tokens_per_step"] // ids.shape[1])
        train = lens.shuffled_rows(ids[: p.n_train], opts["seed"]) if p.fresh else ids[: p.n_train]
        fitted = lens.train_lens(
            model,
            lens.token_batches(train, batch),
            heldout_batches=lens.token_batches(ids[p.n_train :], batch),
            checkpoint=artifacts.LensCheckpoint.path(out),
            checkpoint_every=p.checkpoint_every,
            fresh_tokens=p.fresh,
            **meta,
            **opts,
        )
    fitted.save(out)
    fitted.export_tuned_lens(out / artifacts.LensFolder.TUNED_LENS_DIR)
