# Beyond the two studies: the A<->B bridge, a causal test of readout subspaces, bootstrap
# intervals, the replication scorecard and the paper table (stated figures vs this run).

from resdyn.beyond.scorecard import scaling_group


rule bridge:
    input:
        blocks=jacobian_blocks,
        lens="results/{model}/{ckpt}/lens",
        spectra="results/{model}/{ckpt}/spectra.tsv",
        bottleneck="results/{model}/{ckpt}/bottleneck.tsv",
        rss="results/{model}/{ckpt}/rss.tsv",
        phases="results/{model}/{ckpt}/phases.json",
    output:
        table=report(
            "results/{model}/{ckpt}/bridge.tsv",
            caption="../report/bridge.rst",
            category="Beyond the studies",
            subcategory="bridge",
            labels={"model": "{model}", "checkpoint": "{ckpt}", "table": "bridge"},
        ),
        alignment="results/{model}/{ckpt}/bridge_alignment.tsv",
    log:
        "logs/bridge/{model}/{ckpt}.log",
    benchmark:
        "benchmarks/out/bridge/{model}/{ckpt}.tsv"
    conda:
        "../../envs/resdyn.yaml"
    threads: cost("bridge", "threads")
    resources:
        mem_mb=cost("bridge", "mem_mb"),
        runtime=cost("bridge", "runtime"),
    params:
        k_fraction=config["bridge"]["k_fraction"],
        n_random=config["bridge"]["n_random"],
        seed=config["bridge"]["seed"],
        complex_tol=config["bridge"]["complex_tol"],
        code=code("bridge"),
    script:
        "../scripts/bridge.py"


rule causal:
    input:
        ckpt=ckpt_record,
        integrity=ckpt_integrity,
        lens="results/{model}/{ckpt}/lens",
        samples="results/{model}/samples.h5",
        phases="results/{model}/{ckpt}/phases.json",
    output:
        report(
            "results/{model}/{ckpt}/causal.tsv",
            caption="../report/causal.rst",
            category="Beyond the studies",
            subcategory="causal",
            labels={"model": "{model}", "checkpoint": "{ckpt}", "table": "causal"},
        ),
    log:
        "logs/causal/{model}/{ckpt}.log",
    benchmark:
        "benchmarks/out/causal/{model}/{ckpt}.tsv"
    priority: 1
    conda:
        "../../envs/resdyn.yaml"
    threads: config["threads"]
    resources:
        mem_mb=cost("causal", "mem_mb"),
        runtime=cost("causal", "runtime"),
        gpu=cost("causal", "gpu"),
    params:
        k_fraction=config["causal"]["k_fraction"],
        n_random=config["causal"]["n_random"],
        n_samples=of_model("causal", "n_samples"),
        seed=config["causal"]["seed"],
        placement=setting(lambda w: dag.placement_param(config, "causal", w)),
        device=setting(of_model("device")),
        code=code("causal", family=model_family),
    script:
        "../scripts/causal.py"


rule bootstrap:
    input:
        blocks=jacobian_blocks,
        spectra="results/{model}/{ckpt}/spectra.tsv",
    output:
        table=report(
            "results/{model}/{ckpt}/bootstrap.tsv",
            caption="../report/bootstrap.rst",
            category="Beyond the studies",
            subcategory="uncertainty",
            labels={"model": "{model}", "checkpoint": "{ckpt}", "table": "bootstrap"},
        ),
        replicates="results/{model}/{ckpt}/bootstrap_replicates.tsv",
        first_n=report(
            "results/{model}/{ckpt}/bootstrap_first_n.tsv",
            caption="../report/bootstrap_first_n.rst",
            category="Beyond the studies",
            subcategory="uncertainty",
            labels={
                "model": "{model}",
                "checkpoint": "{ckpt}",
                "table": "bootstrap_first_n",
            },
        ),
    log:
        "logs/bootstrap/{model}/{ckpt}.log",
    benchmark:
        "benchmarks/out/bootstrap/{model}/{ckpt}.tsv"
    conda:
        "../../envs/resdyn.yaml"
    threads: cost("bootstrap", "threads")
    resources:
        mem_mb=cost("bootstrap", "mem_mb"),
        runtime=cost("bootstrap", "runtime"),
        gpu=cost("bootstrap", "gpu"),
    params:
        n_resamples=config["bootstrap"]["n_resamples"],
        seed=config["bootstrap"]["seed"],
        ci=config["bootstrap"]["ci"],
        complex_tol=config["bootstrap"]["complex_tol"],
        method=config["bootstrap"]["method"],
        interval=config["bootstrap"]["interval"],
        per_depth_erank=config["bootstrap"]["per_depth_erank"],
        first_n=config["bootstrap"]["first_n"],
        device=setting(lambda w: rcost.linalg_device(model_cfg(w))),
        code=code("bootstrap"),
    script:
        "../scripts/bootstrap.py"


rule scorecard:
    input:
        unpack(scorecard_inputs),
    output:
        report(
            "results/{model}/scorecard.tsv",
            caption="../report/scorecard.rst",
            category="Scorecard",
            labels={"model": "{model}", "table": "replication scorecard"},
        ),
    log:
        "logs/scorecard/{model}.log",
    benchmark:
        "benchmarks/out/scorecard/{model}.tsv"
    conda:
        "../../envs/resdyn.yaml"
    params:
        ckpts=lambda w: ckpts(w.model),
        group=lambda w: scaling_group(config, w.model),
        complex_tol=config["bootstrap"]["complex_tol"],
        level=config["bootstrap"]["ci"],
        studies=sorted(config["studies"]),
        claims=CLAIMS_SHA256,
        code=code("scorecard"),
    script:
        "../scripts/scorecard.py"


rule paper_comparison:
    input:
        unpack(paper_comparison_inputs),
    output:
        report(
            "results/paper_comparison.tsv",
            caption="../report/paper_comparison.rst",
            category="At a glance: the papers",
            labels={"table": "stated figures vs this run"},
        ),
    log:
        "logs/paper_comparison/paper_comparison.log",
    benchmark:
        "benchmarks/out/paper_comparison/paper_comparison.tsv"
    conda:
        "../../envs/resdyn.yaml"
    params:
        models=MODELS,
        ckpts={m: ckpts(m) for m in MODELS},
        lens_ckpts={m: lens_final(m) for m in MODELS},
        groups=config["scaling"]["groups"],
        studies=sorted(config["studies"]),
        complex_tol=config["bootstrap"]["complex_tol"],
        complex_rule=config["spectra"]["complex_rule"],
        n_samples=config["samples"]["n"],
        claims=CLAIMS_SHA256,
        code=code("paper_comparison"),
    script:
        "../scripts/paper_comparison.py"


rule sensitivity:
    input:
        unpack(sensitivity_inputs),
    output:
        report(
            "results/sensitivity.tsv",
            caption="../report/sensitivity.rst",
            category="At a glance: the papers",
            labels={
                "table": "stated figures vs this run: every open choice both ways"
            },
        ),
    log:
        "logs/sensitivity/sensitivity.log",
    benchmark:
        "benchmarks/out/sensitivity/sensitivity.tsv"
    conda:
        "../../envs/resdyn.yaml"
    params:
        models=MODELS,
        ckpts={m: ckpts(m) for m in MODELS},
        lens_ckpts={m: lens_final(m) for m in MODELS},
        pairs=[[m, c] for m in MODELS for c in ckpts(m)],
        groups=config["scaling"]["groups"],
        n_layers={
            m: config["models"][m]["n_layers"]
            for members in config["scaling"]["groups"].values()
            for m in members
        },
        studies=sorted(config["studies"]),
        complex_tol=config["bootstrap"]["complex_tol"],
        complex_rule=config["spectra"]["complex_rule"],
        n_samples=config["samples"]["n"],
        defaults=sensitivity_defaults(),
        boundary_rule=config["topology"]["boundary_rule"],
        gain=config["topology"]["gain"],
        fdr_q=config["topology"]["fdr_q"],
        k_fractions=config["readout"]["k_fractions"],
        phase_k_fraction=config["readout"]["phase_k_fraction"],
        smoothing=config["phases"]["smoothing"],
        window=config["phases"]["window"],
        max_gflop=config["sensitivity"]["max_gflop"],
        claims=CLAIMS_SHA256,
        code=code("sensitivity"),
    script:
        "../scripts/sensitivity.py"
