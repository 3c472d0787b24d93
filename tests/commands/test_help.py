"""Every option's --help says what happens when it is not given.

The rule: the help text of every option (every flag of every command and of `gpt2ladder` itself, but
--help and --version) ends with a parenthesis that states its default: "(default: ...)", "(off by
default...)" for a switch, or "(no default...)" where nothing stands in for it. Where argparse holds a
default of its own (a number or a word), the first word after "default:", read as the option reads its
value, must be that default, so the text cannot drift from the code.
"""

import argparse
import re

import pytest

from gpt2ladder.cli import build_parser

STATED = re.compile(r"\((default: (?P<value>[^)]+)|off by default[^)]*|no default[^)]*)\)$")


def _parsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {"gpt2ladder": parser, **{f"gpt2ladder {name}": p for name, p in sub.choices.items()}}


def _options():
    for prog, parser in _parsers().items():
        for action in parser._actions:
            if action.option_strings and not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
                yield prog, action


OPTIONS = list(_options())


@pytest.mark.parametrize("prog, action", OPTIONS, ids=[f"{p} {a.option_strings[-1]}" for p, a in OPTIONS])
def test_every_option_states_its_default(prog, action):
    text = " ".join((action.help or "").split()) % {}  # argparse's own %-formatting: "5%%" reads "5%"
    stated = STATED.search(text)
    assert stated, f"{prog} {action.option_strings[-1]}: the help does not end by stating its default: {text!r}"
    default = action.default
    if stated["value"] and isinstance(default, (int, float, str)) and not isinstance(default, bool) \
            and str(default).strip() and " " not in str(default):
        first = stated["value"].split()[0].rstrip(",;")
        read = action.type or type(default)  # as the option reads a value: a token count's "10M", say
        assert read(first) == default, f"{prog} {action.option_strings[-1]}: says {first}, is {default!r}"


def test_the_rule_catches_a_missing_or_wrong_default():
    assert not STATED.search("clip the gradient norm to this (0 = off)")
    assert STATED.search("peak learning rate (default: 6e-4)")["value"] == "6e-4"
    assert STATED.search("no progress bars (off by default: bars show on a terminal)")
    assert not STATED.search("sequences per step (default: 16) on a GPU")  # the default ends the text


def test_every_command_is_walked():
    assert set(_parsers()) >= {"gpt2ladder", *(f"gpt2ladder {c}" for c in
                                               ("bench", "train", "sample", "export", "parity", "profile", "doctor"))}
    assert len(OPTIONS) > 60
