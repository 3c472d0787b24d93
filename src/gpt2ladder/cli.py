"""The command line: parse, build a config, call the library. Nothing else lives here.

Every user mistake ends in one line on stderr and a non-zero exit (2 for usage errors); `--debug`
shows the traceback instead.
"""

from __future__ import annotations

import argparse
import sys

from gpt2ladder.commands.defaults import DEFAULTS
from gpt2ladder.commands.defaults import default_text as D
from gpt2ladder.errors import LadderError, UsageError, is_out_of_memory, out_of_memory_advice

# The largest integer a flag takes: numpy and torch hold counts and seeds in 64 bits, and a larger
# number would surface as an overflow deep inside them instead of as this one line.
INT_LIMIT = 2**63 - 1


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
        raise argparse.ArgumentTypeError(str(err).replace("a positive integer", "a positive integer, 'auto' or 'best'")) from None


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def _common(p: argparse.ArgumentParser, preset: bool = True) -> None:
    if preset:
        p.add_argument("--preset", help="model size: tiny, gpt2 (124M), gpt2-medium, gpt2-large, gpt2-xl "
                       "(default: gpt2 on a GPU, tiny on CPU)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps (default: auto)")
    p.add_argument("--gpu-memory", type=_positive_float, metavar="GIB",
                   help="cap this GPU's memory at GIB GiB and plan every choice for it, so a large card stands in "
                   "for a smaller one (default: the whole card)")


def _out(p: argparse.ArgumentParser, command: str, what: str) -> None:
    p.add_argument("--out", default=f"runs/{command}", help=f"{what} (default: runs/{command})")


def _add_bench(sub) -> None:
    p = sub.add_parser("bench", help="climb the speed ladder and time every rung",
                       description="Time one training step per rung of the ladder, each rung on a fresh "
                       "model from the same seed and the same batches; write ladder.json, ladder.md and ladder.png.")
    _common(p)
    p.add_argument("--rungs", default="seed",
                   help="'seed' (the write-up's five), 'all', 'auto' (every rung this machine supports but the opt-in "
                   "ones), 'best' (measure all, keep those that pay) or names, e.g. baseline,tf32,bf16 (default: seed)")
    p.add_argument("--batch-size", type=_batch_size, help="sequences per step (per GPU under torchrun, so the "
                   "global batch grows with the GPUs), 'auto' for the largest at which every rung fits, or 'best' for "
                   "the fastest (in tokens/s) of a few sizes up to the largest that fits, each timed at the top rung "
                   f"(default: on a GPU the largest up to {D('bench', 'batch_size').split(' on')[0]} at which every rung "
                   f"fits, {DEFAULTS['bench']['cpu']['batch_size']} on CPU)")
    p.add_argument("--seq-len", type=_positive_int, help=f"tokens per sequence (default: {D('bench', 'seq_len')})")
    p.add_argument("--steps", type=_positive_int, help=f"timed steps per rung (default: {D('bench', 'steps')})")
    p.add_argument("--warmup", type=int, help=f"untimed steps first (default: {D('bench', 'warmup')})")
    p.add_argument("--data", help="a text file to train on (default: Tiny Shakespeare)")
    p.add_argument("--seed", type=_seed, default=0, help="the weights and batches every rung shares (default: 0)")
    _out(p, "bench", "output directory for ladder.json, ladder.md and ladder.png")
    p.add_argument("--strategy", default="auto", help="under torchrun: ddp, fsdp or auto (fsdp for gpt2-large/xl)")
    p.add_argument("--baseline-json", help="a one-GPU ladder.json of the same preset, batch and seq-len: report "
                   "the scaling efficiency of this (torchrun) run against it")
    p.add_argument("--last-only", action="store_true", help="time only the top rung (every named rung applied "
                   "together), e.g. for a batch-size or multi-GPU run")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(handler=_bench)


def _bench(args) -> int:
    from gpt2ladder.commands.bench import bench_command

    return bench_command(args)


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="train GPT-2 on Tiny Shakespeare or any text",
                       description="Train at the fastest setting this machine allows, with validation, "
                       "atomic checkpoints that resume exactly, a log and a loss-curve plot. Ctrl-C or SIGTERM "
                       "finishes the current step, saves a checkpoint and exits (status 130 or 143).")
    _common(p)
    p.add_argument("--rungs", default="auto", help="'auto' (everything this machine supports but the opt-in rungs), 'seed', 'all' or names")
    p.add_argument("--data", help="a text file (default: Tiny Shakespeare)")
    _out(p, "train", "run directory: config.json, log.jsonl, checkpoints, loss.png, tb/")
    p.add_argument("--steps", type=_positive_int, help=f"optimizer steps (default: {D('train', 'steps')})")
    p.add_argument("--batch-size", type=_positive_int, help="micro-batch, sequences per forward pass (default: on a "
                   f"GPU the largest that fits and divides the step, {DEFAULTS['train']['cpu']['batch_size']} on CPU)")
    p.add_argument("--seq-len", type=_positive_int, help=f"tokens per sequence (default: {D('train', 'seq_len')})")
    p.add_argument("--tokens-per-step", type=_positive_int,
                   help="tokens per optimizer step, over all processes; gradient accumulation makes up the difference, "
                   f"so the loss curve does not depend on the card (default: {D('train', 'batch_size')} sequences "
                   "per process)")
    p.add_argument("--lr", type=float, default=6e-4, help="peak learning rate (default: 6e-4)")
    p.add_argument("--min-lr", type=float, help="final learning rate of the cosine decay (default: lr/10)")
    p.add_argument("--warmup-steps", type=int, default=None, help="linear warm-up steps (default: 5%% of --steps)")
    p.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay on matrices (default: 0.1)")
    p.add_argument("--grad-clip", type=float, default=1.0, help="clip the gradient norm to this (0 = off)")
    p.add_argument("--eval-every", type=int, default=None, help="validate every N steps, 0 = never (default: steps/10)")
    p.add_argument("--eval-batches", type=_positive_int, default=20, help="validation batches (default: 20)")
    p.add_argument("--ckpt-every", type=int, default=None, help="checkpoint every N steps, 0 = only at the end "
                   "(default: steps/5)")
    p.add_argument("--resume", action="store_true", help="continue from OUT/ckpt.pt (or, if that is missing or "
                   "damaged, OUT/ckpt.prev.pt)")
    p.add_argument("--allow-data-change", action="store_true", help="with --resume: continue on another text than "
                   "the checkpoint was trained on (refused otherwise)")
    p.add_argument("--init-from", help="Hugging Face GPT-2 weights to start from: a folder holding model.safetensors "
                   "(its config.json gives the shape) or the .safetensors file")
    p.add_argument("--strategy", default="auto", help="under torchrun: ddp, fsdp or auto (fsdp for gpt2-large/xl)")
    p.add_argument("--seed", type=_seed, default=0, help="initial weights and batch order (default: 0)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(handler=_train)


def _train(args) -> int:
    from gpt2ladder.commands.train import train_command

    return train_command(args)


def _add_sample(sub) -> None:
    p = sub.add_parser("sample", help="generate text from a run or a Hugging Face GPT-2",
                       description="Continue a prompt with a trained run's model, or with Hugging Face GPT-2 "
                       "weights (a folder holding model.safetensors and config.json, or the .safetensors file "
                       "with its config.json beside it). A one-line banner naming the model goes to stderr, "
                       "the text to stdout.")
    p.add_argument("checkpoint", help="a run directory, its ckpt.pt, a Hugging Face folder or a model.safetensors")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps (default: auto)")
    p.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    p.add_argument("--num-tokens", type=_positive_int, default=200, help="tokens to generate per sample (default: 200)")
    p.add_argument("--num-samples", type=_positive_int, default=1, help="independent samples (default: 1)")
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy; higher = more varied (default: 0.8)")
    p.add_argument("--top-k", type=int, default=200, help="keep the k most likely tokens (0 = all)")
    p.add_argument("--seed", type=_seed, default=1337, help="the same seed gives the same text (default: 1337)")
    p.add_argument("--compile", action="store_true", help="generate with the torch.compile'd model")
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
                       "The folder is written beside OUT_DIR and renamed into place when complete.")
    p.add_argument("run", metavar="RUN", help="a run directory or its ckpt.pt")
    p.add_argument("out_dir", metavar="OUT_DIR", help="the folder to write (absent or empty, unless --force)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "fp32", "bf16"],
                   help="weights' dtype in model.safetensors (default: float32)")
    p.add_argument("--force", action="store_true", help="replace OUT_DIR when it is not empty")
    p.set_defaults(handler=_export)


def _export(args) -> int:
    from gpt2ladder.commands.export import export_command

    return export_command(args)


def _add_parity(sub) -> None:
    p = sub.add_parser("parity", help="show that every rung keeps the loss",
                       description="Train every rung for N steps from the same weights and batches and "
                       "compare train and validation loss with the fp32 baseline's seed-to-seed spread. "
                       "Writes parity.json, parity.md and parity.png; exits 1 when a rung fails.")
    _common(p)
    p.add_argument("--rungs", default="all", help="'all' (rungs this machine cannot run are reported as "
                   "skipped), 'seed', 'auto' or names, applied cumulatively (default: all)")
    p.add_argument("--steps", type=_positive_int, help=f"steps per rung (default: {D('parity', 'steps')})")
    p.add_argument("--batch-size", type=_positive_int, help="sequences per optimizer step; on a GPU the micro-batch "
                   f"is the largest divisor of it that fits (default: {D('parity', 'batch_size')})")
    p.add_argument("--seq-len", type=_positive_int, help=f"tokens per sequence (default: {D('parity', 'seq_len')})")
    p.add_argument("--seeds", type=_positive_int, default=2,
                   help="fp32 baseline runs with different initial weights and data order, for the spread (default: 2)")
    p.add_argument("--tolerance", type=float, default=0.02, help="largest relative loss gap accepted (default: 0.02 = 2%%)")
    p.add_argument("--lr", type=float, default=6e-4, help="peak learning rate (default: 6e-4)")
    p.add_argument("--eval-every", type=_positive_int, help="validate every N steps (default: steps/10)")
    p.add_argument("--eval-batches", type=_positive_int, default=10, help="validation batches (default: 10)")
    p.add_argument("--seed", type=_seed, default=0, help="the weights and batches every rung shares (default: 0)")
    p.add_argument("--data", help="a text file to train on (default: Tiny Shakespeare)")
    _out(p, "parity", "output directory for parity.json, parity.md and parity.png")
    p.add_argument("--shard", metavar="K/N", help="run only every N-th training run from K (0-based), to spread "
                   "one parity over N GPUs; writes parity-shard-K-of-N.json")
    p.add_argument("--merge", nargs="+", metavar="DIR", help="make the report from the shard files in these "
                   "directories (no training)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
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
    p.add_argument("--rungs", default="all", help="'all' (rungs this machine cannot run are reported as "
                   "skipped), 'seed', 'auto' or names, applied cumulatively (default: all)")
    p.add_argument("--batch-size", type=_positive_int, help="sequences per step (default: on a GPU the largest up "
                   f"to 16 at which every rung fits, {DEFAULTS['profile']['cpu']['batch_size']} on CPU)")
    p.add_argument("--seq-len", type=_positive_int, help=f"tokens per sequence (default: {D('profile', 'seq_len')})")
    p.add_argument("--steps", type=_positive_int, default=5, help="profiled steps per rung (default: 5)")
    p.add_argument("--warmup", type=int, default=5, help="unprofiled steps first (default: 5)")
    p.add_argument("--data", help="a text file to train on (default: Tiny Shakespeare)")
    p.add_argument("--seed", type=_seed, default=0)
    p.add_argument("--trace", action="store_true", help="also write a Chrome trace per rung (OUT/trace-<rung>.json)")
    p.add_argument("--last-only", action="store_true", help="profile only the top rung (every named rung "
                   "applied together)")
    _out(p, "profile", "output directory for profile.json, profile.md, profile.png (and traces)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(handler=_profile)


def _profile(args) -> int:
    from gpt2ladder.commands.profile import profile_command

    return profile_command(args)


def _add_doctor(sub) -> None:
    p = sub.add_parser("doctor", help="which rungs this machine can use, and why not",
                       description="Report the device, memory and versions; whether TF32, bf16, fp16 + GradScaler, "
                       "FP8, torch.compile, CUDA graphs and each attention kernel can run here, each with a "
                       "one-line reason; the rungs --rungs auto will climb; and, on a GPU, the largest batch per "
                       "rung and the micro-batch train will use.")
    _common(p, preset=False)
    p.add_argument("--json", action="store_true", help="print one JSON object, for scripts")
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
  gpt2ladder train --init-from hf/gpt2 --steps 500     start from Hugging Face GPT-2 weights (their shape)""",
    "sample": """examples:
  gpt2ladder sample runs/shakespeare --prompt "ROMEO:" --num-tokens 300
  gpt2ladder sample runs/shakespeare/ckpt.pt --num-samples 3 --temperature 0.9
  gpt2ladder sample hf/shakespeare --temperature 0      a Hugging Face folder (e.g. from export)""",
    "export": """examples:
  gpt2ladder export runs/shakespeare hf/shakespeare
  gpt2ladder export runs/shakespeare/ckpt.pt hf/shakespeare --dtype bfloat16 --force
then, in Python:
  GPT2LMHeadModel.from_pretrained("hf/shakespeare"), AutoTokenizer.from_pretrained("hf/shakespeare")""",
    "parity": """examples:
  gpt2ladder parity --rungs seed --steps 300
  gpt2ladder parity --device cpu --steps 60""",
    "profile": """examples:
  gpt2ladder profile --rungs baseline,compile,flash""",
    "doctor": """examples:
  gpt2ladder doctor
  gpt2ladder doctor --device cuda:1
  gpt2ladder doctor --json > machine.json""",
}


def build_parser() -> argparse.ArgumentParser:
    from gpt2ladder import __version__

    parser = _Parser(prog="gpt2ladder", description="Train GPT-2 as fast as the hardware allows, and "
                     "measure where every millisecond went.", epilog=_EXAMPLES[""], formatter_class=_Formatter)
    parser.add_argument("--version", action="version", version=f"gpt2ladder {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for add in (_add_bench, _add_train, _add_sample, _add_export, _add_parity, _add_profile, _add_doctor):
        add(sub)
    for name, p in sub.choices.items():
        p.formatter_class, p.epilog = _Formatter, _EXAMPLES.get(name)
        # SUPPRESS: a --debug given before the command is not overwritten by this one's default.
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show tracebacks instead of one-line errors")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    try:
        args = build_parser().parse_args(argv)
        if args.command is None:
            build_parser().print_help()
            return 2
        return args.handler(args) or 0
    except LadderError as err:
        if debug:
            raise
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
            raise
        where = f": {err.filename}" if err.filename else ""
        print(f"gpt2ladder: error: {_one_line(err.strerror or str(err))}{where}", file=sys.stderr)
        return 1
    except Exception as err:
        if debug or not is_out_of_memory(err):
            raise
        print(f"gpt2ladder: error: {_out_of_memory_line(err)}", file=sys.stderr)
        return 1


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
