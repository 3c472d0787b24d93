"""`train` and `bench` decide everything from their flags into one frozen request first and read only that
after: a flag read once the request exists fails here. On train's path the step's setup is computed once and
passed on (the size check and the run take the same)."""

import json
import sys

import pytest

from gpt2ladder import ladder
from gpt2ladder.cli import build_parser


class Flags:
    """The parsed flags; reading one once `frozen` is set fails the test."""

    def __init__(self, argv: list[str]):
        self.__dict__.update(_parsed=build_parser().parse_args(argv), frozen=False)

    def __getattr__(self, name: str):
        if self.frozen:
            raise AssertionError(f"the flag {name!r} was read after the command had decided its request")
        return getattr(self._parsed, name)


def _freeze_after(monkeypatch, module, name: str, flags: Flags) -> None:
    real = getattr(module, name)

    def decided(*args, **kwargs):
        request = real(*args, **kwargs)
        flags.frozen = True
        return request

    monkeypatch.setattr(module, name, decided)


def _count_setups(monkeypatch) -> list[tuple[str, ...]]:
    """Every call of ladder.setup_for, through whichever module's name for it, as the rungs it was given."""
    calls, real = [], ladder.setup_for

    def counted(names):
        calls.append(tuple(names))
        return real(names)

    for module in [m for n, m in sys.modules.items() if n.startswith("gpt2ladder")]:
        if getattr(module, "setup_for", None) is real:
            monkeypatch.setattr(module, "setup_for", counted)
    return calls


def test_train_reads_no_flag_after_its_request_and_computes_the_setup_once(shakespeare_cache, tmp_path,
                                                                           monkeypatch):
    import gpt2ladder.commands.train as command

    monkeypatch.setenv("GPT2LADDER_COMPILE_BACKEND", "eager")
    flags = Flags(["train", "--device", "cpu", "--rungs", "baseline,flash", "--steps", "2", "--batch-size", "2",
                   "--seq-len", "32", "--tokens-per-step", "64", "--eval-every", "0", "--ckpt-every", "0",
                   "--out", str(tmp_path / "run"), "--no-progress"])
    _freeze_after(monkeypatch, command, "train_request", flags)
    setups = _count_setups(monkeypatch)
    assert command.train_command(flags) == 0
    assert flags.frozen and (tmp_path / "run" / "ckpt.pt").is_file()
    rungs = tuple(json.loads((tmp_path / "run" / "config.json").read_text())["train_config"]["rungs"])
    assert setups.count(rungs) == 1, setups


def test_bench_reads_no_flag_after_its_request(shakespeare_cache, tmp_path, monkeypatch, capsys):
    import gpt2ladder.commands.bench as command

    flags = Flags(["bench", "--device", "cpu", "--rungs", "baseline", "--steps", "1", "--warmup", "0",
                   "--batch-size", "2", "--seq-len", "32", "--out", str(tmp_path / "bench"), "--no-progress"])
    _freeze_after(monkeypatch, command, "bench_request", flags)
    assert command.bench_command(flags) == 0
    assert flags.frozen and (tmp_path / "bench" / "ladder.json").is_file()


@pytest.mark.parametrize("command, decide", [("train", "train_request"), ("bench", "bench_request")])
def test_the_request_is_frozen(command, decide):
    import dataclasses
    import importlib

    module = importlib.import_module(f"gpt2ladder.commands.{command}")
    request_type = {"train": "TrainRequest", "bench": "BenchRequest"}[command]
    assert callable(getattr(module, decide))
    assert getattr(module, request_type).__dataclass_params__.frozen
    assert "cfg" in {f.name for f in dataclasses.fields(getattr(module, request_type))}
