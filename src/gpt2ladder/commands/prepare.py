"""`gpt2ladder prepare SOURCE OUT`: a source's documents -> llm.c token shards and a manifest
(`data/prepare.py` does the work; this reads the flags, says what will happen and how it went)."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from pathlib import Path

from gpt2ladder.commands.defaults import DEFAULTS
from gpt2ladder.data import manifest as manifest_mod
from gpt2ladder.data.prepare import PrepareConfig, Plan, available_cores, default_name, drop_temporaries, plan, run
from gpt2ladder.data.sources import Source, SourceSpec, open_source
from gpt2ladder.errors import LadderError, UsageError
from gpt2ladder.report.progress import progress_bar
from gpt2ladder.training import lock


def prepare_command(args) -> int:
    spec = SourceSpec(args.source, args.format, args.text_field, args.subset, args.split, args.follow_links)
    cfg = PrepareConfig(spec, Path(args.out).expanduser(), args.name or default_name(args.source),
                        args.val_tokens, args.shard_tokens, args.workers or available_cores())
    source = open_source(spec)
    source.check()  # a missing column or an empty source: one line now, before any work
    with _held(cfg.out):
        return _prepare(args, cfg, source)


@contextlib.contextmanager
def _held(out: Path):
    """This process alone writes OUT while the block runs: it holds OUT/.lock (hidden, so the plan and the
    loaders pass over it; gone when the block ends). A second prepare into the same OUT fails in one line;
    run together, each would take the other's temporaries for a killed run's and remove them. An OUT that
    cannot be written (a file, a read-only folder) is not locked: nothing can be written there, and the
    plan or the run says why (a finished corpus there still answers that it has nothing to do)."""
    made = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        held, holder = lock.try_lock(out)
    except OSError:
        held = holder = None
    if holder:
        raise UsageError(f"{out} is being written by another gpt2ladder prepare ({holder}); wait for it to "
                         "finish, or give another OUT")
    try:
        yield
    finally:
        if held is not None:
            held.release()
        if made:
            with contextlib.suppress(OSError):
                out.rmdir()  # only if still empty: a refused plan leaves no new folder behind


def _prepare(args, cfg: PrepareConfig, source: Source) -> int:
    planned = plan(cfg, source)
    if planned.finished:
        print(f"{cfg.out} already holds this corpus ({_counts(planned.finished)}); nothing to do")
        return 0
    print(_banner(cfg, source, planned))
    t0 = time.perf_counter()
    start = planned.start
    bar = progress_bar(source.total_documents, "prepare", enabled=not args.no_progress, unit="doc",
                       initial=start["documents"] if start else 0)
    tokens = 0

    def progress(n_documents: int, n_tokens: int) -> None:
        nonlocal tokens
        tokens += n_tokens
        bar.update(n_documents)
        bar.set_postfix_str(f"{tokens / max(time.perf_counter() - t0, 1e-9):,.0f} tokens/s", refresh=False)

    try:
        with _terminate_as_interrupt():
            manifest = run(cfg, source, planned, progress)
    except KeyboardInterrupt as err:
        bar.close()
        drop_temporaries(cfg)
        how = "terminated" if isinstance(err, _Terminated) else "interrupted"
        print(f"gpt2ladder: {how}; {_kept(cfg)} kept in {cfg.out}: run the same command to continue",
              file=sys.stderr)
        return 143 if isinstance(err, _Terminated) else 130
    finally:
        bar.close()
    seconds = time.perf_counter() - t0
    print(f"wrote {cfg.out}: {_counts(manifest)}, in {seconds:.1f} s ({tokens / max(seconds, 1e-9):,.0f} tokens/s "
          f"on {cfg.workers} worker{'' if cfg.workers == 1 else 's'}); {_next_step(cfg.out, manifest, cfg.val_tokens)}")
    return 0


def _next_step(out: Path, manifest: dict, val_tokens: int) -> str:
    """What to do with the corpus: train on it, or, where train as it runs by default would refuse it (the rule
    of `data/batches.check_splits`, for the shortest sequence of train's defaults: --seq-len on a CPU, plus the
    next token), which split is too short, how to prepare it again (`val_tokens`: the --val-tokens it was prepared
    with, which caps the validation split), and what train takes instead."""
    seq_len = DEFAULTS["train"]["cpu"]["seq_len"]
    need = seq_len + 1
    val = sum(s["n_tokens"] for s in manifest["shards"] if s["split"] == "val")
    train = [s["n_tokens"] for s in manifest["shards"] if s["split"] == "train"]
    largest = max(train, default=0)
    short, again = [], []
    if val < need:
        short.append(f"validation holds {_many(val, 'token')}")
        again.append("with a larger --val-tokens" if val >= val_tokens else "from a longer source")
    if sum(train) < need:
        short.append(f"training holds {sum(train):,}")
        again.append("from a longer source")
    elif largest < need:
        short.append(f"no training shard holds that many (the largest {largest:,}; a sequence never spans shards)")
        again.append("with a larger --shard-tokens")
    if not short:
        return f"train on it with --data {out}"
    remedy = "prepare again into another OUT " + " and ".join(dict.fromkeys(again))
    if largest >= need:  # only validation is short
        remedy += ", or train with --eval-every 0" + (f" or a --seq-len below {val:,}" if val >= 2 else "")
    elif largest >= 2:
        remedy += (f", or train with --eval-every 0 and a --seq-len below {largest:,}" if val < 2 else
                   f", or train with a --seq-len below {min(largest, val):,}")
    return (f"too small for train's shortest default sequence, {need} tokens (--seq-len {seq_len} on a CPU, plus "
            f"the next token): {' and '.join(short)}; {remedy}")


class _Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is."""


@contextlib.contextmanager
def _terminate_as_interrupt():
    """SIGTERM stops prepare as Ctrl-C does: the workers are stopped and joined, temporaries dropped, the
    finished shards kept. Its default, ending the process where it stands, leaves the pool's semaphores to
    the resource tracker, which warns of them. Outside the main thread (no handlers there) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum, frame):
        raise _Terminated

    previous = signal.signal(signal.SIGTERM, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _banner(cfg: PrepareConfig, source: Source, planned: Plan) -> str:
    what = _describe(source.description)
    docs = f", {_many(source.total_documents, 'document')}" if source.total_documents else ""
    plan_text = (f"continuing after {len(planned.kept)} finished shard{'' if len(planned.kept) == 1 else 's'}"
                 if planned.kept else
                 f"{cfg.name}_val_000000.bin gets the first {cfg.val_tokens:,} tokens (a tenth of the source if it "
                 f"holds fewer than {10 * cfg.val_tokens:,}), then {cfg.name}_train_*.bin {cfg.shard_tokens:,} each")
    return (f"prepare: {what}{docs} -> {cfg.out}: {plan_text}; tokenizing on {cfg.workers} "
            f"worker{'' if cfg.workers == 1 else 's'}")


def _describe(d: dict) -> str:
    if d["kind"] == "hf":
        subset = f" ({d['subset']})" if d.get("subset") else ""
        return f"the Hugging Face dataset {d['name']}{subset}, split {d['split']}"
    skipped = [f"{v['count']:,} {_one(what) if v['count'] == 1 else what} ({', '.join(v['first'])}"
               f"{', ...' if v['count'] > 3 else ''})" for what, v in d.get("skipped", {}).items()]
    listed = ", ".join(skipped[:-1]) + " and " + skipped[-1] if len(skipped) > 1 else "".join(skipped)
    return f"{d['path']} ({d['files']:,} {d['kind']} file{'' if d['files'] == 1 else 's'}" \
           f"{', skipping ' + listed if skipped else ''})"


def _one(what: str) -> str:
    """A kind of skipped thing, as the manifest names it (plural), said of one: "broken links" -> "broken link"."""
    return " ".join({"files": "file", "links": "link"}.get(word, word) for word in what.split(" "))


def _counts(manifest: dict) -> str:
    val = [s for s in manifest["shards"] if s["split"] == "val"]
    train = [s for s in manifest["shards"] if s["split"] == "train"]
    return (f"{_many(manifest['documents'], 'document')}, {_many(manifest['n_tokens'], 'token')}: validation "
            f"{sum(s['n_tokens'] for s in val):,}, training {sum(s['n_tokens'] for s in train):,} in "
            f"{len(train)} shard{'' if len(train) == 1 else 's'}")


def _many(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _kept(cfg: PrepareConfig) -> str:
    try:
        n = len(manifest_mod.read(cfg.out / manifest_mod.PARTIAL)["shards"])
    except LadderError:  # no shard finished yet (no partial manifest), or it is unreadable
        n = 0
    return f"the {n} finished shard{'' if n == 1 else 's'}"
