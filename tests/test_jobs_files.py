"""The jobs files that wait for a GPU (benchmarks/README.md names them) hold gpt2ladder commands that parse: a flag
that was renamed or a rung spelled wrong would otherwise be found only on the GPU, after its call started."""

import re
import shlex
from pathlib import Path

import pytest

from gpt2ladder import ladder
from gpt2ladder.cli import build_parser
from gpt2ladder.errors import UsageError
from gpt2ladder.measure import race

JOBS = Path(__file__).resolve().parents[1] / "benchmarks" / "jobs"
READY = ("race-next.txt", "h200x2.txt", "h200x4.txt", "h200-seed1-check.txt", "h200-top-train-ddp.txt",
         "h200-ladder-next.txt", "h200-profile-next.txt")
SUBSHELL = re.compile(r"\$\((?:[^()]|\([^()]*\))*\)")  # $(...) and $((...)), one level of parentheses inside
COMMAND = re.compile(r"(?:\$G|-m gpt2ladder)\s+(.*?)(?=\s*(?:;|&&|\|\||[|}<>&]|$))")
PLACEHOLDER = "/tmp/placeholder"  # what a shell variable or a $(...) stands for here


def commands(text: str) -> list[list[str]]:
    """The argument lists of every gpt2ladder command in a jobs file's job lines (comments left out), each shell
    variable and $(...) put as a placeholder path."""
    found = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        line = SUBSHELL.sub(PLACEHOLDER, line)
        for match in COMMAND.finditer(line):
            found.append([PLACEHOLDER if "$" in arg else arg for arg in shlex.split(match.group(1))])
    return found


def test_commands_are_found_in_shell_around_them():
    line = ('pass 0 560 left=$(( $(cat /tmp/deadline) - $(date +%s) )); [ $left -gt 60 ] && timeout $left $G race '
            '--rungs gpt2,speedrun --out /tmp/races/p-$(cat /tmp/tag) > $R/x.log; $G doctor | head -3 && '
            'python3 -m torch.distributed.run -m gpt2ladder bench --out $R/$(echo $arm | grep -o x || echo auto) &')
    assert commands(line) == [["race", "--rungs", "gpt2,speedrun", "--out", "/tmp/races/p-" + PLACEHOLDER],
                              ["doctor"], ["bench", "--out", PLACEHOLDER]]
    assert commands("# $G race --rungs nothing") == []


@pytest.mark.parametrize("name", READY)
def test_a_ready_jobs_files_commands_parse(name):
    found = commands((JOBS / name).read_text())
    assert found, f"{name}: no gpt2ladder command found"
    for argv in found:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"{name}: gpt2ladder {shlex.join(argv)} does not parse")
        rungs = getattr(args, "rungs", None)
        if not rungs or PLACEHOLDER in rungs:
            continue
        try:
            if args.command == "race":  # the race's names: parts, recipes written with + and -, settings after @
                race.race_rungs(tuple(race.parse_race_rungs(rungs)))
            elif rungs not in ("auto", "best"):
                ladder.parse_rungs(rungs)
        except UsageError as err:
            pytest.fail(f"{name}: gpt2ladder {argv[0]} --rungs {rungs}: {err}")


def test_a_misspelt_race_rung_is_caught():
    with pytest.raises(UsageError):
        race.race_rungs(tuple(race.parse_race_rungs("gpt2,speedrun,speedrun-relu3")))
