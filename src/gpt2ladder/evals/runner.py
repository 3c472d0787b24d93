"""A task run over a model: the examples rendered once (`prepare`), then scored in batches (`evaluate`).

A batch holds several examples' rows (one row per choice), padded on the right to one of a few fixed
lengths (powers of two up to the block size) and always to the same number of rows, so a compiled
forward sees at most a handful of shapes and does not recompile batch after batch. Right padding
changes nothing: the model is causal, so a row's logits never depend on what comes after it, and
`scoring.ending_losses` reads only the ending's positions. Examples are grouped by their padded
length first (the score of an example does not depend on its batch). Under torchrun every process
evaluates every example, as validation does, so the result is the same on each and no collective is
needed beyond those inside the forward.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Callable

import torch

from gpt2ladder.defaults import DEFAULTS
from gpt2ladder.errors import LadderError, UsageError
from gpt2ladder.evals import hellaswag, scoring
from gpt2ladder.model.setup import AUTOCAST_DTYPES
from gpt2ladder.report.progress import progress_bar

TASKS: dict[str, ModuleType] = {hellaswag.NAME: hellaswag}
MIN_LENGTH = 32  # the shortest padded length
# Examples per forward pass by device type (each is one row per choice), from the table of defaults.
BATCH_SIZE = {"cuda": DEFAULTS["eval"]["gpu"]["batch_size"], "cpu": DEFAULTS["eval"]["cpu"]["batch_size"]}


def task_module(name: str) -> ModuleType:
    try:
        return TASKS[name]
    except KeyError:
        raise UsageError(f"unknown task {name!r}; choose one of: {', '.join(TASKS)}") from None


@dataclass(frozen=True, eq=False)
class Prepared:
    """A task's examples as token ids, ready for any model."""

    task: str
    data: object  # the task module's TaskData: which file, its sha256, whether it is the official set
    contexts: tuple[tuple[int, ...], ...]
    endings: tuple[tuple[tuple[int, ...], ...], ...]  # per example, one tuple of ids per choice
    labels: tuple[int, ...]

    @property
    def n_choices(self) -> int:
        return len(self.endings[0])


@dataclass(frozen=True, eq=False)
class TaskResult:
    task: str
    n: int
    correct: int  # examples whose lowest summed ending loss is the true ending's
    correct_norm: int  # the same with the mean loss per ending token
    sums: torch.Tensor  # (n, choices): each ending's summed loss, for inspection and tests
    means: torch.Tensor  # (n, choices): the same per ending token
    seconds: float

    @property
    def acc(self) -> float:
        return self.correct / self.n

    @property
    def acc_norm(self) -> float:
        return self.correct_norm / self.n

    def to_dict(self) -> dict:
        return {"task": self.task, "n": self.n, "acc": self.acc, "acc_norm": self.acc_norm,
                "correct": self.correct, "correct_norm": self.correct_norm, "seconds": round(self.seconds, 3)}


def prepare(task: str, task_data=None, limit: int | None = None, download: bool = True,
            flag: str = "--task-data FILE") -> Prepared:
    """Read a task's examples (the first `limit`; its official data unless `task_data` names a file) and
    tokenize them; every input problem is raised here, before any model runs. `flag` is how to give another
    file (`eval`'s --task-data FILE, `train`'s --hellaswag-data FILE, the API's task_data=FILE) in what is said
    when data is missing."""
    module = task_module(task)
    if limit is not None and limit <= 0:
        raise UsageError(f"--limit must be a positive integer, got {limit}")
    data = module.load(task_data, limit, download, flag)
    rendered = [module.render(example) for example in data.examples]
    return Prepared(task, data, tuple(tuple(c) for c, _ in rendered),
                    tuple(tuple(tuple(e) for e in ends) for _, ends in rendered),
                    tuple(example.label for example in data.examples))


@torch.no_grad()
def evaluate(prepared: Prepared, forward: Callable, *, device: torch.device, block_size: int, vocab_size: int,
             batch_size: int, autocast: str | None = None, matmul_precision: str = "highest",
             progress: bool = True) -> TaskResult:
    """Score every prepared example with `forward` (a GPT, compiled or not: idx -> (logits, _)), `batch_size`
    examples per forward, under `autocast` ("bfloat16", "float16" or None) and `matmul_precision`."""
    start = time.perf_counter()
    rows = [_rows(prepared, i, block_size) for i in range(len(prepared.labels))]
    k = prepared.n_choices
    sums, means = torch.zeros(len(rows), k), torch.zeros(len(rows), k)
    bar = progress_bar(len(rows), prepared.task, enabled=progress, unit="example")
    try:
        with _precision(device, autocast, matmul_precision):
            for batch, length in _batches(rows, batch_size, block_size):
                s, m = _score(forward, [rows[i] for i in batch], (batch_size * k, length), device, vocab_size)
                sums[batch], means[batch] = s.view(-1, k).cpu(), m.view(-1, k).cpu()
                bar.update(len(batch))
    finally:
        bar.close()
    labels = torch.tensor(prepared.labels)
    pred, pred_norm = scoring.choose(sums.view(-1), means.view(-1), k)
    return TaskResult(prepared.task, len(rows), int((pred == labels).sum()), int((pred_norm == labels).sum()),
                      sums, means, time.perf_counter() - start)


def log_entry(prepared: Prepared, result: TaskResult) -> dict:
    """The result as a training run logs it (log.jsonl's "hellaswag" field, which `export` reads for the
    model card): the scores, and whether the data was the task's official set."""
    return {**result.to_dict(), "official": bool(getattr(prepared.data, "official", False))}


def _rows(prepared: Prepared, i: int, block_size: int) -> list[tuple[list[int], int]]:
    """(ids, where the ending starts) per choice; a context too long for the model keeps its last tokens."""
    out = []
    for ending in prepared.endings[i]:
        room = block_size - len(ending)
        if room < 1:
            raise LadderError(f"a {prepared.task} ending of {len(ending)} tokens does not fit this model's "
                              f"{block_size} positions after a context")
        context = list(prepared.contexts[i][-room:])
        out.append((context + list(ending), len(context)))
    return out


def padded_length(n: int, block_size: int) -> int:
    """The fixed length a row of n tokens is padded to: a power of two from MIN_LENGTH, at most block_size."""
    length = MIN_LENGTH
    while length < n:
        length *= 2
    return min(length, block_size)


def _batches(rows: list, batch_size: int, block_size: int) -> list[tuple[list[int], int]]:
    """(example indices, their padded length): grouped by that length, batch_size examples at a time."""
    length = [padded_length(max(len(ids) for ids, _ in r), block_size) for r in rows]
    order = sorted(range(len(rows)), key=lambda i: length[i])
    batches, current = [], []
    for i in order:
        if current and (len(current) == batch_size or length[current[0]] != length[i]):
            batches.append((current, length[current[0]]))
            current = []
        current.append(i)
    return batches + ([(current, length[current[0]])] if current else [])


def _score(forward, examples: list, shape: tuple[int, int], device: torch.device, vocab_size: int):
    """One forward over the examples' rows, padded to `shape` (rows, length); the real rows' losses."""
    flat = [row for rows in examples for row in rows]
    tokens = torch.zeros(shape, dtype=torch.long)
    ending = torch.zeros(shape, dtype=torch.bool)
    for r, (ids, start) in enumerate(flat):
        tokens[r, :len(ids)] = torch.tensor(ids)
        ending[r, start:len(ids)] = True
    tokens, ending = tokens.to(device, non_blocking=True), ending.to(device, non_blocking=True)
    logits, _ = forward(tokens)
    n = len(flat)
    return scoring.ending_losses(logits[:n], tokens[:n], ending[:n], vocab_size)


@contextlib.contextmanager
def _precision(device: torch.device, autocast: str | None, matmul_precision: str):
    """The run's precision for this evaluation only: the global matmul setting is restored after."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(matmul_precision)
    try:
        if autocast is None:
            yield
        else:
            with torch.autocast(device.type, dtype=AUTOCAST_DTYPES[autocast]):
                yield
    finally:
        torch.set_float32_matmul_precision(before)
