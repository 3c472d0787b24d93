"""One table of defaults (`gpt2ladder/defaults.py`): a config or the optimizer built without a value takes what
the command decides on a CPU with no flags, and no layer below the commands writes a default number of its own."""

import ast
import dataclasses
from pathlib import Path

import pytest
import torch

from gpt2ladder import defaults
from gpt2ladder.cli import build_parser
from gpt2ladder.runtime.hardware import detect

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "gpt2ladder"
CPU = torch.device("cpu")
# Where a command's machine decides (rungs resolved against it, the compile backend from the environment) or the
# shape is looked up: not a default of the table.
DECIDED_ELSEWHERE = {"rungs", "compile_backend", "model"}


def _settings(cfg) -> dict:
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in DECIDED_ELSEWHERE}


def test_a_train_config_without_values_is_what_train_decides_on_a_cpu():
    from gpt2ladder.commands.train import config_from_args
    from gpt2ladder.training.config import TrainConfig

    args = build_parser().parse_args(["train", "--device", "cpu"])
    cfg, _ = config_from_args(args, CPU, detect(CPU), notify=lambda line: None)
    assert _settings(TrainConfig()) == _settings(cfg)


def test_a_parity_config_without_values_is_what_parity_decides_on_a_cpu():
    from gpt2ladder.commands.parity import config_from_args
    from gpt2ladder.measure.parity import ParityConfig

    cfg = config_from_args(build_parser().parse_args(["parity", "--device", "cpu"]), CPU, detect(CPU))
    assert _settings(ParityConfig()) == _settings(cfg)


@pytest.mark.parametrize("command", ["profile", "bench"])
def test_a_timing_config_without_values_takes_the_flags_defaults_on_a_cpu(command):
    from gpt2ladder.measure.bench import BenchConfig
    from gpt2ladder.measure.profile import ProfileConfig

    cfg = {"profile": ProfileConfig, "bench": BenchConfig}[command]()
    args = build_parser().parse_args([command, "--device", "cpu"])
    table = defaults.defaults(command, CPU)
    for name in ("preset", "batch_size", "seq_len", "steps", "warmup", "seed"):
        given = getattr(args, name, None)
        assert getattr(cfg, name) == (table[name] if given is None else given), name


def test_the_optimizer_settings_are_the_tables():
    from gpt2ladder.runtime.engine import OptimConfig

    assert dataclasses.asdict(OptimConfig()) == defaults.OPTIM
    assert OptimConfig().muon_lr == defaults.MUON_RATES["muon_lr"]


CONFIGS = {"training/config.py": "TrainConfig", "runtime/engine.py": "OptimConfig",
           "measure/parity.py": "ParityConfig", "measure/profile.py": "ProfileConfig",
           "measure/bench.py": "BenchConfig"}


def literal_numbers(source: str, name: str) -> list[str]:
    """The fields of class `name` whose default is a number written in place."""
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == name)
    return [f.target.id for f in cls.body if isinstance(f, ast.AnnAssign) and isinstance(f.value, ast.Constant)
            and isinstance(f.value.value, (int, float)) and not isinstance(f.value.value, bool)]


@pytest.mark.parametrize("path, name", CONFIGS.items())
def test_no_config_below_the_commands_writes_a_default_number_of_its_own(path, name):
    assert literal_numbers((PACKAGE / path).read_text(), name) == []


def test_the_rule_finds_a_number_and_passes_the_tables_value_none_and_a_switch():
    source = "class C:\n    a: int = 4\n    b: float = D['lr']\n    c: int | None = None\n    d: bool = False\n"
    assert literal_numbers(source, "C") == ["a"]


def test_sample_and_eval_take_their_defaults_from_the_table():
    from gpt2ladder.commands.sample import DEFAULT_NEW_TOKENS
    from gpt2ladder.evals.runner import BATCH_SIZE

    args = build_parser().parse_args(["sample", "run"])
    same = defaults.DEFAULTS["sample"]["any"]
    assert {k: getattr(args, k) for k in ("num_samples", "temperature", "top_k", "seed")} == {
        k: same[k] for k in ("num_samples", "temperature", "top_k", "seed")}
    assert args.num_tokens is None and DEFAULT_NEW_TOKENS == same["num_tokens"]  # None: the context may cut it
    assert BATCH_SIZE == {"cuda": defaults.defaults("eval", torch.device("cuda"))["batch_size"],
                          "cpu": defaults.defaults("eval", CPU)["batch_size"]}
