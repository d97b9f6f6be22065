# Figures: PNG + PDF with provenance in the metadata; one generic script, one rule per figure.


rule figure_ckpt:
    input:
        unpack(
            lambda w: {
                "eigenvalues": [f"results/{w.model}/{w.ckpt}/spectra.h5"],
                "operator": [f"results/{w.model}/{w.ckpt}/spectra.tsv"],
                "funnel": [f"results/{w.model}/{w.ckpt}/bottleneck.tsv"],
                "schur": [f"results/{w.model}/{w.ckpt}/schur.tsv"],
                "communities": [f"results/{w.model}/{w.ckpt}/communities_summary.tsv"],
                "coupling": [f"results/{w.model}/{w.ckpt}/coupling.tsv"],
                "coupling_henrici": [f"results/{w.model}/{w.ckpt}/coupling.tsv"],
                "lens": [f"results/{w.model}/{w.ckpt}/lens_metrics.tsv"],
                "rss": [
                    f"results/{w.model}/{w.ckpt}/rss.tsv",
                    f"results/{w.model}/{w.ckpt}/phases.json",
                ],
                "resolution": [f"results/{w.model}/{w.ckpt}/resolution.tsv"],
                "bridge": [
                    f"results/{w.model}/{w.ckpt}/bridge.tsv",
                    f"results/{w.model}/{w.ckpt}/phases.json",
                ],
                "causal": [f"results/{w.model}/{w.ckpt}/causal.tsv"],
                "uncertainty": [f"results/{w.model}/{w.ckpt}/bootstrap.tsv"],
                "phase_metrics": [
                    f"results/{w.model}/{w.ckpt}/geometry.tsv",
                    f"results/{w.model}/{w.ckpt}/phases.json",
                ],
            }[w.figure]
        ),
        studies=lambda w: studies_of(w.figure),
    output:
        png=report(
            "results/figures/{model}/{ckpt}/{figure}.png",
            caption="../report/figure.rst",
            category=lambda w: rc.figure_category(w.figure),
            labels=lambda w: {
                "model": w.model,
                "checkpoint": w.ckpt,
                "figure": w.figure,
            },
        ),
        pdf="results/figures/{model}/{ckpt}/{figure}.pdf",
    log:
        "logs/figures/{model}/{ckpt}/{figure}.log",
    benchmark:
        "benchmarks/out/figure_ckpt/{model}/{ckpt}/{figure}.tsv"
    wildcard_constraints:
        figure="|".join(rc.CKPT_FIGURES),
    conda:
        "../../envs/resdyn.yaml"
    params:
        plot=lambda w: rc.CKPT_FIGURES[w.figure],
        title=lambda w: f"{w.model} · {w.ckpt} · {w.figure}",
        caption=lambda w: rc.FIGURE_CAPTIONS[w.figure],
        dpi=config["figures"]["dpi"],
        code=code("figure"),
    script:
        "../scripts/figure.py"


rule figure_model:
    input:
        lambda w: {
            "training": [f"models/{w.model}/training.tsv"],
            "checkpoints": [f"results/{w.model}/checkpoints.tsv"],
            "significant": [f"results/{w.model}/coupling_counts.tsv"],
        }[w.figure],
        studies=lambda w: studies_of(w.figure),
    output:
        png=report(
            "results/figures/{model}/{figure}.png",
            caption="../report/figure.rst",
            category=lambda w: rc.figure_category(w.figure),
            labels=lambda w: {"model": w.model, "figure": w.figure},
        ),
        pdf="results/figures/{model}/{figure}.pdf",
    log:
        "logs/figures/{model}/{figure}.log",
    benchmark:
        "benchmarks/out/figure_model/{model}/{figure}.tsv"
    wildcard_constraints:
        figure="|".join(rc.MODEL_FIGURES),
    conda:
        "../../envs/resdyn.yaml"
    params:
        plot=lambda w: rc.MODEL_FIGURES[w.figure],
        title=lambda w: f"{w.model} · {w.figure}",
        caption=lambda w: rc.FIGURE_CAPTIONS[w.figure],
        dpi=config["figures"]["dpi"],
        code=code("figure"),
    script:
        "../scripts/figure.py"


rule figure_scaling:
    input:
        "results/scaling/widths.tsv",
        "results/scaling/phase_widths.tsv",
        studies=lambda w: studies_of("scaling"),
    output:
        png=report(
            "results/figures/scaling/phase_widths.png",
            caption="../report/figure.rst",
            category="Study B",
            subcategory="phases",
            labels={"figure": "phase width vs depth"},
        ),
        pdf="results/figures/scaling/phase_widths.pdf",
    log:
        "logs/figures/scaling.log",
    benchmark:
        "benchmarks/out/figure_scaling/scaling.tsv"
    conda:
        "../../envs/resdyn.yaml"
    params:
        plot="phase_width_scaling",
        title="phase width vs depth",
        caption=rc.FIGURE_CAPTIONS["scaling"],
        dpi=config["figures"]["dpi"],
        code=code("figure"),
    script:
        "../scripts/figure.py"
