"""Jobs that run no model start without torch or transformers (importing torch costs seconds per job).

Each workflow script's top-level imports are executed in a fresh interpreter; only the scripts in
:data:`MODEL_SCRIPTS` (they load, run or train a model or a tokenizer) may pull in torch or
transformers. One child for all light scripts together (if the union is torch-free, each is);
on a failure the culprit scripts are named one by one.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "workflow" / "scripts"
HEAVY = ("torch", "transformers")

#: Scripts that legitimately import torch: each loads and runs (or trains) a model.
MODEL_SCRIPTS = {
    "activations",  # runs the model, stores boundary states
    "causal",  # runs the model under interventions
    "jacobians",  # the Jacobian engine (torch.func)
    "lens",  # trains / imports tuned-lens translators
    "lens_metrics",  # runs the model through the lens
    "zoo_train",  # trains the zoo models
}


def script_imports(path: Path) -> str:
    """The script's top-level import statements, as source."""
    tree = ast.parse(path.read_text())
    return "\n".join(ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)))


def loaded_after(imports: str, modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` are in sys.modules after running ``imports`` in a fresh interpreter."""
    code = f"import sys, json\n{imports}\nprint(json.dumps([m for m in {modules!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def heavy_after(imports: str) -> list[str]:
    """Which of :data:`HEAVY` are in sys.modules after running ``imports`` in a fresh interpreter."""
    return loaded_after(imports, HEAVY)


def test_model_scripts_exist():
    names = {p.stem for p in SCRIPTS.glob("*.py")}
    assert MODEL_SCRIPTS <= names, MODEL_SCRIPTS - names
    assert len(names - MODEL_SCRIPTS) >= 15  # the light majority: spectra, schur, rss, bootstrap, …


def test_light_scripts_import_neither_torch_nor_transformers():
    light = sorted(p for p in SCRIPTS.glob("*.py") if p.stem not in MODEL_SCRIPTS)
    if not heavy_after("\n".join(script_imports(p) for p in light)):
        return
    culprits = {p.stem: heavy for p in light if (heavy := heavy_after(script_imports(p)))}
    assert not culprits, f"light scripts import heavy modules: {culprits}"


def test_no_script_imports_scipy_stats_at_start():
    """scipy.stats (~0.5 s of import) loads inside the functions that use it, not at a job's start."""
    all_scripts = sorted(SCRIPTS.glob("*.py"))
    if "scipy.stats" not in loaded_after("\n".join(script_imports(p) for p in all_scripts), ("scipy.stats",)):
        return
    culprits = [p.stem for p in all_scripts if loaded_after(script_imports(p), ("scipy.stats",))]
    assert not culprits, f"scripts import scipy.stats at start: {culprits}"


def test_the_check_sees_torch():
    """The detector is live: a model script's imports do load torch, scipy.stats is seen when loaded."""
    assert "torch" in heavy_after(script_imports(SCRIPTS / "jacobians.py"))
    assert loaded_after("import scipy.stats", ("scipy.stats",)) == ["scipy.stats"]
