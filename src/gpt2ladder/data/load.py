"""Tokens from whatever `--data` names: a corpus of token shards (`corpus.py`: a folder, a glob, a shard file) or
a text (`text.py`; None: Tiny Shakespeare). Apart from both, so neither imports the other."""

from __future__ import annotations

from pathlib import Path

from gpt2ladder.data import corpus
from gpt2ladder.data.text import TokenData, load_text


def load_tokens(text_path: Path | str | None = None, *, download: bool = True, notify=print,
                check=None, identify=None) -> TokenData:
    """The tokens `text_path` names. `check` (a TokenData -> None that raises, e.g. `check_splits`) sees a corpus
    before its shards are scanned, so a corpus too small fails before `notify` says anything; `identify` (source,
    sha256 -> None that raises) sees a text's identity before it is tokenized (a corpus's is `check`'s to see)."""
    if text_path is not None and corpus.is_corpus(text_path):
        return corpus.load_corpus(text_path, notify, check)
    return load_text(text_path, download=download, notify=notify, check=check, identify=identify)
