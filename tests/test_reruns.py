"""docs/reruns.md lists, per rule, the params that rerun it and the settings that do not: the
list is derived here from workflow/rules/*.smk and must match the docs (a rule or param added
without documenting whether it reruns jobs fails this test)."""

import re
from pathlib import Path

from resdyn.plots.catalogue import TRAJECTORY_SCOPES

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "reruns.md"
#: Directives that end a rule's params block.
_NEXT = re.compile(
    r"^\s*(script|shell|run|wrapper|notebook|input|output|log|benchmark|threads|resources|"
    r"conda|priority|wildcard_constraints|message|group|localrule|cache|retries|params):"
)


def _config_keys(text: str) -> list[str]:
    """``config["a"]["b"]`` -> a.b; a subscript that is not a string literal -> <name>."""
    keys = []
    for m in re.finditer(r"\bconfig((?:\[[^\]\[]+\])+)", text):
        parts = re.findall(r"\[([^\]]+)\]", m[1])
        keys.append(".".join(p.strip("\"'") if p[0] in "\"'" else f"<{p.split('.')[-1]}>" for p in parts))
    return keys


def rule_params() -> dict[str, tuple[list[str], list[str]]]:
    """Rule -> (trigger params with their config keys, settings): ``name (key, …)`` strings."""
    out = {}
    for smk in sorted((ROOT / "workflow" / "rules").glob("*.smk")):
        lines = smk.read_text().splitlines()
        rule = None
        scopes = re.search(r"^FIGURE_SCOPES = \{(.*?)^\}", smk.read_text(), re.S | re.M)
        for i, line in enumerate(lines):
            m = re.match(r"^\s*rule (\w+):", line)
            if m:
                rule = m[1]
            elif re.match(r"^\s*rule:\s*$", line) and i + 2 < len(lines):
                # a rule written once for several names (the figure rules: rule figure_{scope})
                name = re.match(r'^\s*f?"(\w*)\{_scope\}"', lines[i + 2])
                rule = (name[1], re.findall(r'^\s*"(\w+)":', scopes[1], re.M)) if name and scopes else None
            if rule and re.match(r"^\s*params:\s*$", line):
                indent = len(line) - len(line.lstrip()) + 4
                block, j = [], i + 1
                while j < len(lines) and (not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) >= indent):
                    block.append(lines[j])
                    j += 1
                entries, cur = [], None
                for b in block:
                    if len(b) - len(b.lstrip()) == indent and re.match(r"^\s*\w+=", b):
                        cur = [b.strip()]
                        entries.append(cur)
                    elif cur is not None:
                        cur.append(b.strip())
                for name in [f"{rule[0]}{scope}" for scope in rule[1]] if isinstance(rule, tuple) else [rule]:
                    triggers, settings = [], []
                    for e in entries:
                        text = " ".join(e)
                        if text.startswith("**("):  # {"pairs": ...} for the trajectory scopes only
                            if name.removeprefix("figure_") in TRAJECTORY_SCOPES:
                                triggers += re.findall(r'\{"(\w+)":', text)
                            continue
                        param = text.split("=", 1)[0]
                        keys = sorted(set(_config_keys(text)))
                        label = f"{param} ({', '.join(keys)})" if keys else param
                        (settings if "setting(" in text else triggers).append(label)
                    out[name] = (triggers, settings)
    return out


def _split_cell(cell: str) -> list[str]:
    """The entries of a table cell: `;`-separated, backticks dropped, empty and `—` left out."""
    return [x.strip() for x in re.split(r";\s*", cell.replace("`", "")) if x.strip() not in ("", "—")]


def doc_table() -> dict[str, tuple[list[str], list[str]]]:
    """The table of docs/reruns.md: | rule | reruns when these params change | settings |."""
    out = {}
    text = DOC.read_text().split("| rule | reruns when these params change |", 1)[1]
    for line in text.split("\n\n", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            out[cells[0].strip("`")] = (_split_cell(cells[1]), _split_cell(cells[2]))
    return out


def markdown_rows() -> str:
    """The table rows as they belong in docs/reruns.md (print this after changing a rule)."""
    return "\n".join(
        f"| `{r}` | {'; '.join(f'`{x}`' for x in t) or '—'} | {'; '.join(f'`{x}`' for x in s) or '—'} |"
        for r, (t, s) in sorted(rule_params().items())
    )


def test_docs_list_every_rules_triggers_and_settings():
    derived = rule_params()
    assert len(derived) >= 20 and any(s for _, s in derived.values())  # not vacuous
    assert doc_table() == derived, "docs/reruns.md is out of date; its rows should read:\n" + markdown_rows()


def test_device_and_checkpoint_spacing_are_never_triggers():
    for rule, (triggers, settings) in rule_params().items():
        for t in triggers:
            assert not re.match(r"(device|checkpoint_every|threads|progress|log\w*)\b", t), (rule, t)
