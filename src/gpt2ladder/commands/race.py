"""`gpt2ladder race`: flags -> `RaceConfig` -> the runs (`measure.race`) -> race.json, .md, .png.

Every decision is made here, before the first run starts: the rungs and the recipe each trains, the target (given,
or the one the corpus is known by), the settings every run shares, and for each rung the top of the step ladder
this machine supports for its recipe and, on a GPU, the micro-batch that fits. Every mistake in the input fails
here, in one line.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from pathlib import Path

import torch

from gpt2ladder import data as data_mod
from gpt2ladder import defaults as rules
from gpt2ladder.commands.defaults import COMPILE_BACKEND_ENV, MUON_RATES, defaults
from gpt2ladder.defaults import EVAL_NEAR
from gpt2ladder.errors import UsageError
from gpt2ladder.ladder import setup_for
from gpt2ladder.measure import race
from gpt2ladder.measure.batch import plan_training
from gpt2ladder.model.config import preset
from gpt2ladder.model.recipe import WSD_DECAY_FRACTION, parse_recipe
from gpt2ladder.report import race as report
from gpt2ladder.report.records import check_out_dir, output_dir, write_json, write_record
from gpt2ladder.runtime.hardware import Capabilities, cap_memory, detect, resolve_device
from gpt2ladder.runtime.memory import check_fits
from gpt2ladder.training.config import TrainConfig
from gpt2ladder.training.outdirs import check_own_out

# What race writes in --out: its record, and a folder per rung holding a run directory per seed; with several
# --steps, a race per budget in its folder and the records comparing them.
_RUNG = "(" + "|".join(race.RACE_RUNGS) + ")"
_SETTING = "(" + "|".join(race.RUNG_SETTINGS) + ")=[0-9.eE+-]+"
OWN_FILES = (r"race\.(json|md|png)|" + _RUNG + "([" + re.escape(race.STACK + race.DROP) + "]" + _RUNG + ")*"
             + "(" + re.escape(race.SET) + _SETTING + ")*")
BUDGET_DIR = "steps-{}"
OWN_BUDGET_FILES = r"budgets\.(json|md|png)|steps-\d+"

# Tiny Shakespeare has no agreed target: the race's demo default per preset, a loss the first rung reaches within
# the default steps on this text (a demonstration of the race, not a yardstick).
SHAKESPEARE_DEMO_TARGETS = {"tiny": 6.8}
SHAKESPEARE_DEMO_TARGET = 5.4  # every other preset
# A race's runs save their checkpoint only when a signal stops them (for --resume), and at their end only with
# --keep-weights (the weights `sample` and `eval` read); they keep no best.pt. GPT-2's weights with AdamW's moments
# are 1.5 GB: the saves on the way, best.pt at each new lowest validation loss most of them, cost a gpt2 run over one
# pass of a corpus tens of seconds of wall time outside its training time, a save at the end 4-12 s of it
# (benchmarks/RECORDS.md), and a race of every rung over three seeds would keep over 60 GB. A run killed without a
# signal starts again on --resume.
RACE_CKPT_EVERY = 0


def race_command(args) -> int:
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise UsageError("gpt2ladder race runs on one process (one GPU); launch it without torchrun")
    device = resolve_device(args.device)
    caps = cap_memory(device, detect(device), args.gpu_memory)
    names = race.parse_race_rungs(args.rungs)
    missing = [d for d in args.reuse or () if not Path(d).is_dir()]
    if missing:
        raise UsageError(f"--reuse {missing[0]} is not a folder: give a race's --out, whose finished runs this race "
                         "may read instead of training them again")
    if args.target_val_loss not in (None, race.BASELINE_TARGET):
        race.check_target(args.target_val_loss)
    if args.target_val_loss == race.BASELINE_TARGET and names[0] != race.BASELINE_TARGET:
        raise UsageError("--target-val-loss gpt2 reads the target off the gpt2 rung, so --rungs must start with gpt2")
    out = Path(args.out)
    if args.resume and not out.is_dir():  # a mistyped --out would start the whole race over
        raise UsageError(f"--resume: {out} is not a folder, so there is no race to continue; give the --out of the "
                         "race to continue, or leave out --resume to start one there")
    budgets = args.steps or (None,)
    planned = next((n for n in names if "steps" in race.split_settings(n)[1]), None)
    if len(budgets) > 1 and planned is not None:
        raise UsageError(f"race rung {planned} is planned for steps of its own, which are no budget's: race it at "
                         "one --steps")
    if len(budgets) > 1:
        return _budgets(args, device, caps, names, out, budgets)
    tokens = data_mod.load_tokens(args.data)
    cfg, earlier = _planned(args, budgets[0], device, caps, names, out, tokens)
    if args.dry_run:
        return _dry_run(args, cfg, device, caps, tokens, out, earlier)
    with output_dir(out) as out:
        return _race(args, cfg, device, caps, tokens, out, earlier)[0]


def _planned(args, steps: int | None, device, caps, names, out: Path, tokens) -> tuple[race.RaceConfig, dict | None]:
    """The race planned for `steps` (None: the default) in `out`, every check made: its config, and its record so
    far where --resume continues one."""
    held = budget_folders(out)
    if held or (out / "budgets.json").is_file():
        listed = ",".join(map(str, held)) or "A,B"
        raise UsageError(f"{out} holds a race at several budgets ({listed} steps): give --steps {listed} to "
                         f"continue it, or --out {out / BUDGET_DIR.format('N')} for one of them")
    check_own_out(out, "race", OWN_FILES)
    race.check_new_race(out, args.resume)
    earlier = _earlier(out) if args.resume else None
    target, source = target_for(args, tokens)
    cfg = race_config(args, device, caps, names, target, source, steps)
    check_corpus(cfg, tokens)
    race.check_same_race(cfg, earlier, tokens.sha256)
    return cfg, earlier


def _budgets(args, device, caps, names, out: Path, budgets: tuple[int, ...]) -> int:
    """A race per budget, the shortest first, each in OUT/steps-N/ as one race would be written, then budgets.json,
    .md and .png: each rung's time to its budget's target beside the first rung's. Every budget is planned and
    checked before the first run."""
    check_own_out(out, "race", OWN_BUDGET_FILES)
    check_budgets(out, budgets, args.resume)
    tokens = data_mod.load_tokens(args.data)
    plans = [(steps, *_planned(args, steps, device, caps, names, out / BUDGET_DIR.format(steps), tokens))
             for steps in budgets]
    if args.dry_run:
        for steps, cfg, earlier in plans:
            print(f"\nbudget: runs planned for {steps} steps ({steps * cfg.train.tokens_per_step:,} tokens)",
                  flush=True)
            _dry_run(args, cfg, device, caps, tokens, out / BUDGET_DIR.format(steps), earlier)
        return 0
    records, code = [], 0
    with output_dir(out) as out:
        try:
            for steps, cfg, earlier in plans:
                own = " (an @tokens_per_step rung: its steps of its own batch)" * bool(cfg.own_batch_rungs)
                print(f"\nbudget: runs planned for {steps} steps ({steps * cfg.train.tokens_per_step:,} tokens){own}",
                      flush=True)
                with output_dir(out / BUDGET_DIR.format(steps)) as where:
                    code, record = _race(args, cfg, device, caps, tokens, where, earlier)
                records.append(record)
                if code:
                    break
        finally:  # the budgets finished so far, also when a failure or a second Ctrl-C ends the races
            record = race.budgets_record(records, device, caps, partial=len(records) < len(plans) or bool(code))
            paths = write_record(out, "budgets", record, report.format_budgets, report.budgets_chart)
    print("\n" + report.format_budgets_table(record))
    print(f"wrote {', '.join(str(p) for p in paths)}")
    return code


def budget_folders(out: Path) -> list[int]:
    """The budgets (steps) a folder holds a race of, from its steps-N folders."""
    return sorted(int(p.name.split("-", 1)[1]) for p in out.glob("steps-*") if re.fullmatch(r"steps-\d+", p.name))


def check_budgets(out: Path, budgets: tuple[int, ...], resume: bool) -> None:
    """Without --resume, races at several budgets may not start over earlier ones; with it, the list must hold every
    budget the folder has, so budgets.json never drops one."""
    held = budget_folders(out)
    if held and not resume:
        raise UsageError(f"{out} already holds a race at budgets {', '.join(map(str, held))} (steps-N folders); pass "
                         "--resume to continue it, or another --out")
    missing = [n for n in held if n not in budgets]
    if missing:
        raise UsageError(f"{out} holds races at budgets {', '.join(map(str, held))}, and --steps leaves out "
                         f"{', '.join(map(str, missing))}; give --steps "
                         f"{','.join(map(str, sorted({*held, *budgets})))}")


def _earlier(out: Path) -> dict | None:
    path = out / "race.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        raise UsageError(f"{path} is not valid JSON (damaged); move it away to start the race again") from None


def target_for(args, tokens: data_mod.TokenData) -> tuple[float, str]:
    """The target and where it came from: given; Tiny Shakespeare's demo default; or the one a prepared corpus's
    source is known by. A UsageError where there is none."""
    if args.target_val_loss == race.BASELINE_TARGET:
        return None, "the gpt2 rung's validation loss after its planned steps, the highest over its seeds"
    if args.target_val_loss is not None:
        return args.target_val_loss, "given"
    if args.data is None:
        name = args.preset or defaults("race", torch.device("cpu"))["preset"]
        target = SHAKESPEARE_DEMO_TARGETS.get(name, SHAKESPEARE_DEMO_TARGET)
        return target, "Tiny Shakespeare's demo default, not an agreed yardstick"
    source = corpus_source(args.data)
    target = race.known_target(source)
    if target is None:
        raise UsageError(f"no --target-val-loss, and {tokens.source} has no known target (FineWeb's is 3.28, read "
                         "from the manifest prepare wrote); give --target-val-loss X")
    return target, f"{source}'s known target"


def corpus_source(data: str) -> str | None:
    """The source name a prepared corpus's manifest records (a Hugging Face dataset's name), or None."""
    from gpt2ladder.data import manifest

    path = Path(data).expanduser() / manifest.FINAL
    if not path.is_file():
        return None
    described = manifest.read(path).get("source")
    return described.get("name") if isinstance(described, dict) else None


def race_config(args, device, caps: Capabilities, names: tuple[str, ...], target: float, source: str,
                steps: int | None = None) -> race.RaceConfig:
    d = defaults("race", device)
    name = args.preset or d["preset"]
    shape = preset(name)
    steps, lr = steps or d["steps"], args.lr or d["lr"]
    seq_len = args.seq_len or min(d["seq_len"] or shape.block_size, shape.block_size)
    batch = args.batch_size or d["batch_size"]
    every = args.eval_every or max(1, steps // d["validations"])
    train = TrainConfig(
        preset=name, model=shape, batch_size=batch, seq_len=seq_len, steps=steps, lr=lr, min_lr=rules.min_lr(lr),
        tokens_per_step=args.tokens_per_step or batch * seq_len, warmup_steps=rules.warmup_steps(steps),
        eval_every=every, eval_batches=d["eval_batches"], ckpt_every=RACE_CKPT_EVERY, keep_best=False,
        target_val_loss=target, save_at_end=args.keep_weights, data=args.data,
        compile_backend=os.environ.get(COMPILE_BACKEND_ENV) or "inductor",
        **{name: getattr(args, name) or d.get(name, rate) for name, rate in MUON_RATES.items()},
        decay_fraction=args.decay_fraction or WSD_DECAY_FRACTION, eval_near=args.eval_near or EVAL_NEAR,
    )
    planned = race.race_rungs(names)
    recipes = [parse_recipe(recipe) for _, recipe in planned]
    idle = [f"--{name.replace('_', '-')}" for name in MUON_RATES if getattr(args, name)]
    if idle and all(r.optimizer != "muon" for r in recipes):  # taken, they would be recorded and do nothing
        raise UsageError(f"{', '.join(idle)} set the muon recipe part's rates; no rung of this race has muon")
    if args.decay_fraction and all(r.schedule != "wsd" for r in recipes):
        raise UsageError("--decay-fraction sets the wsd recipe part's decay; no rung of this race has wsd")
    rungs = tuple(race_rung(n, recipe, train, args, device, caps) for n, recipe in planned)
    cfg = race.RaceConfig(rungs=rungs, seeds=args.seeds or d["seeds"], train=train, target_source=source,
                          from_baseline=target is None)
    check_validations(cfg)
    return cfg


def check_validations(cfg: race.RaceConfig) -> None:
    """A UsageError where a run would validate at its last step alone: a race reads its time at a validation, so
    the interval must fit in the steps a run is planned for (the race's, or a rung's own @steps)."""
    every, per_step = cfg.train.eval_every, cfg.train.tokens_per_step
    for rung in cfg.rungs:
        run = cfg.run_config(rung, 0)
        if run.eval_every > run.steps:  # in the rung's own steps; the advice in the race's
            most = run.steps * run.tokens_per_step // per_step
            whose = (f"the {run.steps} steps a run is planned for" if (run.steps, run.tokens_per_step) == (
                cfg.train.steps, per_step) else f"the {most:,} steps of {per_step:,} tokens rung {rung.name} trains")
            raise UsageError(f"the race validates every {every} steps of {per_step:,} tokens, more than {whose}: "
                             f"give --eval-every {most} or fewer")


def race_rung(name: str, recipe: str, train: TrainConfig, args, device, caps: Capabilities) -> race.RaceRung:
    """The rung as it runs here: the step rungs `--rungs auto` gives its recipe (on a CPU, none that compiles) and,
    on a GPU without --batch-size, the largest micro-batch that fits and divides the step."""
    problem = race.recipe_problem(recipe, caps)
    if problem:
        raise UsageError(f"race rung {name}: {problem}")
    step_rungs = race.step_rungs_for(recipe, caps)
    own = race.split_settings(name)[1].get("tokens_per_step", train.tokens_per_step)
    race.check_sequences(name, own, train.seq_len)
    per_step = own // train.seq_len  # a rung's own step: its validation is cut to what the micro-batch holds
    batch = train.batch_size if args.batch_size else math.gcd(train.batch_size, per_step)
    try:
        cfg = dataclasses.replace(train, recipe=recipe, rungs=step_rungs, tokens_per_step=own, batch_size=batch)
    except UsageError as err:  # its own tokens_per_step, which the micro-batch does not divide
        raise UsageError(f"race rung {name}: {err}") from None
    if device.type == "cuda" and not args.batch_size:
        step_rungs, plan, _ = plan_training(cfg.model, step_rungs, cfg.seq_len, caps, device, per_step, validates=True,
                                            graph_only_too=True)
        batch = plan.batch
    own_batch = "" if own == train.tokens_per_step else "@tokens_per_step, "  # its step's batch is its own
    problem = check_fits(cfg.model, setup_for(list(step_rungs)), batch, cfg.seq_len, caps,
                         batch_tokens=own + cfg.eval_batches * train.tokens_per_step,
                         fewer_tokens=f"{own_batch}--tokens-per-step or --eval-batches")
    if problem:
        raise UsageError(f"race rung {name}: {problem}")
    return race.RaceRung(name, recipe, step_rungs, batch)


def check_corpus(cfg: race.RaceConfig, tokens: data_mod.TokenData) -> None:
    """A UsageError unless the data holds what one rung needs: a sequence for training and one for validation
    and, for a corpus of shards (read without replacement), every token of a rung's planned steps."""
    data_mod.check_splits(tokens, cfg.train.seq_len, validate=True, skippable=False)  # a race validates
    runs = [(cfg.run_config(r, 0), r.name) for r in cfg.rungs]
    need, steps, per_step, rung = max((run.steps * run.tokens_per_step, run.steps, run.tokens_per_step, name)
                                      for run, name in runs)
    if isinstance(tokens.train, data_mod.ShardedTokens) and len(tokens.train) < need:
        planned = (f"--steps {steps} x --tokens-per-step {per_step:,}" if (steps, per_step) == (
            cfg.train.steps, cfg.train.tokens_per_step) else f"rung {rung}'s {steps} steps of {per_step:,} tokens")
        raise UsageError(f"the corpus's training shards hold {len(tokens.train):,} tokens, fewer than one rung's "
                         f"{need:,} ({planned}); use a larger corpus or fewer steps")


def _announce(args, cfg: race.RaceConfig, caps, tokens, out: Path, earlier: dict | None, dry: bool = False) -> None:
    """The race's first line, and the notices about the runs an earlier record or another card holds."""
    say = print
    s = cfg.train
    goal = "gpt2's" if cfg.target is None else f"{cfg.target:g}"
    near = f" (every {s.near_every} within {s.eval_near:g} of the target)" if s.eval_near else ""
    own_batch = " (an @tokens_per_step rung of its own, validated after the same tokens)" * bool(cfg.own_batch_rungs)
    say(f"gpt2ladder race{' --dry-run' * dry}: {len(cfg.rungs)} rung{'s' * (len(cfg.rungs) != 1)} x {cfg.seeds} "
        f"seed{'s' if cfg.seeds > 1 else ''},"
        f" model {s.preset} on {caps.name}, to validation loss {goal} ({cfg.target_source}); each run planned for "
        f"{s.steps} steps"
        f"{' (an @steps rung for its own)' if any('steps' in r.settings for r in cfg.rungs) else ''} "
        f"of {s.tokens_per_step:,} tokens{own_batch}, validated every {s.eval_every}{near}; runs in "
        f"{out}/<rung>/seed<k>/", flush=True)
    if caps.device_type != "cuda":
        say(f"notice: {race.CPU_COMPILE}", flush=True)
    for name, why in race.recorded_apart(cfg, earlier, tokens.sha256, out) if args.resume else ():
        say(f"notice: rung {name}'s recorded runs train again: {why}", flush=True)
    unnamed = race.unnamed_corpus_runs(cfg, earlier, out) if args.resume else 0
    if unnamed:
        say(f"notice: the race.json here names no corpus sha256 (an older version wrote it), so nothing says what its "
            f"runs read: {unnamed} finished run{'s' * (unnamed > 1)} it records train again", flush=True)
    others = race.other_cards(earlier, caps.name)
    if others:
        say(f"notice: runs of this race trained on {', '.join(others)}, and this one trains on {caps.name}: its record "
            "will name both cards, and seconds from two cards are not one race's", flush=True)


def _race(args, cfg: race.RaceConfig, device, caps, tokens, out: Path, earlier: dict | None) -> tuple[int, dict]:
    say = print
    s = cfg.train
    _announce(args, cfg, caps, tokens, out, earlier)

    def on_record(record: dict) -> None:
        for stale in ("race.md", "race.png"):
            (out / stale).unlink(missing_ok=True)
        write_json(out / "race.json", record)

    target = [cfg.target]  # set by the gpt2 rung's runs under --target-val-loss gpt2

    trained = []  # whether each run trained here
    last = []  # (rung, seed, result) of the run just done
    said = set()  # the rungs whose line has come

    def on_run(rung: race.RaceRung, seed: int, result: dict, ran: bool) -> None:
        again = f" (reused from {result['reused_from']})" if result.get("reused_from") else " (finished earlier)"
        say(report.run_line(rung.name, result, target[0], rung.step_rungs) + ("" if ran else again), flush=True)
        trained.append(ran)
        last[:] = [(rung.name, seed, result)]

    def on_rung(record: dict) -> None:
        on_record(record)
        if target[0] is None and record["target_val_loss"] is not None:
            target[0] = record["target_val_loss"]
            say(f"target: validation loss {target[0]:g}, the gpt2 rung's after {s.steps} steps (the highest over its "
                "seeds)", flush=True)
        elif target[0] is None:
            return
        # The row of the rung whose run was just done, once, after its last seed or its first run that failed: under
        # --resume the record also holds later rungs' recorded runs, so its last row need not be this rung's.
        name, seed, result = last[0]
        if name not in said and (seed == cfg.seeds - 1 or result["status"] != "ok"):
            said.add(name)
            say(report.progress_line(next(r for r in record["rungs"] if r["name"] == name), target[0]), flush=True)

    reuse = _reuse_dirs(args, s.steps)
    # A fresh race that knows every run it plans (its target given, or gpt2 its only rung) names a folder that can
    # serve none of them now, before they cost their time; else once it is done, knowing which runs it trained.
    told = {}
    for source in reuse if not args.resume and (cfg.target is not None or len(cfg.rungs) == 1) else ():
        why = race.reuse_miss(source, cfg, cfg.target, tokens.sha256, caps.name)
        if why:
            told[source] = why
            say(f"notice: --reuse {source}: no run will be copied from it: {why}", flush=True)
    record, code = race.run_race(cfg, device, out, caps, tokens, resume=args.resume, progress=not args.no_progress,
                                 on_record=on_rung, on_run=on_run, reuse=reuse,
                                 recorded=race.recorded_runs(earlier, tokens.sha256, cfg.rungs))
    paths = write_record(out, "race", record, report.format_markdown, report.race_chart)
    say("\n" + report.format_table(record))
    say(f"wrote {', '.join(str(p) for p in paths)}")
    for source in reuse if any(trained) else ():  # a folder that could serve no run: why, as the runs cost time
        why = race.reuse_miss(source, cfg, record.get("target_val_loss"), tokens.sha256, caps.name)
        if why and why != told.get(source):
            say(f"notice: --reuse {source}: no run copied from it: {why}", flush=True)
    if code:
        say("the race stopped; --resume continues it from the runs it finished")
    return code, record


def _reuse_dirs(args, steps: int) -> tuple[Path, ...]:
    """The --reuse folders for a race of `steps`: of a race at several budgets, the one of this budget."""
    return tuple(d / BUDGET_DIR.format(steps) if (d / BUDGET_DIR.format(steps)).is_dir() else d
                 for d in map(Path, args.reuse or ()))


def _dry_run(args, cfg: race.RaceConfig, device, caps, tokens, out: Path, earlier: dict | None) -> int:
    """--dry-run: the race planned, every check made, and what each run would be: trained, continued from its
    checkpoint, read back (--resume) or reused (--reuse); nothing is trained, copied or written."""
    check_out_dir(out)
    say = print
    _announce(args, cfg, caps, tokens, out, earlier, dry=True)
    fates: list[str] = []  # each run's, as the summary counts them

    def on_run(rung: race.RaceRung, seed: int, result: dict, ran: bool) -> None:
        if result["status"] == "planned":
            fate, kind = {"continue": ("continues from its checkpoint", "to continue"),
                          "again": ("trains again from its start: the target fell below where it stopped", "to train")
                          }.get(result["reason"], ("trains", "to train"))
        elif result.get("reused_from"):
            fate, kind = f"reused from {result['reused_from']}", "reused"
        else:
            fate = kind = "finished earlier"
        fates.append(kind)
        say(f"  {rung.name} seed {seed}: {fate}", flush=True)

    reuse = _reuse_dirs(args, cfg.train.steps)
    plan, _ = race.run_race(cfg, device, out, caps, tokens, resume=args.resume, progress=False, on_run=on_run,
                            reuse=reuse, recorded=race.recorded_runs(earlier, tokens.sha256, cfg.rungs), dry=True)
    waiting = 0
    if plan["unknown_after"] is not None and plan["unknown_after"] != cfg.rungs[-1].name:
        after = [r.name for r in cfg.rungs].index(plan["unknown_after"]) + 1
        waiting = (len(cfg.rungs) - after) * cfg.seeds
        say(f"  {waiting} run{'s' * (waiting != 1)} of the rungs after {plan['unknown_after']} wait"
            f"{'s' * (waiting == 1)} on its target, which its runs to train set: each is read back, reused or trained "
            "once they have", flush=True)
    counts = {fate: fates.count(fate) for fate in dict.fromkeys(fates)}
    told = ", ".join(f"{n} {fate}" for fate, n in counts.items())
    total = len(fates) + waiting
    say(f"dry run: {total} run{'s' * (total != 1)}: {told}{f', {waiting} waiting on the target' * bool(waiting)}; "
        "nothing trained or written")
    if ("to train" in counts or "to continue" in counts) and not waiting:  # else: what serves is not known yet
        for source in reuse:
            why = race.reuse_miss(source, cfg, plan["target"], tokens.sha256, caps.name)
            if why:
                say(f"notice: --reuse {source}: no run would be copied from it: {why}", flush=True)
    return 0
