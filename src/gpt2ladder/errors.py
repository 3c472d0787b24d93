"""The two kinds of failure a user can see: their mistake (exit 2) and a run that cannot go on (exit 1).

The CLI turns either into one line on stderr; anything else is a bug and keeps its traceback.
"""


class LadderError(Exception):
    """A run cannot go on for a reason the user can act on; printed as one line, exit 1."""

    exit_code = 1


class UsageError(LadderError):
    """The command line or its inputs are wrong; printed as one line, exit 2."""

    exit_code = 2


class BadArgument(UsageError, ValueError):
    """A Python API argument out of its range, named as the API names it: a UsageError, and a ValueError as
    Python code expects of a bad argument."""


# How the allocators say they ran out: torch's CPU allocator and the CUDA/MPS runtimes raise a plain
# RuntimeError with these words (only the CUDA caching allocator raises torch.OutOfMemoryError).
_OOM_WORDS = ("can't allocate memory", "out of memory", "cannot allocate memory")


def is_out_of_memory(err: BaseException) -> bool:
    """Whether err is an allocation failure: Python's or numpy's MemoryError, or torch's in any form."""
    import torch

    if isinstance(err, (MemoryError, torch.OutOfMemoryError)):
        return True
    return isinstance(err, RuntimeError) and any(w in str(err).lower() for w in _OOM_WORDS)


class DeviceOutOfMemory(LadderError):
    """The device ran out of memory at a batch size the command knows; the message says what to change."""

    def __init__(self, batch_size: int, what: str = "batch size"):
        self.batch_size = batch_size
        super().__init__(f"out of memory at {what} {batch_size}; {out_of_memory_advice(batch_size)}")


# What to change when not even one sequence fits: each sequence's cost, the step's, the model's.
SMALLER_STEP = "use a smaller --seq-len, fewer --rungs or --preset tiny"


def out_of_memory_advice(batch_size: int | None, *, auto_batch: bool = False) -> str:
    """What to change after the device ran out of memory: a smaller batch while there is one to take, at
    one sequence SMALLER_STEP (None: the batch is not known, so both). `auto_batch`: the command takes
    `--batch-size auto` (bench alone), so the advice may name it."""
    smaller = "use a smaller --batch-size" + (" or --batch-size auto" if auto_batch else "")
    if batch_size == 1:
        return f"not even one sequence fits: {SMALLER_STEP}"
    if batch_size is None:
        return f"{smaller} (at batch size 1: {SMALLER_STEP.removeprefix('use ')})"
    return smaller


def describe_failure(err: BaseException) -> str:
    """A rung's exception as one short line for its row (out-of-memory says what to try)."""
    import torch

    if isinstance(err, torch.OutOfMemoryError):
        return "out of memory; try a smaller --batch-size or --seq-len"
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    first = lines[0] if lines else ""
    # A line that ends in a colon introduces the cause on the next (torch.compile's "backend='inductor' raised:")
    for line in lines[1:]:
        if not first.endswith(":"):
            break
        first = f"{first} {line}"
    return f"{type(err).__name__}: {first[:300]}"
