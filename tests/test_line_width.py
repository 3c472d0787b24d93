"""Every git-tracked Python file keeps its lines within 120 characters."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 120


def test_no_tracked_python_line_is_wider_than_120():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip(f"git ls-files failed: {listed.stderr.strip()}")
    too_wide = [f"{name}:{number}: {len(line)}" for name in listed.stdout.splitlines() if (ROOT / name).is_file()
                for number, line in enumerate((ROOT / name).read_text(encoding="utf-8").splitlines(), 1)
                if len(line) > WIDTH]
    assert not too_wide, f"lines wider than {WIDTH} characters:\n" + "\n".join(too_wide)
