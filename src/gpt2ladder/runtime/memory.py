"""How much GPU memory a training step takes, estimated from the shapes and dtypes of a `Setup`.

A step holds a fixed part and a part that grows with the batch. The part that grows is the activations
saved for backward; per sequence of T tokens

    L * T * C * block  +  L * H * T^2 * attention (the four-line attention only)  +  T * Vp * head

bytes (the doc_windows part changes the attention's term: `_attention_bytes`), with per-element byte counts that
depend on how the step runs:
- block, every Block's saved activations per channel: 63 bytes in fp32, 36 under 16-bit autocast;
- attention, the (T, T) scores the four-line attention keeps: 4 bytes in fp32 (the softmax output),
  6 under eager autocast (that fp32 output and its bf16 copy for the matmul), 4 compiled;
- head, the classifier's logits and their gradient: 12 bytes eager (logits, log-softmax, gradient),
  8 compiled, 4 with the fused loss (one 16-bit gradient, written once).
These byte counts are fitted: to the measured peak memory of every rung of GPT-2 124M at B=16 x 1024
and of the three eager seed rungs at B=4 (the memory runs are among benchmarks/RECORDS.md). Against those the
estimate is over, never under, by at most 0.15 GiB for the eager rungs that set the batch (0.3 GiB at
B=4) and 1.6 GiB for the others; a test checks that it stays so.

The fixed part:
- the fp32 weights, their gradients and AdamW's two moments: 16 bytes per parameter, 8 for a table the bf16_tables
  part keeps in bf16 with its gradient and moments (derived);
- accumulating micro-batches, a second set of weight gradients: after the first micro-batch each
  backward makes new gradients that are added into the kept ones, and a compiled backward returns
  all of them at once, 4 bytes per parameter; an eager one returns them one by one, so only the
  largest, the tied embedding's, is held twice (derived);
- the weight_cast rung, a bfloat16 copy of each Block linear's weight and bias kept between steps: 1 byte per
  Block parameter (fitted to the top of auto's peak with and without it, a little under a byte per Block
  parameter; the casts autocast makes without it are held for the backward too, so not all 2 bytes add);
- a CUDA graph: 0.1 GiB (fitted to the graphed rung's peak above the rung before it, less a copy
  of the weights the capture once kept on the GPU and keeps in host memory now). Its memory pool holds the step's
  activations between steps and lends nothing to anything else, so validation beside it needs room of its own for
  at least one sequence (`eval_bytes_per_sequence`, derived).

The estimate picks a batch; a probe of the heaviest rung confirms it (`measure/batch.py`). It plans
against what the card's allocator can hold (`hardware.allocator_memory`), with HEADROOM kept free.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gpt2ladder.model import family
from gpt2ladder.model.config import ModelConfig
from gpt2ladder.model.setup import Setup

GiB = 2**30
# fp32 weight, gradient, AdamW's exp_avg and exp_avg_sq. Muon's matrices hold one moment (12 bytes): the estimate
# keeps 16 for them too, an upper bound.
OPTIMIZER_BYTES_PER_PARAM = 16
BF16_TABLE_BYTES_PER_PARAM = 8  # the bf16_tables part's: a bf16 weight, its gradient and AdamW's two moments
GRADIENT_BYTES_PER_PARAM = 4  # fp32
CAST_BYTES_PER_PARAM = 1  # the weight_cast rung's bf16 copies, less the casts they replace (fitted)
GRAPH_BYTES = GiB // 10
HEADROOM = 0.92  # plan to use at most this share of the memory: the allocator fragments, cuBLAS needs workspace


def parameters(cfg: ModelConfig, setup: Setup) -> int:
    """Parameters of the model this setup trains (the tied classifier counted once), of whichever family."""
    return family.parameters(dataclasses.replace(cfg, vocab_multiple=setup.vocab_multiple))


def block_parameters(cfg: ModelConfig) -> int:
    """Parameters of the Blocks: per Block attention (4 C^2 + 4 C), MLP (8 C^2 + 5 C), two layer norms (4 C)."""
    return cfg.n_layer * (12 * cfg.n_embd ** 2 + 13 * cfg.n_embd)


def _vocab(cfg: ModelConfig, setup: Setup) -> int:
    return -(-cfg.vocab_size // setup.vocab_multiple) * setup.vocab_multiple


def _bytes_per_element(setup: Setup) -> tuple[int, int, int]:
    """(block, attention, head) bytes per element of the step's saved activations."""
    block = 36 if setup.autocast else 63
    if setup.compile:
        attention = 4
    else:
        attention = 6 if setup.autocast else 4
    if setup.fused_loss or setup.fp8_head:
        head = 4
    else:
        head = 8 if setup.compile else 12
    return block, attention, head


# What the modern family's parts save for backward beyond GPT-2's Block, per channel element in 16 bits: rope's rotated
# q and k (2 + 2), qk_norm's normalised q and k (2 + 2), relu2's ReLU output over the 4C-wide hidden (8), value_embeds'
# looked-up value embedding and the mixed v (2 + 2, counted in every Block though at most six use one), unet_skips' kept
# first-half outputs, held until the second half adds them (4: one fp32 copy, though the Blocks save most of them
# anyway), embed_skips' unmixed input of each Block, which a's gradient reads (4: one fp32 copy; x0 itself is held
# once). Not fitted to a measurement: an allowance that errs high (an eager step keeps more of each part's temporaries
# than a compiled one, and the batch planner's probe of an eager step must pass).
MODERN_PART_BYTES = {"rope": 4, "qk_norm": 4, "relu2": 8, "value_embeds": 4, "unet_skips": 4, "embed_skips": 4}


def _modern_block_bytes(cfg: ModelConfig, setup: Setup) -> int:
    per_16_bit = sum(MODERN_PART_BYTES.get(part, 0) for part in cfg.parts)
    scale = 1 if setup.autocast else 2  # fp32 activations take twice the bytes
    return per_16_bit * scale * (1 if setup.compile else 2)


@dataclass(frozen=True)
class StepMemory:
    fixed: int  # bytes that do not depend on the batch
    per_sequence: int  # bytes each sequence of the batch adds

    def at(self, batch: int) -> int:
        return self.fixed + batch * self.per_sequence

    def largest_batch(self, memory: int) -> int:
        """The most sequences that fit in `memory` bytes with the headroom kept free (0 if none)."""
        return max(0, int((HEADROOM * memory - self.fixed) // self.per_sequence))


def step_memory(cfg: ModelConfig, setup: Setup, seq_len: int, accumulates: bool = False,
                validates: bool = False) -> StepMemory:
    """The estimate for one training step of this setup at sequences of `seq_len` tokens; `accumulates`:
    over several micro-batches; `validates`: with validation between steps (train)."""
    T, C, L = seq_len, cfg.n_embd, cfg.n_layer
    block, attention, head = _bytes_per_element(setup)
    block += _modern_block_bytes(cfg, setup)
    per_sequence = L * T * C * block + T * _vocab(cfg, setup) * head + _attention_bytes(cfg, setup, T, attention)
    return StepMemory(_fixed(cfg, setup, seq_len, accumulates, validates), per_sequence)


def _attention_bytes(cfg: ModelConfig, setup: Setup, T: int, per_score: int) -> int:
    """What a sequence's attention keeps beyond the Blocks' per-channel bytes: the four-line attention's (T, T) scores
    in every layer. With doc_windows, a compiled step on a GPU runs FlexAttention, which keeps no scores (its block
    mask is a few integers per 128 x 128 tile; a step compiled on a CPU keeps the plain attention's, which this
    leaves out), and an eager one the plain attention under a boolean (T, T) mask made once a batch (1 byte a
    score), with the four-line attention's scores besides."""
    scores = cfg.n_layer * cfg.n_head * T * T * per_score if setup.attention == "manual" else 0
    if cfg.has("doc_windows"):
        return 0 if setup.compile else T * T + scores
    return scores


def _fixed(cfg: ModelConfig, setup: Setup, seq_len: int, accumulates: bool, validates: bool) -> int:
    n = parameters(cfg, setup)
    tables = family.bf16_table_parameters(dataclasses.replace(cfg, vocab_multiple=setup.vocab_multiple))
    fixed = OPTIMIZER_BYTES_PER_PARAM * n - (OPTIMIZER_BYTES_PER_PARAM - BF16_TABLE_BYTES_PER_PARAM) * tables
    if setup.weight_cast:
        fixed += CAST_BYTES_PER_PARAM * block_parameters(cfg)
    if accumulates:
        held_twice = n if setup.compile else _vocab(cfg, setup) * cfg.n_embd
        fixed += GRADIENT_BYTES_PER_PARAM * held_twice
    if setup.cuda_graph:
        fixed += GRAPH_BYTES
        if validates:
            fixed += eval_bytes_per_sequence(dataclasses.replace(cfg, vocab_multiple=setup.vocab_multiple), seq_len)
    return fixed


def eval_bytes_per_sequence(cfg: ModelConfig, seq_len: int) -> int:
    """What one sequence of a no-grad forward with its loss holds at its peak: the logits in 16 bits,
    their fp32 copy and log-softmax for the loss (10 bytes per logit), and a few Blocks' transient
    activations in fp32 (not fitted to a measurement: a bound that errs high)."""
    vocab = cfg.padded_vocab_size if cfg.vocab_multiple > 1 else cfg.vocab_size
    return seq_len * vocab * 10 + 4 * seq_len * cfg.n_embd * 16


# --- will it fit? -------------------------------------------------------------------------------

# Bytes per token of a batch as data/batches.py makes it on the host: the int64 index of every window
# into the text, the uint16 windows, their int64 copy, and the int64 inputs and targets.
BATCH_BYTES_PER_TOKEN = 34
TRAIN_TOKEN_FLAGS = "--tokens-per-step or --eval-batches"  # what makes train's batches fewer tokens


def planning_memory(caps) -> tuple[int, str]:
    """(bytes, whose) that a run's sizes are checked against: the GPU's (or its --gpu-memory cap) on
    CUDA, the share of memory Metal recommends on MPS, the host's RAM on CPU; 0 when unknown."""
    if caps.device_type == "cuda":
        return caps.usable_memory, f"{caps.name}'s memory"
    if caps.device_type == "mps":
        return caps.total_memory, "the memory the Apple GPU may use"
    return caps.host_memory, "this host's memory"


def check_fits(cfg: ModelConfig, setup: Setup, batch: int, seq_len: int, caps, batch_tokens: int = 0,
               fewer_tokens: str = TRAIN_TOKEN_FLAGS) -> str | None:
    """None when a training step of `batch` sequences of `seq_len` tokens fits in the memory it runs in
    (`planning_memory(caps)`) by the estimate, and `batch_tokens` tokens of batches made on the host (a
    whole step's batch, the validation batches) fit in the host's; else one line saying what does not
    fit and the largest batch (or number of tokens) that does, and, for the batches, the command's flags
    that make fewer of them (`fewer_tokens`). A memory of unknown size is not checked.

    Arithmetic on Python integers only, before anything is allocated: a batch of 2**63 - 1 is a line, not
    numpy's "array is too big", and 100,000 sequences are not grown into until the kernel kills the process.
    """
    memory, whose = planning_memory(caps)
    step = step_memory(cfg, setup, seq_len)
    if caps.device_type == "cpu":  # the step and the batches share the host's memory
        return _problem(step, batch, seq_len, memory, whose, batch_tokens, fewer_tokens)
    return (_problem(step, batch, seq_len, memory, whose)
            or _problem(StepMemory(0, 0), 0, seq_len, caps.host_memory, "this host's memory", batch_tokens,
                        fewer_tokens))


def check_all_fit(cfg: ModelConfig, setups: list[Setup], batch: int, seq_len: int, caps,
                  batch_tokens: int = 0, fewer_tokens: str = TRAIN_TOKEN_FLAGS) -> str | None:
    """`check_fits` for the heaviest of the setups a command runs (bench's, parity's and profile's rungs:
    the heaviest is not always the first, bf16's eager step holds more than fp32's)."""
    heaviest = max(setups, key=lambda setup: step_memory(cfg, setup, seq_len).at(batch))
    return check_fits(cfg, heaviest, batch, seq_len, caps, batch_tokens, fewer_tokens)


def _problem(step: StepMemory, batch: int, seq_len: int, memory: int, whose: str, batch_tokens: int = 0,
             fewer_tokens: str = TRAIN_TOKEN_FLAGS) -> str | None:
    """`check_fits` for one memory, holding `step` at `batch` and the batches beside it."""
    usable = int(HEADROOM * memory)
    room = f"the {_gib(usable)} GiB of {whose} ({_gib(memory)} GiB) that a run plans to use"
    if memory <= 0:
        return None
    if step.fixed + step.per_sequence > usable:
        return (f"the model alone (weights, gradients and AdamW's two moments: {_gib(step.fixed)} GiB) with one "
                f"sequence of {seq_len} tokens needs more than {room}; use a smaller --preset or --seq-len")
    if step.at(batch) > usable:
        largest = step.largest_batch(memory)
        return (f"a training step of {batch:,} sequences of {seq_len} tokens needs about {_gib(step.at(batch))} GiB "
                f"by the estimate, more than {room}; the largest batch that fits is {largest:,} "
                f"(--batch-size {largest})")
    held = BATCH_BYTES_PER_TOKEN * batch_tokens
    if step.at(batch) + held > usable:
        tokens = (usable - step.at(batch)) // BATCH_BYTES_PER_TOKEN
        beside = f" next to the step's {_gib(step.at(batch))} GiB" if step.at(batch) else ""
        return (f"the batches made on the host ({batch_tokens:,} tokens, {_gib(held)} GiB) do not fit{beside} "
                f"in {room}; at most {tokens:,} tokens fit: use a smaller {fewer_tokens}")
    return None


def _gib(n: int) -> str:
    return f"{n / GiB:,.1f}"
