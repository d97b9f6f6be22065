"""The paper table: each statement of the studies (the claims table) next to this run's number.

One row per (claim, model, checkpoint, measure) of ``results/paper_comparison.tsv``
(:class:`resdyn.artifacts.PaperComparison`): the study's figure as stated (with the model it
was stated for), this run's comparable number, its interval where one exists (bootstrap over
samples for study A's whole-model statistics, the OLS t-interval for phase-width slopes), the
unit, the table it comes from, and a verdict (``holds: …`` / ``does not hold: …`` /
``not testable: <reason>``, rules in :mod:`resdyn.beyond.verdicts`). A number that cannot be
given is a row with a ``reason``: the claim's study switched off (config key ``studies``), a
table or column the run lacks, a phase without layers, one checkpoint, or a claim id the
comparison does not know (a new line in resdyn/data/claims.tsv without code here).

How each claim's run value is computed: study A in :mod:`resdyn.beyond.paper_a`, study B in
:mod:`resdyn.beyond.paper_b` (docs/claims.md lists both; the choices are in docs/design.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from resdyn.beyond.paper_a import COMPARISONS_A, NO_LAYER_COUNTS
from resdyn.beyond.paper_b import COMPARISONS_B, SLOPE_CLAIMS, slopes
from resdyn.beyond.paper_rows import PAPER_COLUMNS, ModelTables, row

__all__ = ["ModelTables", "paper_comparison", "COMPARISONS", "PAPER_COLUMNS", "NO_LAYER_COUNTS", "GROUP_CLAIMS"]

#: claim id → the rows of one model
COMPARISONS = {**COMPARISONS_A, **COMPARISONS_B}
#: claims about a scaling group (one row per group, :func:`resdyn.beyond.paper_b.slopes`)
GROUP_CLAIMS = (*SLOPE_CLAIMS, "capacity_in_phase2")


def paper_comparison(
    claims: pd.DataFrame,
    models: Sequence[ModelTables],
    studies: Sequence[str] = ("A", "B"),
    phase_widths: pd.DataFrame | None = None,
    groups: Mapping[str, Sequence[str]] | None = None,
) -> pd.DataFrame:
    """The paper table of a run: :data:`PAPER_COLUMNS`, claims in the claims table's order.

    Args:
        claims: the claims table (:meth:`resdyn.artifacts.ClaimsTable.load`).
        models: the tables of each model (:class:`ModelTables`), in config order.
        studies: the studies that ran (config ``studies``); a claim of another study gets one
            row with the reason.
        phase_widths, groups: ``results/scaling/phase_widths.tsv`` and config
            ``scaling.groups`` for the slope claims.
    Every claim gets at least one row; a number that cannot be given has a reason, and every
    row has a verdict.
    """
    ran = sorted(set(studies))
    rows: list[dict] = []
    for claim in claims.to_dict("records"):
        cid = claim["claim_id"]
        if claim["study"] not in ran:
            rows.append(row(claim, "", "", "", reason=f"study {claim['study']} is not run (config studies: {ran})"))
        elif cid in GROUP_CLAIMS:
            rows += slopes(claim, phase_widths, groups or {})
        elif cid not in COMPARISONS:
            known = sorted([*COMPARISONS, *GROUP_CLAIMS])
            rows.append(
                row(
                    claim, "", "", "", reason=f"claim {cid!r} has no comparison in resdyn.beyond.paper (known: {known})"
                )
            )
        else:
            for t in models:
                rows += COMPARISONS[cid](claim, t)
    return pd.DataFrame(rows, columns=PAPER_COLUMNS)
