"""benchmarks/warm_compile.py: which rungs it compiles ahead of a ladder, and the command each run is."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "warm_compile.py"


@pytest.fixture(scope="module")
def warm():
    spec = importlib.util.spec_from_file_location("warm_compile", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_only_the_rungs_whose_setup_compiles_are_warmed_each_with_the_rungs_below_it(warm):
    names = ["baseline", "tf32", "bf16", "compile", "flash", "vocab"]
    assert warm.compiled_prefixes(names) == [names[:4], names[:5], names[:6]]
    assert warm.compiled_prefixes(["baseline", "tf32", "bf16"]) == []


@pytest.mark.slow
def test_each_run_is_bench_for_one_step_without_inductors_tuning_cache(warm, tmp_path):
    cmd = warm.command(["baseline", "compile"], "cpu", str(tmp_path / "out"), ["--preset", "tiny"])
    assert cmd[cmd.index("--rungs") + 1] == "baseline,compile" and cmd[-2:] == ["--preset", "tiny"]
    assert "--last-only" in cmd and cmd[cmd.index("--steps") + 1] == "1"
    # the program it runs: Inductor's setting switched off, then the CLI with the arguments after it
    probe = cmd[2].replace("sys.exit(main(sys.argv[1:]))", "print(c.autotune_local_cache, sys.argv[1:])")
    out = subprocess.run([sys.executable, "-c", probe, "bench", "--help"], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False ['bench', '--help']", out.stderr[-2000:]
    usage = subprocess.run([sys.executable, "-c", cmd[2], "bench", "--help"], capture_output=True, text=True,
                           timeout=120)
    assert usage.returncode == 0 and usage.stdout.startswith("usage: gpt2ladder bench")
