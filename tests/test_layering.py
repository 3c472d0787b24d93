"""The package's folders are layers: a module imports only from its own layer or the ones below it.

Read from the source (every import statement, at any depth, except those under `if TYPE_CHECKING:`),
so a violation fails here before it can become an import cycle.
"""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "gpt2ladder"
# Lowest first. kernels import nothing else of the package; cli and __main__ sit on top.
LAYERS = ["version", "errors", "defaults", "kernels", "model", "speedups", "data", "runtime", "ladder", "report",
          "evals", "training", "measure", "api", "commands", "cli"]
# The package root (`gpt2ladder/__init__.py`) looks its API up in `api` on first use, so importing it from below
# runs back up the layers: it ranks with __main__, and only __main__ may import it (the version is in `version`).
RANK = {name: i for i, name in enumerate(LAYERS)} | {"__main__": len(LAYERS), "__init__": len(LAYERS)}


def _unit(module: str) -> str:
    """gpt2ladder.runtime.engine -> runtime; gpt2ladder.cli -> cli; gpt2ladder and gpt2ladder.__version__ (a name
    from the root) -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in RANK else "__init__"


def _imports(path: Path) -> list[str]:
    return _imports_in(path.read_text())


def _imports_in(source: str) -> list[str]:
    tree = ast.parse(source)
    skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
               and getattr(node.test, "id", None) == "TYPE_CHECKING" for n in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gpt2ladder"):
            found += [node.module] if node.module != "gpt2ladder" else [f"gpt2ladder.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name == "gpt2ladder" or a.name.startswith("gpt2ladder.")]
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))


def _violations(unit: str, imports: list[str]) -> list[str]:
    """What is wrong with a module of `unit` importing `imports` (module names), one line each."""
    found = []
    for module in imports:
        other = _unit(module)
        if unit == "kernels" and other != "kernels":
            found.append(f"imports {module}: kernels import nothing else of the package")
        if unit != "__init__" and RANK[other] > RANK[unit]:
            found.append(f"({unit}) imports {module} ({other}), a layer above it")
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_from_a_layer_above_it(path):
    rel = path.relative_to(PACKAGE)
    unit = rel.parts[0].removesuffix(".py")
    assert unit in RANK, f"{rel}: a new top-level unit must be placed in LAYERS"
    assert not _violations(unit, _imports(path)), rel


@pytest.mark.parametrize("source", ["from gpt2ladder import __version__", "import gpt2ladder",
                                    "from gpt2ladder import load", "import gpt2ladder.cli"])
def test_the_package_root_and_what_is_above_are_out_of_reach_below_main(source):
    """A layer's module that imports the package root (for its version, or an API name) fails, as one that imports
    a layer above it does; only __main__ and the root itself may."""
    assert _violations("report", _imports_in(source))
    if source != "import gpt2ladder.cli":
        assert _violations("cli", _imports_in(source))
    assert not _violations("__main__", _imports_in(source))
    assert not _violations("report", _imports_in("from gpt2ladder.version import __version__"))


def test_every_folder_is_a_layer():
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith("__")}
    assert folders <= set(LAYERS)


def test_no_source_file_cites_a_dated_results_folder():
    import re

    for path in MODULES:
        assert not re.search(r"(results|records)/20\d\d-", path.read_text()), \
            f"{path.relative_to(PACKAGE)} cites a dated record"


# What a measurement looks like in prose: a time in ms or us, a GPU named as where it ran, the results pages.
MEASURED = re.compile(r"\b\d+(\.\d+)? ?(ms|us|µs)\b|\bon (an|the|two|one) H\d00s?\b|H\d00's|"
                      r"docs/(results|experiments|diary)\.md")


def measured_figures(text: str) -> list[str]:
    """The measurements a source text states (a peak-FLOPs table or a device name example is not one)."""
    return [m.group(0) for m in MEASURED.finditer(text)]


def test_no_source_file_states_a_measured_figure():
    """How much a rung or kernel gained lives in its record (benchmarks/RECORDS.md), not in the code."""
    stated = {str(path.relative_to(PACKAGE)): measured_figures(path.read_text()) for path in MODULES}
    assert not {path: found for path, found in stated.items() if found}
    assert measured_figures("0.19 ms faster a step on an H200 (docs/results.md); 4 us each") == [
        "0.19 ms", "on an H200", "docs/results.md", "4 us"]
    assert measured_figures('PEAK = {"H200": 989e12}  # e.g. "NVIDIA H200"; 128 memsets a step') == []


def _module_names() -> dict[str, Path]:
    names = {}
    for path in MODULES:
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        names[".".join(("gpt2ladder", *parts)).removesuffix(".__init__")] = path
    return names


def _imported_modules(source: str, known: dict[str, Path]) -> set[str]:
    """The package's modules an import statement at any depth names: `from gpt2ladder.data import corpus` names
    gpt2ladder.data.corpus, `from gpt2ladder.data.text import TokenData` gpt2ladder.data.text."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gpt2ladder"):
            subs = {f"{node.module}.{a.name}" for a in node.names} & known.keys()
            found |= subs or ({node.module} & known.keys())
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names} & known.keys()
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles, done = [], set()

    def visit(node, path):
        for nxt in sorted(graph[node]):
            if nxt in path:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in done:
                visit(nxt, path + [nxt])
        done.add(node)

    for start in sorted(graph):
        if start not in done:
            visit(start, [start])
    return cycles


def test_no_two_modules_import_each_other_even_inside_a_function():
    """An import inside a function is how a circle hides from import time; a module's imports, at any depth,
    never lead back to it."""
    known = _module_names()
    graph = {name: _imported_modules(path.read_text(), known) - {name} for name, path in known.items()}
    # A module's own package is no circle: the package's lazy names load its children, not the reverse.
    graph = {name: {m for m in mods if not name.startswith(m + ".")} for name, mods in graph.items()}
    assert not _cycles(graph)
    circle = {"a": {"b"}, "b": {"c"}, "c": {"a"}}
    assert _cycles(circle) and not _cycles({"a": {"b"}, "b": set()})


# Where the machine is read: a command (and the Python API) detects its capabilities once and passes them down.
DETECTS = ("commands", "api", "cli")


def _detect_calls(source: str) -> list[int]:
    """The lines where `source` calls `detect` (runtime/hardware.py's), by name or as an attribute."""
    return [node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) == "detect"]


def test_no_layer_below_the_commands_detects_the_machine_itself():
    found = {str(p.relative_to(PACKAGE)): lines for p in MODULES
             if _unit("gpt2ladder." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts)) not in DETECTS
             and (lines := _detect_calls(p.read_text()))}
    assert not found, f"modules that detect the machine instead of taking the caller's capabilities: {found}"


def test_the_detect_rule_finds_a_call_by_name_or_attribute():
    assert _detect_calls("caps = detect(device) if caps is None else caps") == [1]
    assert _detect_calls("x = 1\ncaps = hardware.detect(device)") == [2]
    assert _detect_calls("text = 'detect(device)'\ndef detect(d): pass") == []
