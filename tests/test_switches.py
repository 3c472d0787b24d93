"""The step's code holds no switched-off path: a module-level `NAME = False` in the layers a step runs through
guards code the step never takes (only a test could turn it on), so a path that lost its measurement is taken out,
with its record saying where its code lives in history, rather than left behind a switch."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "gpt2ladder"
HOT = ("kernels", "model", "speedups", "runtime")


def switched_off(source: str) -> list[str]:
    """The module-level names a source sets to False (plain or annotated assignments)."""
    names = []
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        value = getattr(node, "value", None)
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(value, ast.Constant) and value.value is False:
            names += [t.id for t in targets if isinstance(t, ast.Name)]
    return names


@pytest.mark.parametrize("layer", HOT)
def test_no_module_of_the_step_keeps_a_switched_off_path(layer):
    found = {str(p.relative_to(PACKAGE)): names for p in sorted((PACKAGE / layer).rglob("*.py"))
             if (names := switched_off(p.read_text()))}
    assert not found, f"switched-off paths in the step's code: {found}"


def test_the_rule_finds_plain_and_annotated_switches_and_passes_others():
    source = "A = False\nB: bool = False\nC = True\nD = 0\ndef f():\n    E = False\n"
    assert switched_off(source) == ["A", "B"]
