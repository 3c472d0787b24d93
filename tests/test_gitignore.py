"""Following the README leaves a clean checkout: every folder its examples write to is ignored by git."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def example_outputs(readme: str) -> set[str]:
    """The relative folders the README's shell examples write to: each `--out DIR`, export's DIR and
    prepare's OUT."""
    outputs = set()
    for block in re.findall(r"```bash\n(.*?)```", readme, re.S):
        for line in block.splitlines():
            words = line.split("#")[0].split()
            outputs.update(words[i + 1] for i, w in enumerate(words[:-1]) if w == "--out")
            for command in ("export", "prepare"):
                if command in words[:-2]:
                    outputs.add(words[words.index(command) + 2])
    return {out for out in outputs if not out.startswith(("/", "$", "~"))}


def test_the_readme_examples_write_only_where_git_does_not_look():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    outputs = example_outputs((ROOT / "README.md").read_text())
    assert {"runs/shakespeare", "runs/edu10B", "data/edu10B"} <= outputs  # the examples are found
    for out in sorted(outputs):
        written = f"{out}/ladder.json"  # a file inside: git ignores a folder pattern for what is under it
        check = subprocess.run(["git", "check-ignore", "--no-index", "-q", written], cwd=ROOT)
        assert check.returncode == 0, f"{out}/ is not ignored by git"


def test_benchmark_runs_land_where_git_does_not_look():
    """benchmarks/run.sh's results folders hold raw logs and dumps; only benchmarks/records/ is committed."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    ignored = subprocess.run(["git", "check-ignore", "--no-index", "-q", "benchmarks/results/NAME/logs/bench.log"],
                             cwd=ROOT)
    kept = subprocess.run(["git", "check-ignore", "--no-index", "-q", "benchmarks/records/NAME/record.json"], cwd=ROOT)
    assert ignored.returncode == 0 and kept.returncode == 1
