"""Every source path a docstring or comment names exists, so the prose cannot point at a file that moved.

Where: every comment and every docstring (module, class, function) of the Python files under src/ and
tests/, and every comment line of .ci/run.

What counts as a path:
- a word ending in `.py` or `.sh`, with or without folders (`conftest.py`, `runtime/engine.py`);
- a word starting with one of the repository's top folders and a slash (`src/`, `tests/`, `docs/`,
  `benchmarks/`, `.ci/`): a file or a folder, of any kind. A `*` is a glob and must match something.

How it resolves:
- a bare file name (`conftest.py`) means a file beside the one that names it, or one of the package's
  top-level modules (`ladder.py`, `cli.py`);
- a path with folders is relative to the repository root, or to src/gpt2ladder/ when its first folder
  is one of the package's layers (`runtime/engine.py`);
- a path whose first folder is neither is another project's (`tiktoken_ext/openai_public.py`) and is
  not checked, nor is a bare name right after a possessive (`llm.c's data_common.py`).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from test_layering import LAYERS

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "gpt2ladder"
TOP_FOLDERS = ("src", "tests", "docs", "benchmarks", ".ci")
SOURCE = re.compile(r"(?<![\w/.{-])((?:[\w*.-]+/)*[\w*-]+\.(?:py|sh))(?!\w)")
REPOSITORY = re.compile(r"(?<![\w/.{-])((?:src|tests|docs|benchmarks|\.ci)/[\w./*-]*)")


def named_paths(text: str) -> dict[str, int]:
    """The paths a piece of prose names, by the module docstring's rule: {path: its line in the text, from 0}."""
    found = sorted((m.start(), m.group(1).rstrip(".,")) for pattern in (SOURCE, REPOSITORY)
                   for m in pattern.finditer(text) if "/" in m.group(1) or not _after_possessive(text, m.start()))
    return {name: text.count("\n", 0, start) for start, name in reversed(found)}  # reversed: the first line wins


def _after_possessive(text: str, start: int) -> bool:
    """Whether the word at `start` follows "X's ": another project's file, as in "nanoGPT's prepare.py"."""
    return text[max(0, start - 3):start] in ("'s ", "\u2019s ")


def _exists(base: Path, path: str) -> bool:
    return any(base.glob(path)) if "*" in path else (base / path).exists()


def missing(path: str, named_in: Path) -> bool:
    """Whether `path`, named in the file `named_in`, names nothing that exists."""
    first = path.split("/")[0]
    if first in TOP_FOLDERS:
        return not _exists(ROOT, path)
    if "/" not in path:
        return not (_exists(named_in.parent, path) or _exists(PACKAGE, path))
    if first in LAYERS:
        return not _exists(PACKAGE, path)
    return False  # another project's file


def prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of a Python file, or every comment line of a script."""
    source = path.read_text()
    if path.suffix != ".py":
        return [(i, line) for i, line in enumerate(source.splitlines(), 1)
                if line.lstrip().startswith("#") and not line.startswith("#!")]
    texts = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(source).readline)
             if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                texts.append((node.body[0].lineno, doc))
    return texts


FILES = sorted([*(ROOT / "src").rglob("*.py"), *(ROOT / "tests").rglob("*.py"), ROOT / ".ci" / "run"])


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_named_in_prose_exists(path):
    stale = [f"line {line + offset}: {name}" for line, text in prose(path)
             for name, offset in named_paths(text).items() if missing(name, path)]
    assert not stale, f"{path.relative_to(ROOT)} names paths that do not exist: {'; '.join(stale)}"


def test_the_rule_finds_a_stale_path_and_passes_a_good_one():
    here = PACKAGE / "runtime" / "hardware.py"
    text = ("Decisions live in `rungs.py` and measure/doctor.py, beside engine.py;\ntests/golden/*.json and "
            "tests/test_gpu.py pin them, as tiktoken_ext/openai_public.py and llm.c's data_common.py do; see "
            "matplotlib.pyplot.")
    names = named_paths(text)
    assert sorted(names) == ["engine.py", "measure/doctor.py", "rungs.py", "tests/golden/*.json",
                             "tests/test_gpu.py", "tiktoken_ext/openai_public.py"]
    assert names["rungs.py"] == 0 and names["tests/test_gpu.py"] == 1
    assert sorted(n for n in names if missing(n, here)) == ["rungs.py", "tests/test_gpu.py"]


def test_a_script_contributes_its_comment_lines_only():
    lines = prose(ROOT / ".ci" / "run")
    assert lines and all(text.lstrip().startswith("#") for _, text in lines)
    assert any("tests/" in text for _, text in lines)  # .ci/run names the test it may skip
