"""The command line: parse, build a config, call the library. Nothing else lives here.

Every user mistake ends in one line on stderr and a non-zero exit (2 for usage errors); `--debug`
shows the traceback instead.
"""

from __future__ import annotations

import argparse
import sys

from gpt2ladder.defaults import DEFAULTS, MAX_STEPS, MUON_RATES, NEAR_SPLIT, RUNGS_WHY
from gpt2ladder.defaults import default_text as D
from gpt2ladder.errors import LadderError, UsageError, is_out_of_memory, out_of_memory_advice
from gpt2ladder.measure.timing import BOUND, SPREAD

# What --data takes, for every command that trains or times steps on a text.
DATA_HELP = ("a UTF-8 text file, in which a literal <|endoftext|> is GPT-2's end-of-text token; or token shards: a "
             "folder gpt2ladder prepare wrote, a folder or quoted glob of llm.c .bin shards, nanoGPT's "
             "train.bin/val.bin, or build-nanogpt's .npy shards (default: Tiny Shakespeare)")

# The largest integer a flag takes: numpy and torch hold counts and seeds in 64 bits, and a larger
# number would surface as an overflow deep inside them instead of as this one line.
INT_LIMIT = 2**63 - 1
# Upper bounds of counts no later check bounds, so a typo (an extra zero, 2**63) is one line before any work
# rather than a run of years, a list of a billion timings or an allocation the allocator refuses; each far
# above any real use. (Batch sizes, sequence lengths and tokens per step are checked against memory later.)
MAX_TIMED_STEPS = 10**6  # steps bench, profile and parity time or train per rung, and their warm-up
MAX_WORKERS = 1024  # prepare's tokenizing processes
MAX_EVAL_BATCH = 4096  # eval's examples per forward pass, four rows each
MAX_SAMPLES = 10**6
MAX_RACE_SEEDS = 1000  # runs per rung of a race, each a whole training run
MAX_GIB = 2**20  # --gpu-memory: a mebi-GiB, far above any card


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage, so bad flags read like every other error."""

    def error(self, message: str):
        raise UsageError(f"{message} (see {self.prog} --help)")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    if value > INT_LIMIT:
        raise argparse.ArgumentTypeError(f"expected a positive integer up to 2**63 - 1, got {value}")
    return value


def _count(limit: int, zero: bool = False):
    """An argparse type: an integer from 1 (0 with `zero`) to `limit`."""
    least = 0 if zero else 1
    what = f"{'zero or more' if zero else 'a positive integer'}, at most {limit:,},"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what} got {text!r}") from None
        if not least <= value <= limit:
            raise argparse.ArgumentTypeError(f"expected {what} got {value}")
        return value

    return parse


def _counts(limit: int):
    """An argparse type: a comma list of distinct integers from 1 to `limit`, returned in ascending order."""
    one = _count(limit)

    def parse(text: str) -> tuple[int, ...]:
        values = [one(v.strip()) for v in text.split(",") if v.strip()]
        if not values:
            raise argparse.ArgumentTypeError(f"expected a positive integer or a comma list of them, got {text!r}")
        if len(set(values)) < len(values):
            raise argparse.ArgumentTypeError(f"a step count is given twice in {text!r}")
        return tuple(sorted(values))

    return parse


def _seed(text: str) -> int:
    """A seed for torch's and numpy's generators: 0 .. 2**63 - 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a seed (an integer from 0 to 2**63 - 1), got {text!r}") from None
    if not 0 <= value <= INT_LIMIT:
        raise argparse.ArgumentTypeError(f"expected a seed from 0 to 2**63 - 1, got {value}")
    return value


def _batch_size(text: str):
    if text in ("auto", "best"):
        return text
    try:
        return _positive_int(text)
    except argparse.ArgumentTypeError as err:
        message = str(err).replace("a positive integer", "a positive integer, 'auto' or 'best'")
        raise argparse.ArgumentTypeError(message) from None


NEAR_HELP = ("once a validation lands within X nats above the target, validate {split} times as often (every "
             "--eval-every / {split} steps), so the time to the target is read finer; 0 for never")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def _race_target(text: str) -> float | str:
    """race --target-val-loss: a positive number, or gpt2 (read off the gpt2 rung)."""
    if text.strip() == "gpt2":
        return "gpt2"
    try:
        return _positive_float(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a positive number or gpt2, got {text}") from None


def _gib(text: str) -> float:
    """--gpu-memory: a finite number of GiB above 0, at most MAX_GIB."""
    value = _positive_float(text)
    if value > MAX_GIB:
        raise argparse.ArgumentTypeError(f"expected a positive number of GiB, at most 2**20, got {text}")
    return value


def _common(p: argparse.ArgumentParser, preset: bool = True) -> None:
    if preset:
        p.add_argument("--preset", help="model size: tiny, gpt2 (124M), gpt2-medium, gpt2-large or gpt2-xl "
                       "(default: gpt2 on a GPU, tiny on CPU)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps; auto takes a CUDA GPU when "
                   "there is one (default: auto)")
    p.add_argument("--gpu-memory", type=_gib, metavar="GIB",
                   help="cap this GPU's memory at GIB GiB and plan every choice for it, so a large card stands in "
                   "for a smaller one (default: the whole card)")


def _out(p: argparse.ArgumentParser, command: str, what: str) -> None:
    p.add_argument("--out", default=f"runs/{command}", help=f"{what} (default: runs/{command})")


def _no_progress(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-progress", action="store_true", help="draw no progress bars (off by default: bars are "
                   "drawn on a terminal, never into a file or pipe)")


def _recipe(p: argparse.ArgumentParser, resumable: bool = False) -> None:
    from gpt2ladder.model.recipe import PARTS, SPEEDRUN

    kept = "; a resumed run keeps its own" if resumable else ""
    p.add_argument("--recipe", default=None if resumable else "gpt2",
                   help="what is trained: 'gpt2' (GPT-2, AdamW, warm-up + cosine), 'speedrun' (the race's top: "
                   f"{','.join(SPEEDRUN)}), or a comma list of parts switched on top of GPT-2: "
                   f"{', '.join(p.name for p in PARTS)}, where 'speedrun' stands for its parts "
                   "(speedrun,unet_skips: speedrun with U-net skips on top); + adds parts and - takes them away, read "
                   f"left to right, as the race names its rungs (speedrun-relu2,momentum_warmup) (default: gpt2{kept})")


def _add_bench(sub) -> None:
    p = sub.add_parser("bench", help="climb the speed ladder and time every rung",
                       description="Time one training step per rung of the ladder, each rung on a fresh "
                       "model from the same seed and the same batches; write ladder.json, ladder.md and ladder.png.")
    _common(p)
    _recipe(p)
    p.add_argument("--rungs", default=DEFAULTS["bench"]["any"]["rungs"],
                   help="'seed' (the write-up's five), 'all', 'auto' (every rung this machine supports but the opt-in "
                   "ones), 'best' (measure all, keep those that pay) or names, e.g. baseline,tf32,bf16 (default: seed, "
                   f"{RUNGS_WHY['bench']})")
    gpu_batch, cpu_batch = DEFAULTS["bench"]["gpu"]["batch_size"], DEFAULTS["bench"]["cpu"]["batch_size"]
    p.add_argument("--batch-size", type=_batch_size, help="sequences per step, per GPU under torchrun (so the "
                   "global batch grows with the GPUs); 'auto' for the largest at which every rung fits, or 'best' for "
                   "the fastest (in tokens/s) of a few sizes up to the largest that fits, each timed at the top rung "
                   f"(default: on a GPU the largest up to {gpu_batch} at which every rung fits, {cpu_batch} on CPU)")
    p.add_argument("--seq-len", type=_positive_int, help="tokens per sequence, kept as given (default: "
                   f"{D('bench', 'seq_len')}; on a card where not even one such sequence fits every rung, the "
                   "longest power of two that does)")
    gpu_steps, cpu_steps = DEFAULTS["bench"]["gpu"]["steps"], DEFAULTS["bench"]["cpu"]["steps"]
    p.add_argument("--steps", type=_count(MAX_TIMED_STEPS), help="timed steps per rung, exactly (default: on a "
                   "GPU "
                   f"{gpu_steps}, and more, up to {BOUND}, while a rung's p10-p90 range is over "
                   f"{SPREAD * 100:g}%% of its median; {cpu_steps} on CPU)")
    p.add_argument("--warmup", type=_count(MAX_TIMED_STEPS, zero=True),
                   help=f"untimed steps first (default: {D('bench', 'warmup')})")
    p.add_argument("--data", help=DATA_HELP)
    p.add_argument("--seed", type=_seed, default=DEFAULTS["bench"]["any"]["seed"],
                   help=f"the weights and batches every rung shares (default: {D('bench', 'seed')})")
    _out(p, "bench", "output directory for ladder.json, ladder.md and ladder.png")
    _strategy(p)
    p.add_argument("--baseline-json", help="a one-GPU ladder.json of the same preset, batch and seq-len: report "
                   "the scaling efficiency of this (torchrun) run against it (no default)")
    p.add_argument("--last-only", action="store_true", help="time the top rung alone (every named rung applied "
                   "together), e.g. for a batch-size or multi-GPU run; with --from RUNG, RUNG and the top: --rungs "
                   "auto --from vocab --last-only times the write-up's last rung against the top (off by default)")
    p.add_argument("--from", dest="start", metavar="RUNG", help="time the rungs from RUNG on (with --last-only: "
                   "RUNG and the top); those before it are applied but not timed, and 'vs base' is against RUNG; "
                   "--rungs auto --from vocab times the write-up's last rung and every one after it (off by default)")
    _no_progress(p)
    p.set_defaults(handler=_bench)


def _strategy(p: argparse.ArgumentParser) -> None:
    p.add_argument("--strategy", default="auto", help="under torchrun: ddp, fsdp or auto, which takes fsdp for "
                   "gpt2-large and gpt2-xl and ddp otherwise (default: auto)")


def _bench(args) -> int:
    from gpt2ladder.commands.bench import bench_command

    return bench_command(args)


def _add_train(sub) -> None:
    from gpt2ladder.model.recipe import WSD_DECAY_FRACTION

    p = sub.add_parser("train", help="train GPT-2 on Tiny Shakespeare or any text",
                       description="Train at the fastest setting this machine allows, with validation, "
                       "atomic checkpoints that resume exactly, a log and a loss-curve plot. Ctrl-C or SIGTERM "
                       "finishes the current step (a validation under way stops between two batches), saves a "
                       "checkpoint and exits (status 130 or 143). With --resume "
                       "every setting keeps the run's own value unless its flag is given; the defaults below are a "
                       "new run's.")
    _common(p)
    _recipe(p, resumable=True)
    p.add_argument("--rungs", help="'auto' (everything this machine supports but the opt-in rungs), 'seed', 'all' "
                   f"or names (default: {D('train', 'rungs')}, {RUNGS_WHY['train']})")
    p.add_argument("--data", help=DATA_HELP)
    _out(p, "train", "run directory: config.json, log.jsonl, checkpoints, loss.png, tb/")
    p.add_argument("--steps", type=_count(MAX_STEPS), help=f"optimizer steps (default: {D('train', 'steps')})")
    p.add_argument("--batch-size", type=_positive_int, help="micro-batch: sequences per forward pass (default: on "
                   "a GPU the largest that fits and divides the step, "
                   f"{DEFAULTS['train']['cpu']['batch_size']} on CPU)")
    p.add_argument("--seq-len", type=_positive_int,
                   help=f"tokens per sequence (default: {D('train', 'seq_len')})")
    gpu, cpu = DEFAULTS["train"]["gpu"], DEFAULTS["train"]["cpu"]
    p.add_argument("--tokens-per-step", type=_positive_int,
                   help="tokens per optimizer step, over all processes; gradient accumulation makes up the difference, "
                   "so the loss curve does not depend on the card (default: one micro-batch per process: "
                   f"{gpu['batch_size']} sequences of the block size on a GPU, {cpu['batch_size']} of "
                   f"{cpu['seq_len']} tokens on CPU)")
    p.add_argument("--lr", type=float, help=f"peak learning rate (default: {D('train', 'lr')})")
    p.add_argument("--min-lr", type=float, help="final learning rate of the decay (default: a tenth of --lr)")
    p.add_argument("--muon-lr", type=float, help="with the muon recipe part: the peak learning rate of the Blocks' "
                   f"matrices, scaled by the schedule as --lr is (default: {MUON_RATES['muon_lr']})")
    p.add_argument("--embed-lr", type=float, help="with the muon recipe part: AdamW's peak rate for the embeddings "
                   f"(default: {MUON_RATES['embed_lr']})")
    p.add_argument("--head-lr", type=float, help="with the muon and untied_head recipe parts: AdamW's peak rate for "
                   f"the head (default: {MUON_RATES['head_lr']})")
    p.add_argument("--decay-fraction", type=float, help="with the wsd recipe part: the share of the steps over which "
                   f"the rate decays to --min-lr, after it held its peak (default: {WSD_DECAY_FRACTION})")
    every = _count(MAX_STEPS, zero=True)  # a step count or interval of steps, 0 for none
    p.add_argument("--warmup-steps", type=every, help="linear warm-up steps (default: 5%% of --steps)")
    p.add_argument("--weight-decay", type=float, help="AdamW's weight decay on the matrices "
                   f"(default: {D('train', 'weight_decay')})")
    p.add_argument("--grad-clip", type=float, help="clip the gradient norm to this, 0 for no clipping "
                   f"(default: {D('train', 'grad_clip')})")
    p.add_argument("--eval-every", type=every, help="validate every N steps, 0 for never (default: a tenth of "
                   "--steps, at least 2)")
    p.add_argument("--eval-batches", type=_positive_int, help="validation batches (default: as many as keep "
                   f"validation within about 15%% of the run's time, at most {D('train', 'eval_batches')})")
    p.add_argument("--val-tokens", type=_token_count, metavar="N", help="on a corpus of token shards: the tokens "
                   "of its validation shards that every validation reads, from their start, e.g. 10M (default: "
                   "--eval-batches steps' worth)")
    p.add_argument("--hellaswag-every", type=every, metavar="N", help="score HellaSwag (the official validation "
                   "set, downloaded once, as gpt2ladder eval does) every N steps and at the last step, through the "
                   "run's own forward and precision, into log.jsonl; 0 for never (default: 0)")
    p.add_argument("--hellaswag-data", metavar="FILE", help="with --hellaswag-every: a file in HellaSwag's JSONL "
                   "format to score instead of the official set (default: the official validation set)")
    p.add_argument("--target-val-loss", type=_positive_float, metavar="X", help="stop at the first validation at "
                   "or below X (above 0, below ln 50257 = 10.8249), and log the training time (the timed steps, "
                   "compile and capture apart), the wall time and the tokens it took; needs validation (off by "
                   "default: all --steps)")
    p.add_argument("--eval-near", type=float, metavar="X", help="with --target-val-loss: "
                   + NEAR_HELP.format(split=NEAR_SPLIT) + " (default: 0)")
    p.add_argument("--ckpt-every", type=every, help="checkpoint every N steps, 0 for only at the end "
                   "(default: a fifth of --steps)")
    p.add_argument("--resume", action="store_true", help="continue from OUT/ckpt.pt (or, if that is missing or "
                   "damaged, OUT/ckpt.prev.pt) with the run's own settings; flags given with it change those, and "
                   "each change is named; another --seed or --init-from is refused, as the run continues its own "
                   "weights and random state (off by default)")
    p.add_argument("--allow-data-change", action="store_true", help="with --resume: continue on another text than "
                   "the checkpoint was trained on, which is refused otherwise (off by default)")
    p.add_argument("--init-from", help="Hugging Face GPT-2 weights to start from: a folder (its config.json gives "
                   "the shape) holding model.safetensors, a sharded model.safetensors.index.json or pytorch_model.bin; "
                   "one of those files; or a hub name such as gpt2 or openai-community/gpt2, from the local Hugging "
                   "Face cache or downloaded (no default: the weights start from --seed)")
    _strategy(p)
    p.add_argument("--seed", type=_seed, help=f"initial weights and batch order (default: {D('train', 'seed')})")
    _no_progress(p)
    p.set_defaults(handler=_train)


def _train(args) -> int:
    from gpt2ladder.commands.train import train_command

    return train_command(args)


def _add_sample(sub) -> None:
    p = sub.add_parser("sample", help="generate text from a run or a Hugging Face GPT-2",
                       description="Continue a prompt with a trained run's model, or with Hugging Face GPT-2 "
                       "weights (a folder holding config.json and model.safetensors, a sharded "
                       "model.safetensors.index.json or pytorch_model.bin, or one of those files with its config.json "
                       "beside it), or with a hub name such as gpt2, found in the local Hugging Face cache or "
                       "downloaded (not when HF_HUB_OFFLINE is set). A one-line banner naming the model goes to "
                       "stderr, the text to stdout.")
    p.add_argument("checkpoint", help="a run directory, its ckpt.pt, a Hugging Face folder or weights file, or a "
                   "hub name (gpt2, gpt2-medium, openai-community/gpt2, ...)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps (default: auto)")
    p.add_argument("--prompt", default="\n", help="text to continue; a literal <|endoftext|> in it is GPT-2's "
                   "end-of-text token, as in training (default: a newline)")
    same = DEFAULTS["sample"]["any"]
    p.add_argument("--num-tokens", type=_positive_int, help="tokens to generate per sample, printed as they come: at "
                   "most the model's context (1024 for GPT-2, 256 for tiny) and at most 100,000 (default: "
                   f"{same['num_tokens']}, or the context when that is shorter)")
    p.add_argument("--num-samples", type=_count(MAX_SAMPLES), default=same["num_samples"],
                   help=f"independent samples (default: {same['num_samples']})")
    p.add_argument("--temperature", type=float, default=same["temperature"],
                   help=f"0 = greedy; higher = more varied (default: {same['temperature']})")
    p.add_argument("--top-k", type=int, default=same["top_k"],
                   help=f"keep the k most likely tokens, 0 for all (default: {same['top_k']})")
    p.add_argument("--seed", type=_seed, default=same["seed"],
                   help=f"the same seed gives the same text (default: {same['seed']})")
    p.add_argument("--compile", action="store_true", help="generate with the torch.compile'd model (off by default)")
    p.set_defaults(handler=_sample)


def _sample(args) -> int:
    from gpt2ladder.commands.sample import sample_command

    return sample_command(args)


def _add_export(sub) -> None:
    p = sub.add_parser("export", help="write a run as a Hugging Face GPT-2 folder (weights only)",
                       description="Write a run's weights as a folder that transformers loads with "
                       "GPT2LMHeadModel.from_pretrained and AutoTokenizer.from_pretrained: config.json, "
                       "model.safetensors (50257 vocabulary rows, Conv1D layout, tied classifier), "
                       "generation_config.json, the GPT-2 tokenizer files and a model card (README.md) with the "
                       "run's data, steps and validation loss. No optimizer state: this is also the file to share. "
                       "The folder is written beside OUT_DIR and renamed into place when complete. Only GPT-2's "
                       "model exports: runs of the gpt2 recipe, or of a recipe whose parts change only the "
                       "optimizer, the schedule or the initialisation (such as muon,wsd,zero_init); a part that "
                       "changes the network (rope, relu2, ...) does not.")
    p.add_argument("run", metavar="RUN", help="a run directory or its ckpt.pt; or, to re-export, a Hugging Face "
                   "folder or a hub name such as gpt2")
    p.add_argument("out_dir", metavar="OUT_DIR", help="the folder to write (absent or empty, unless --force)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "fp32", "bf16"],
                   help="weights' dtype in model.safetensors (default: float32)")
    p.add_argument("--force", action="store_true", help="replace OUT_DIR when it is not empty (an earlier export, "
                   "say), but never a folder holding a gpt2ladder run's checkpoint (ckpt.pt, ckpt.prev.pt or "
                   "best.pt) in it or anywhere below it, finished or still training (off by default)")
    p.add_argument("--license", metavar="ID", help="the license the model card states, as a Hugging Face hub "
                   "license id such as mit or apache-2.0 (default: none stated)")
    p.add_argument("--push-to-hub", metavar="REPO", help="then upload OUT_DIR to the Hugging Face hub as the model "
                   "repository REPO (OWNER/NAME, or NAME under your account), created if missing; needs `hf auth "
                   "login` or HF_TOKEN (default: no upload)")
    p.set_defaults(handler=_export)


def _export(args) -> int:
    from gpt2ladder.commands.export import export_command

    return export_command(args)


def _add_eval(sub) -> None:
    p = sub.add_parser("eval", help="measure a model on a benchmark (HellaSwag)",
                       description="Score a model on a benchmark the way build-nanogpt and llm.c score GPT-2: for "
                       "HellaSwag, each of an example's four endings by its summed loss over the ending's tokens "
                       "(acc) and by its mean loss per token (acc_norm), over the official validation set of "
                       "10,042 examples, downloaded once into the data cache. Writes OUT/eval.json (with --limit N, "
                       "OUT/eval-limit-N.json, so a quick look never replaces the full result that export puts on "
                       "the model card) and prints one line. A literal <|endoftext|> in the data is GPT-2's "
                       "end-of-text token.")
    p.add_argument("model", metavar="MODEL", help="a run directory or checkpoint, a Hugging Face folder or "
                   "weights file, or a hub name such as gpt2 or openai-community/gpt2 (the local Hugging Face "
                   "cache first, then a download unless HF_HUB_OFFLINE is set)")
    p.add_argument("--task", default="hellaswag",
                   help="the benchmark; hellaswag is the one there is (default: hellaswag)")
    p.add_argument("--task-data", metavar="FILE", help="a file in the task's own format to use instead of its "
                   "official data (default: none; the official validation set from the data cache)")
    p.add_argument("--limit", type=_positive_int, metavar="N", help="only the first N examples, for a quick "
                   "look, written to eval-limit-N.json instead of eval.json (default: all of them, into eval.json)")
    p.add_argument("--batch-size", type=_count(MAX_EVAL_BATCH), help="examples per forward pass, four rows each "
                   f"(default: {D('eval', 'batch_size')})")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps (default: auto)")
    p.add_argument("--out", help="the folder for eval.json or eval-limit-N.json (default: the run directory when "
                   "MODEL is one, else runs/eval)")
    p.add_argument("--no-compile", action="store_true", help="run the model eagerly on a GPU too (default: "
                   "compiled on a GPU that can compile, eager on CPU)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (default: a bar on a terminal)")
    p.set_defaults(handler=_eval)


def _eval(args) -> int:
    from gpt2ladder.commands.eval import eval_command

    return eval_command(args)


def _add_parity(sub) -> None:
    p = sub.add_parser("parity", help="show that every rung keeps the loss",
                       description="Train every rung for N steps from the same weights and batches and "
                       "compare train and validation loss with the fp32 baseline's seed-to-seed spread. "
                       "Writes parity.json, parity.md and parity.png; exits 1 when a rung fails.")
    _common(p)
    _recipe(p)
    p.add_argument("--rungs", help="'all' (rungs this machine cannot run are reported as skipped), 'seed', 'auto' "
                   f"or names, applied cumulatively (default: {D('parity', 'rungs')}; {RUNGS_WHY['parity']})")
    p.add_argument("--steps", type=_count(MAX_TIMED_STEPS), help=f"steps per rung (default: {D('parity', 'steps')})")
    p.add_argument("--batch-size", type=_positive_int, help="sequences per optimizer step; on a GPU the "
                   "micro-batch "
                   f"is the largest divisor of it that fits (default: {D('parity', 'batch_size')})")
    p.add_argument("--seq-len", type=_positive_int,
                   help=f"tokens per sequence (default: {D('parity', 'seq_len')})")
    same = DEFAULTS["parity"]["any"]  # the same on every device
    p.add_argument("--seeds", type=_positive_int, default=same["seeds"], help="fp32 baseline runs with different "
                   f"initial weights and data order, for the spread (default: {same['seeds']})")
    p.add_argument("--tolerance", type=float, default=same["tolerance"], help="largest relative loss gap accepted "
                   f"(default: {same['tolerance']} = {same['tolerance'] * 100:g}%%)")
    p.add_argument("--lr", type=float, default=same["lr"], help="peak learning rate (default: "
                   f"{same['lr']:.0e})".replace("e-0", "e-"))  # 6e-4, as GPT-2's rate is usually written
    p.add_argument("--eval-every", type=_count(MAX_STEPS), help="validate every N steps (default: a tenth of --steps)")
    p.add_argument("--eval-batches", type=_positive_int, default=same["eval_batches"],
                   help=f"validation batches (default: {same['eval_batches']})")
    p.add_argument("--seed", type=_seed, default=same["seed"],
                   help=f"the weights and batches every rung shares (default: {same['seed']})")
    p.add_argument("--data", help=DATA_HELP)
    _out(p, "parity", "output directory for parity.json, parity.md and parity.png")
    p.add_argument("--shard", metavar="K/N", help="run only every N-th training run from K (0-based), to spread "
                   "one parity over N GPUs; writes parity-shard-K-of-N.json (no default: every run)")
    p.add_argument("--merge", nargs="+", metavar="PATH", help="make the report from shard files, each PATH a "
                   "directory of them or one file, with no training (no default)")
    _no_progress(p)
    p.set_defaults(handler=_parity)


def _parity(args) -> int:
    from gpt2ladder.commands.parity import parity_command

    return parity_command(args)


def _add_profile(sub) -> None:
    p = sub.add_parser("profile", help="where one step's time goes, by category, per rung",
                       description="Profile a few training steps of every rung with torch.profiler and split "
                       "the step time into matmul, attention, elementwise & norms, loss, optimizer, copies, "
                       "other and idle; write profile.json, profile.md and profile.png.")
    _common(p)
    _recipe(p)
    p.add_argument("--rungs", help="'all' (rungs this machine cannot run are reported as skipped), 'seed', 'auto' "
                   f"or names, applied cumulatively (default: {D('profile', 'rungs')}; {RUNGS_WHY['profile']})")
    p.add_argument("--batch-size", type=_positive_int, help="sequences per step (default: on a GPU the largest up "
                   f"to {DEFAULTS['profile']['gpu']['batch_size']} at which every rung fits, "
                   f"{DEFAULTS['profile']['cpu']['batch_size']} on CPU)")
    p.add_argument("--seq-len", type=_positive_int,
                   help=f"tokens per sequence (default: {D('profile', 'seq_len')})")
    same = DEFAULTS["profile"]["any"]  # the same on every device
    p.add_argument("--steps", type=_count(MAX_TIMED_STEPS), default=same["steps"],
                   help=f"profiled steps per rung (default: {same['steps']})")
    p.add_argument("--warmup", type=_count(MAX_TIMED_STEPS, zero=True), default=same["warmup"],
                   help=f"unprofiled steps first (default: {same['warmup']})")
    p.add_argument("--data", help=DATA_HELP)
    p.add_argument("--seed", type=_seed, default=same["seed"],
                   help=f"the weights and batches every rung shares (default: {same['seed']})")
    p.add_argument("--trace", action="store_true", help="also write a Chrome trace per rung, OUT/trace-<rung>.json "
                   "(off by default)")
    p.add_argument("--last-only", action="store_true", help="profile only the top rung, every named rung "
                   "applied together (off by default)")
    _out(p, "profile", "output directory for profile.json, profile.md, profile.png (and traces)")
    _no_progress(p)
    p.set_defaults(handler=_profile)


def _profile(args) -> int:
    from gpt2ladder.commands.profile import profile_command

    return profile_command(args)


def _add_race(sub) -> None:
    # not measure.race, which imports torch: --help stays quick
    from gpt2ladder.model.recipe import PARTS, WSD_DECAY_FRACTION

    p = sub.add_parser("race", help="the recipes' ladder: training time to a target validation loss, per rung",
                       description="Train each rung of the race (GPT-2, then one recipe part more per rung: "
                       f"gpt2, {', '.join(p.name for p in PARTS)}) from the same seeds on the same data, "
                       "at the top of the step "
                       "ladder this machine supports for its recipe, until its first validation at or below the "
                       "target or the end of its planned steps; report per rung the training seconds to the target "
                       "(timed steps only; compile and capture, and validation, apart), wall seconds, tokens and "
                       "steps, median and range over the seeds; write race.json, race.md and race.png. Each run "
                       "is a train run directory, OUT/<rung>/seed<k>/. See docs/race.md.")
    _common(p)
    p.add_argument("--rungs", help="'all' (alone), or race rungs, a comma list taken in race order; rung k trains the "
                   "parts of rungs 0..k; 'speedrun', and parts joined by + or taken away by - (speedrun+unet_skips, "
                   "speedrun-wsd), are recipes of their own, the +/- rungs raced last in the order given, each "
                   "against the longest start of its name raced before it, else the row before; a rung listed with "
                   "@ trains it with settings of its own and is read against it (speedrun@muon_lr=0.03, "
                   "gpt2@lr=0.0012; lr, min_lr, warmup_steps, muon_lr, embed_lr, head_lr, decay_fraction, steps: a "
                   "schedule planned for other steps than --steps, speedrun@steps=1000, and tokens_per_step: a batch "
                   "of its own, validated after the race's tokens, speedrun@tokens_per_step=8192@steps=3000) "
                   "(default: all)")
    p.add_argument("--target-val-loss", type=_race_target, metavar="X", help="the validation loss to reach, "
                   "above 0 and below an untrained model's (ln 50257 = 10.8249); or gpt2: the gpt2 "
                   "rung's validation loss after all its planned steps, the highest over its seeds (it then runs "
                   "first, to its last step) (default: FineWeb's 3.28 on a corpus prepared from "
                   "HuggingFaceFW/fineweb; a demo value on Tiny Shakespeare; none otherwise)")
    p.add_argument("--seeds", type=_count(MAX_RACE_SEEDS),
                   help=f"runs per rung, seeds 0..N-1 (default: {D('race', 'seeds')})")
    p.add_argument("--steps", type=_counts(MAX_STEPS), help="the steps every run is planned for, which its "
                   "learning-rate schedule spans; a run stops sooner at the target. A comma list (750,1500,3000) "
                   "races at each budget, the shortest first, in OUT/steps-N/, and compares the budgets in "
                   f"budgets.json, .md and .png (default: {D('race', 'steps')})")
    p.add_argument("--eval-every", type=_count(MAX_STEPS), help="validate every N steps, at most --steps (the "
                   "shortest of them): a race reads its time at a validation (default: --steps / "
                   f"{DEFAULTS['race']['gpu']['validations']} on a GPU, --steps / "
                   f"{DEFAULTS['race']['cpu']['validations']} on CPU)")
    p.add_argument("--eval-near", type=float, metavar="X", help=NEAR_HELP.format(split=NEAR_SPLIT) + " (default: 0; "
                   "under --target-val-loss gpt2 the gpt2 rung's runs, which train before the target is known, "
                   "validate on the grid alone)")
    p.add_argument("--data", help=DATA_HELP)
    p.add_argument("--batch-size", type=_positive_int, help="micro-batch: sequences per forward pass (default: on a "
                   f"GPU the largest that fits and divides the step, {DEFAULTS['race']['cpu']['batch_size']} on CPU)")
    p.add_argument("--seq-len", type=_positive_int, help=f"tokens per sequence (default: {D('race', 'seq_len')})")
    p.add_argument("--tokens-per-step", type=_positive_int, help="tokens per optimizer step; accumulation makes up "
                   "the difference (default: one micro-batch of the default size)")
    p.add_argument("--lr", type=_positive_float, help=f"peak AdamW learning rate (default: {D('race', 'lr')})")
    p.add_argument("--muon-lr", type=_positive_float, help="peak Muon learning rate of the Blocks' matrices, from "
                   f"the muon rung on (default: {D('race', 'muon_lr')})")
    p.add_argument("--embed-lr", type=_positive_float, help="from the muon rung on: the AdamW rate of the embeddings "
                   f"(default: {MUON_RATES['embed_lr']})")
    p.add_argument("--head-lr", type=_positive_float, help="from the untied_head rung on: the AdamW rate of the "
                   f"untied classifier (default: {D('race', 'head_lr')})")
    p.add_argument("--decay-fraction", type=_positive_float, help="from the wsd rung on: the share of the steps "
                   f"over which the rate decays (default: {WSD_DECAY_FRACTION})")
    _out(p, "race", "race.json, race.md, race.png, and a run directory per rung and seed")
    p.add_argument("--resume", action="store_true", help="continue the race in OUT: skip the runs it finished "
                   "(read from their folders, or from OUT/race.json where a folder is not there), continue a stopped "
                   "one from its checkpoint (off by default)")
    p.add_argument("--reuse", action="append", metavar="DIR", help="another race's --out (repeatable): a run it "
                   "finished with this run's very settings, seed and corpus (its sha256) is copied here, not trained "
                   "again; so the gpt2 rung's runs at a budget serve every race at that budget (in a race at several "
                   "budgets, DIR/steps-N where it is one); a DIR holding only a race.json (a record) serves the runs "
                   "it records (default: none, every run trained)")
    p.add_argument("--dry-run", action="store_true", help="plan the race, make every check, and say what each run "
                   "would be (trained, continued from its checkpoint, read back with --resume, reused with --reuse), "
                   "then stop: nothing is trained or written (off by default)")
    p.add_argument("--keep-weights", action="store_true", help="save each run's weights when it ends (ckpt.pt, "
                   "for sample and eval; GPT-2's with its optimizer's state is 1.5 GB a run) (off by default: a run "
                   "saves only when a signal stops it, for --resume, and a finished run keeps no checkpoint)")
    _no_progress(p)
    p.set_defaults(handler=_race)


def _race(args) -> int:
    from gpt2ladder.commands.race import race_command

    return race_command(args)


def _token_count(text: str) -> int:
    """A token count as a number or with a decimal suffix: 100000, 10M, 1.5B (K, M, B: 10**3, 10**6, 10**9)."""
    scale = {"K": 10**3, "M": 10**6, "B": 10**9}.get(text[-1:].upper(), 1)
    try:
        value = float(text[:-1] if scale > 1 else text) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a token count such as 100000, 10M or 1B, got {text!r}") from None
    if not (1 <= value <= INT_LIMIT and value == int(value)):  # inf and 1e400 (inf as a float) included
        raise argparse.ArgumentTypeError(f"expected a whole, positive token count up to 2**63 - 1, got {text}")
    return int(value)


def _add_prepare(sub) -> None:
    from gpt2ladder.data.sources import FORMATS

    p = sub.add_parser("prepare", help="tokenize a corpus into token shards for --data",
                       description="Tokenize SOURCE with GPT-2's tokenizer into llm.c token shards in OUT: "
                       "NAME_val_000000.bin (validation), then NAME_train_000001.bin, ..., and manifest.json "
                       "(source, tokenizer, each shard's tokens and sha256), written last. The token stream is the "
                       "documents in source order, each preceded by <|endoftext|> (50256); a literal "
                       "\"<|endoftext|>\" inside a text is that token too, as GPT-2's tokenizer on the Hugging Face "
                       "hub reads it. Tokenizing runs on every core, in constant memory. Interrupted or killed, the "
                       "same command continues after the last finished shard. Any command's --data takes OUT.")
    p.add_argument("source", metavar="SOURCE", help="a text file (one document); a folder of text files (one "
                   "document per file, in sorted order); JSON Lines, Parquet or CSV files (or a folder of them, .gz "
                   "allowed) with a text column, a folder's other files (a README.md) skipped and counted in the "
                   "banner and manifest.json; or a Hugging Face dataset name such as HuggingFaceFW/fineweb-edu, "
                   "streamed, never downloaded whole (there is no default)")
    p.add_argument("out", metavar="OUT", help="the folder for the shards: absent, empty, or holding an unfinished "
                   "prepare of the same source to continue (there is no default)")
    p.add_argument("--name", help="the shards' file name prefix (default: SOURCE's last part without its "
                   "suffixes, e.g. fineweb-edu or input)")
    p.add_argument("--format", default="auto", choices=FORMATS, help="how to read SOURCE: auto goes by file "
                   "suffix (.jsonl, .json, .parquet, .csv; anything else is text) and takes a name that is not a "
                   "path for a Hugging Face dataset; hf reads a local folder through the datasets library too "
                   "(default: auto)")
    p.add_argument("--text-field", default="text", help="the column or JSON field that holds each document's "
                   "text (default: text)")
    p.add_argument("--subset", help="the Hugging Face dataset's configuration, e.g. sample-10BT (default: none, "
                   "the dataset's default one)")
    p.add_argument("--split", default="train", help="the Hugging Face dataset's split to read (default: train)")
    p.add_argument("--follow-links", action="store_true", help="in a source folder, read what links out of it "
                   "point to as well (off by default: links inside it are followed, links out of it, links that "
                   "loop and FIFOs or devices are skipped, each counted in the banner and manifest.json)")
    p.add_argument("--val-tokens", type=_token_count, default=10**7, help="tokens in the validation shard, the "
                   "first of the stream; a source of fewer than ten times this gives its first tenth instead "
                   "(default: 10M)")
    p.add_argument("--shard-tokens", type=_token_count, default=10**8, help="tokens per training shard, the "
                   "last one holding the rest (default: 100M, 200 MB a shard)")
    p.add_argument("--workers", type=_count(MAX_WORKERS), help="tokenizing processes (default: one per core this "
                   "process may use)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (default: a bar on a terminal)")
    p.set_defaults(handler=_prepare)


def _prepare(args) -> int:
    from gpt2ladder.commands.prepare import prepare_command

    return prepare_command(args)


def _add_doctor(sub) -> None:
    p = sub.add_parser("doctor", help="which rungs this machine can use, and why not",
                       description="Report the device, memory and versions; whether TF32, bf16, fp16 + GradScaler, "
                       "FP8, torch.compile, CUDA graphs and each attention kernel can run here, each with a "
                       "one-line reason; the rungs --rungs auto will climb for the gpt2 recipe (another --recipe "
                       "may leave some out, and says which); and, on a GPU, the largest batch per "
                       "rung and the micro-batch train will use.")
    _common(p, preset=False)
    p.add_argument("--json", action="store_true", help="print one JSON object, for scripts (off by default: a "
                   "report for people)")
    p.set_defaults(handler=_doctor)


def _doctor(args) -> int:
    from gpt2ladder.commands.doctor import doctor_command

    return doctor_command(args)


class _Formatter(argparse.HelpFormatter):
    """Wraps prose as argparse does, but keeps indented example lines exactly as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        fill = super()._fill_text
        return "\n".join(indent + line if line.startswith("  ") else fill(line, width, indent)
                         for line in text.splitlines())


_EXAMPLES = {  # shown under each command's --help
    "": """start here:
  gpt2ladder doctor                what this machine can run, and why not
  gpt2ladder bench                 time the ladder, rung by rung
  gpt2ladder train                 train at the fastest setting this machine allows
Each command has its own --help with examples. Errors are one line; --debug shows the traceback.""",
    "bench": """examples:
  gpt2ladder bench                      the write-up's five rungs, defaults for this machine
  gpt2ladder bench --rungs auto         every rung doctor recommends here (not the opt-in ones)
  gpt2ladder bench --rungs baseline,tf32,bf16 --steps 50
  gpt2ladder bench --preset gpt2 --batch-size auto --out results/h200
  gpt2ladder bench --preset gpt2 --rungs auto --batch-size best --last-only
  torchrun --nproc_per_node=2 -m gpt2ladder bench --rungs auto""",
    "train": """examples:
  gpt2ladder train --steps 2000 --out runs/shakespeare
  gpt2ladder train --out runs/shakespeare --resume     continue from runs/shakespeare/ckpt.pt
  gpt2ladder train --data my.txt --preset tiny --device cpu
  gpt2ladder train --init-from hf/gpt2 --steps 500     start from Hugging Face GPT-2 weights (their shape)
  gpt2ladder train --init-from gpt2 --steps 500        the same, by its hub name""",
    "sample": """examples:
  gpt2ladder sample runs/shakespeare --prompt "ROMEO:" --num-tokens 300
  gpt2ladder sample runs/shakespeare/ckpt.pt --num-samples 3 --temperature 0.9
  gpt2ladder sample hf/shakespeare --temperature 0      a Hugging Face folder (e.g. from export)
  gpt2ladder sample gpt2 --prompt "Hello, I'm a language model,"    OpenAI's GPT-2 from the hub""",
    "export": """examples:
  gpt2ladder export runs/shakespeare hf/shakespeare
  gpt2ladder export runs/shakespeare/ckpt.pt hf/shakespeare --dtype bfloat16 --force
  gpt2ladder export runs/shakespeare hf/shakespeare --license mit --push-to-hub your-name/shakespeare
then, in Python:
  GPT2LMHeadModel.from_pretrained("hf/shakespeare"), AutoTokenizer.from_pretrained("hf/shakespeare")""",
    "eval": """examples:
  gpt2ladder eval gpt2                             OpenAI's GPT-2 124M from the Hugging Face hub
  gpt2ladder eval runs/shakespeare --limit 500     a run, on the first 500 examples (eval-limit-500.json)
  gpt2ladder eval hf/shakespeare --task-data hellaswag_val.jsonl --device cpu""",
    "parity": """examples:
  gpt2ladder parity --rungs seed --steps 300
  gpt2ladder parity --device cpu --steps 60""",
    "profile": """examples:
  gpt2ladder profile --rungs baseline,compile,flash""",
    "race": """examples:
  gpt2ladder race                                   Tiny Shakespeare, a demo target, every rung
  gpt2ladder race --rungs gpt2,muon,rope --seeds 3
  gpt2ladder race --data data/fw10B --target-val-loss 3.28 --tokens-per-step 524288 --steps 5000
  gpt2ladder race --out runs/race --resume          continue a race that was stopped""",
    "prepare": """examples:
  gpt2ladder prepare HuggingFaceFW/fineweb-edu data/edu10B --subset sample-10BT --name edufineweb
  gpt2ladder prepare my_texts/ data/mine                 one document per file
  gpt2ladder prepare corpus.jsonl.gz data/corpus --text-field content
  gpt2ladder train --data data/edu10B                    then train (or bench, parity, profile) on it""",
    "doctor": """examples:
  gpt2ladder doctor
  gpt2ladder doctor --device cuda:1
  gpt2ladder doctor --json > machine.json""",
}


def build_parser() -> argparse.ArgumentParser:
    from gpt2ladder.version import __version__

    parser = _Parser(prog="gpt2ladder", description="Train GPT-2 as fast as the hardware allows, and "
                     "measure where every millisecond went.", epilog=_EXAMPLES[""], formatter_class=_Formatter)
    parser.add_argument("--version", action="version", version=f"gpt2ladder {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors "
                        "(off by default)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for add in (_add_bench, _add_train, _add_sample, _add_export, _add_eval, _add_parity, _add_profile,
                _add_race, _add_prepare, _add_doctor):
        add(sub)
    for name, p in sub.choices.items():
        p.formatter_class, p.epilog = _Formatter, _EXAMPLES.get(name)
        # SUPPRESS: a --debug given before the command is not overwritten by this one's default.
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show tracebacks instead of one-line errors (off by default)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        if extra:  # the help of what they followed: the command's, or the tool's where they came before it
            at = argv.index(args.command) if args.command else len(argv)
            after = extra[0] in argv[at + 1:]  # `doctor doctor`: the second is the command's
            where = f"gpt2ladder {args.command}" if after else "gpt2ladder"
            raise UsageError(f"unrecognized arguments: {' '.join(extra)} (see {where} --help)")
        if args.command is None:
            build_parser().print_help()
            return 2
        return args.handler(args) or 0
    except LadderError as err:
        if debug:
            return _traceback(err.exit_code)
        if not (isinstance(err, UsageError) and _is_other_rank()):  # every rank finds the same usage error
            print(f"gpt2ladder: error: {_one_line(str(err))}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("gpt2ladder: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _quiet_stdout()  # the reader went away (`gpt2ladder doctor | head`): stop as other tools do
        return 141
    except OSError as err:  # the disk, not the code: full, read-only, permissions
        if debug:
            return _traceback(1)
        where = f": {err.filename}" if err.filename else ""
        print(f"gpt2ladder: error: {_one_line(err.strerror or str(err))}{where}", file=sys.stderr)
        return 1
    except Exception as err:
        if not is_out_of_memory(err):
            raise
        if debug:
            return _traceback(1)
        print(f"gpt2ladder: error: {_out_of_memory_line(err)}", file=sys.stderr)
        return 1


def _traceback(exit_code: int) -> int:
    """--debug: the traceback of the error being handled, and the exit code the one line would have had."""
    import traceback

    traceback.print_exc()
    return exit_code


def _is_other_rank() -> bool:
    """A torchrun process other than rank 0 (rank 0 alone reports usage errors)."""
    import os

    return os.environ.get("RANK", "0") != "0"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _quiet_stdout() -> None:
    """Point stdout at devnull so Python's flush at exit does not fail a second time."""
    import os

    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout is not a real file (tests capture it)
        pass


def _out_of_memory_line(err: Exception) -> str:
    """The accelerator's OOM says what to try; the host's names the allocation, since the cause is often a
    flag far too large (--tokens-per-step 640000000000) rather than the batch."""
    import torch

    if isinstance(err, torch.OutOfMemoryError):  # the command did not say at which batch size
        return f"out of memory on the GPU; {out_of_memory_advice(None)}"
    detail = _one_line(str(err))[:200] or type(err).__name__
    return (f"out of host memory ({detail}); use a smaller --batch-size, --seq-len, --tokens-per-step "
            "or --eval-batches")
