"""HellaSwag (Zellers et al., 2019): which of four endings continues a short description of an activity.
The data is the official validation set, rowanz/hellaswag's hellaswag_val.jsonl (10,042 examples), the
file build-nanogpt and llm.c evaluate GPT-2 on; it is downloaded once into the data cache and checked
against the sha256 that Hugging Face's `datasets` publishes for it (datasets/hellaswag/dataset_infos.json,
download_checksums) every time it is read. Another file in the same format may be given instead
(`--task-data`); every line is checked for that format, and its sha256 says whether it is the official set.

An example is rendered as those projects render it, as a completion: the context's tokens, then an
ending's tokens, the ending encoded with a space in front (`encode_text(" " + ending)`, GPT-2's BPE;
the context is encoded on its own, so the two meet at a word boundary). Scoring is `scoring.py`'s.
"""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from gpt2ladder.data.files import atomic_file
from gpt2ladder.data.text import cache_dir
from gpt2ladder.data.tokenizer import encode_text
from gpt2ladder.errors import LadderError, UsageError

NAME = "hellaswag"
URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
SHA256 = "0aa3b88843990f3f10a97b9575c94d7b71fb2205240ba04ae4884d9e9c992588"
N_EXAMPLES = 10_042
N_CHOICES = 4
HUB_DATASET = "Rowan/hellaswag"  # the dataset's id on the Hugging Face hub, for model cards
DOWNLOAD_TIMEOUT_S = 30


@dataclass(frozen=True)
class Example:
    context: str
    endings: tuple[str, ...]  # N_CHOICES of them
    label: int  # the index of the true ending


@dataclass(frozen=True)
class TaskData:
    """The examples read from one file, and which file it was."""

    path: Path
    sha256: str
    official: bool  # the file is the official validation set, byte for byte
    n_in_file: int
    examples: tuple[Example, ...]  # the first `limit` of the file's, or all

    def to_dict(self) -> dict:
        return {"path": str(self.path), "sha256": self.sha256, "official": self.official,
                "examples_in_file": self.n_in_file, "url": URL if self.official else None}


def cached_path() -> Path:
    return cache_dir() / NAME / "hellaswag_val.jsonl"


def load(task_data: str | Path | None = None, limit: int | None = None, download: bool = True,
         flag: str = "--task-data FILE") -> TaskData:
    """The examples of `task_data`, or of the official set in the cache (downloaded when missing); `flag` is
    the option that gives another file, named when the official one is missing."""
    path = Path(task_data).expanduser() if task_data is not None else official_file(download, flag)
    data = _read_bytes(path)
    digest = hashlib.sha256(data).hexdigest()
    if task_data is None and digest != SHA256:  # changed since it was checked on download
        raise LadderError(f"the cached HellaSwag file {path} is damaged (its sha256 is not the official set's); "
                          f"delete it to download it again, or pass {flag}")
    examples = parse(data, path)
    return TaskData(path, digest, digest == SHA256, len(examples), tuple(examples[:limit] if limit else examples))


def official_file(download: bool = True, flag: str = "--task-data FILE") -> Path:
    """The official validation set in the cache, checked; downloaded first when it is missing or damaged."""
    path = cached_path()
    if path.is_file() and _sha256_file(path) == SHA256:
        return path
    state = "is damaged (wrong sha256)" if path.exists() else "is not in the cache"
    reason = "downloading is turned off"
    if download:
        try:
            _download(path)
            return path
        except (OSError, ValueError) as err:
            reason = _reason(err)
    raise LadderError(f"the HellaSwag validation set {state} and could not be downloaded ({reason}); put "
                      f"hellaswag_val.jsonl from {URL} at {path}, or pass {flag}")


def _download(dest: Path) -> None:
    """The official file into `dest`, which appears only if the bytes are the official set's."""
    with urllib.request.urlopen(URL, timeout=DOWNLOAD_TIMEOUT_S) as response:
        data = response.read()
    if hashlib.sha256(data).hexdigest() != SHA256:
        raise ValueError(f"the download's sha256 is {hashlib.sha256(data).hexdigest()[:12]}..., "
                         f"not the official {SHA256[:12]}...")
    with atomic_file(dest) as f:
        f.write(data)


def _reason(err: BaseException) -> str:
    reason = err.reason if isinstance(err, urllib.error.URLError) else err
    return " ".join(str(reason).split()) or type(err).__name__


def _sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _read_bytes(path: Path) -> bytes:
    if not path.is_file():
        raise UsageError(f"HellaSwag file {path} does not exist" if not path.exists()
                         else f"HellaSwag file {path} is not a regular file")
    try:
        return path.read_bytes()
    except OSError as err:
        raise UsageError(f"cannot read HellaSwag file {path}: {err.strerror or err}") from None


# --- the format ---------------------------------------------------------------------------------


def parse(data: bytes, where: Path) -> list[Example]:
    """Every non-empty line as an Example; UsageError naming the first line not in HellaSwag's format."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{where} is not a HellaSwag file: it is not UTF-8 text") from None
    examples = [parse_line(line, where, i) for i, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not examples:
        raise UsageError(f"{where} holds no HellaSwag examples")
    return examples


def parse_line(line: str, where: Path, number: int) -> Example:
    """One JSON line: a non-empty "ctx" string, "endings" (four strings) and "label" (0 to 3)."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise UsageError(f"line {number} of {where} is not a HellaSwag example: not JSON ({err.msg})") from None
    problem = _format_problem(row)
    if problem:
        raise UsageError(f"line {number} of {where} is not a HellaSwag example: {problem}")
    return Example(row["ctx"], tuple(row["endings"]), row["label"])


def _format_problem(row) -> str | None:
    if not isinstance(row, dict):
        return "not a JSON object"
    if not isinstance(row.get("ctx"), str) or not row["ctx"].strip():
        return 'no "ctx" text'
    endings = row.get("endings")
    if not (isinstance(endings, list) and len(endings) == N_CHOICES and all(isinstance(e, str) for e in endings)):
        return f'"endings" is not a list of {N_CHOICES} strings'
    label = row.get("label")
    if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < N_CHOICES:
        return f'"label" is not an integer from 0 to {N_CHOICES - 1}'
    return None


# --- rendering ----------------------------------------------------------------------------------


def render(example: Example) -> tuple[list[int], list[list[int]]]:
    """(the context's ids, each ending's ids): a row is the context followed by one ending."""
    return encode_text(example.context), [encode_text(" " + ending) for ending in example.endings]
