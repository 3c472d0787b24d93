"""`gpt2ladder parity`: show that every rung of the ladder trains to the loss the fp32 baseline reaches.

Every rung trains for the same number of steps from the same initial weights (`build_model` with one
seed gives identical numbers, padded vocabulary or not) on the same batches, with the same AdamW and
learning-rate schedule; only the setup differs. The fp32 baseline also trains `seeds` times with
different seeds for both the initial weights and the data order: how far apart those runs end is the
ordinary run-to-run variation (the spread), the yardstick a rung's gap is measured against.

Verdict per rung: PASS when |val_rung - val_base| <= min(max(spread, floor x val_base), tolerance x val_base).
The floor keeps two baseline runs that happen to land close together from failing honest rungs; the
tolerance caps the allowance however noisy the baseline is.

Validation runs the rung's weights through the eager model (`engine.raw_model`) under the rung's
precision and autocast: the train loss already measures the rung's own (maybe compiled) forward, and
an eager eval spares every compiled rung a second compile for the no-grad graph.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from gpt2ladder import data as data_mod
from gpt2ladder.config import ModelConfig, preset
from gpt2ladder.engine import Engine, OptimConfig
from gpt2ladder.errors import LadderError, UsageError, describe_failure
from gpt2ladder.rungs import RUNGS_BY_NAME, Setup, setup_for, why_unavailable
from gpt2ladder.hardware import free_memory
from gpt2ladder.report import progress_bar

MIN_LR_FRACTION = 0.1  # the cosine decays to lr/10, as nanoGPT does
GRAD_CLIP = 1.0


@dataclass(frozen=True)
class ParityConfig:
    preset: str = "tiny"
    rungs: tuple[str, ...] = ("baseline",)
    batch_size: int = 4
    seq_len: int = 64
    steps: int = 60
    seeds: int = 2  # fp32 baseline runs (seed, seed+1, ...) whose spread is the yardstick
    tolerance: float = 0.02  # the largest relative val-loss gap ever accepted
    floor: float = 0.005  # the smallest relative gap always accepted (inside the tolerance)
    lr: float = 6e-4
    warmup_steps: int | None = None  # None: 5% of the steps
    eval_every: int | None = None  # None: a tenth of the steps
    eval_batches: int = 10
    seed: int = 0  # the reference seed: every rung starts from these weights and sees these batches
    data: str | None = None  # a text file; None = Tiny Shakespeare
    compile_backend: str = "inductor"

    def __post_init__(self) -> None:
        for name in ("batch_size", "seq_len", "steps", "eval_batches"):
            if getattr(self, name) <= 0:
                raise UsageError(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(self, name)}")
        if self.seeds < 2:
            raise UsageError(f"--seeds must be at least 2 (the spread needs two baseline runs), got {self.seeds}")
        if not 0 < self.tolerance < 1:
            raise UsageError(f"--tolerance is a fraction between 0 and 1 (0.02 = 2%), got {self.tolerance}")
        if not self.lr > 0:
            raise UsageError(f"--lr must be positive, got {self.lr}")
        if self.eval_every is not None and self.eval_every <= 0:
            raise UsageError(f"--eval-every must be a positive integer, got {self.eval_every}")
        if self.seq_len > preset(self.preset).block_size:
            raise UsageError(f"--seq-len {self.seq_len} exceeds the {self.preset} block size of "
                             f"{preset(self.preset).block_size}")

    @property
    def n_warmup(self) -> int:
        return max(1, self.steps // 20) if self.warmup_steps is None else self.warmup_steps

    @property
    def eval_interval(self) -> int:
        return self.eval_every or max(1, self.steps // 10)


@dataclass(frozen=True)
class _Context:
    """What every training run of one parity command shares."""

    cfg: ParityConfig
    model_cfg: ModelConfig
    tokens: data_mod.TokenData
    evals: list  # fixed validation batches, already on the device
    device: torch.device
    progress: bool


# --- the rule ---------------------------------------------------------------------------------------


def allowed_gap(base_val: float, spread: float, tolerance: float, floor: float) -> float:
    """The largest |val_rung - val_base| that passes: the spread, at least the floor, at most the tolerance."""
    return min(max(spread, floor * base_val), tolerance * base_val)


def verdict(val: float, base_val: float, spread: float, tolerance: float, floor: float) -> bool:
    """PASS (True) when the rung's final val loss is within the allowed gap of the baseline's."""
    if not (math.isfinite(val) and math.isfinite(base_val)):
        return False
    return abs(val - base_val) <= allowed_gap(base_val, spread, tolerance, floor)


def rule_text(cfg: ParityConfig) -> str:
    return (f"PASS when |val_rung - val_base| <= min(max(spread, {cfg.floor:.1%} of val_base), "
            f"{cfg.tolerance:.1%} of val_base); spread = the largest difference of final val loss among "
            f"{cfg.seeds} fp32 baseline runs with seeds {cfg.seed}..{cfg.seed + cfg.seeds - 1} "
            "(initial weights and data order)")


def final_train_loss(losses: list[float]) -> float:
    """Mean of the last 10% of steps (at least one), so a single noisy batch does not decide."""
    tail = losses[-max(1, round(len(losses) * 0.1)):]
    return sum(tail) / len(tail)


def lr_at(step: int, cfg: ParityConfig) -> float:
    """Linear warm-up, then cosine decay to lr/10 at the last step; the same for every rung."""
    if step < cfg.n_warmup:
        return cfg.lr * (step + 1) / cfg.n_warmup
    progress = (step - cfg.n_warmup) / max(1, cfg.steps - cfg.n_warmup)
    min_lr = cfg.lr * MIN_LR_FRACTION
    return min_lr + 0.5 * (cfg.lr - min_lr) * (1 + math.cos(math.pi * min(1.0, progress)))


# --- training one run -------------------------------------------------------------------------------


@torch.no_grad()
def evaluate(engine: Engine, evals: list) -> float:
    """Mean loss over the fixed validation batches, eager, under the rung's precision and autocast."""
    model = engine.raw_model
    model.eval()
    try:
        with engine.precision(), engine.autocast():
            losses = [model(x, y)[1].float() for x, y in evals]
    finally:
        model.train()
    return float(torch.stack(losses).mean())


def train_run(setup: Setup, seed: int, ctx: _Context, label: str) -> dict:
    """Train one setup from `seed`'s weights on `seed`'s batches; the losses as plain floats."""
    cfg = ctx.cfg
    engine = Engine(ctx.model_cfg, setup, ctx.device, seed=seed, compile_backend=cfg.compile_backend,
                    optim=OptimConfig(lr=cfg.lr, grad_clip=GRAD_CLIP))
    batches = data_mod.Batches(ctx.tokens.train, cfg.batch_size, cfg.seq_len, seed=seed)
    val = [[0, evaluate(engine, ctx.evals)]]
    losses = []  # device tensors: read back once at the end, not one host sync per step
    bar = progress_bar(cfg.steps, label, ctx.progress)
    for step in range(cfg.steps):
        engine.set_lr(lr_at(step, cfg))
        losses.append(engine.step(*data_mod.to_device(*batches.next(), ctx.device)))
        if (step + 1) % cfg.eval_interval == 0 or step + 1 == cfg.steps:
            val.append([step + 1, evaluate(engine, ctx.evals)])
            bar.set_postfix_str(f"val {val[-1][1]:.4f}")
        bar.update(1)
    bar.close()
    train = torch.stack(losses).float().cpu().tolist()
    del engine
    return {"seed": seed, "first_loss": train[0], "final_train": final_train_loss(train),
            "final_val": val[-1][1], "train_loss": train, "val": val}


def _guarded(setup: Setup, seed: int, ctx: _Context, label: str) -> dict:
    """A run's result, or {"status": "failed", "reason": one line} when it raised (OOM included)."""
    try:
        result = {"status": "ok", **train_run(setup, seed, ctx, label)}
    except LadderError:
        raise
    except Exception as err:  # a rung that breaks is a finding, not a reason to lose the others
        result = {"status": "failed", "reason": describe_failure(err)}
    free_memory(ctx.device)  # after the except block, so the traceback no longer holds the failed step's tensors
    return result


# --- the ladder -------------------------------------------------------------------------------------


def work_units(cfg: ParityConfig, caps) -> tuple[list[dict], dict[str, str]]:
    """Every training run the report needs, in a fixed order, and the rungs this machine skips (why).

    Units are the fp32 baseline at each seed, then each runnable rung, cumulative like `bench`
    (rung k = every runnable rung up to k). The baseline rung itself is the seed-0 baseline run.
    Each unit is independent, so `--shard K/N` can spread them over several GPUs.
    """
    units = [{"id": f"baseline-seed{cfg.seed + i}", "setup": Setup(), "seed": cfg.seed + i,
              "label": f"fp32 seed {cfg.seed + i}"} for i in range(cfg.seeds)]
    skipped, applied = {}, []
    for name in cfg.rungs:
        reason = why_unavailable(name, caps)
        if reason:
            skipped[name] = reason
            continue
        applied.append(name)
        if setup_for(applied) != Setup():
            units.append({"id": name, "setup": setup_for(applied), "seed": cfg.seed, "label": name})
    return units, skipped


def run_units(ctx: _Context, units: list[dict]) -> dict[str, dict]:
    return {u["id"]: _guarded(u["setup"], u["seed"], ctx, u["label"]) for u in units}


def assemble(cfg: ParityConfig, results: dict[str, dict], skipped: dict[str, str]) -> dict:
    """The report from the units' results: baseline runs, spread, one judged row per rung."""
    runs = []
    for i in range(cfg.seeds):
        seed = cfg.seed + i
        run = results.get(f"baseline-seed{seed}", {"status": "failed", "reason": "was not run (a shard is missing)"})
        if run["status"] != "ok":
            raise LadderError(f"the fp32 baseline (seed {seed}) failed, so there is nothing to compare "
                              f"against: {run['reason']}")
        runs.append(run)
    reference = runs[0]
    vals = [r["final_val"] for r in runs]
    spread = max(vals) - min(vals)  # the largest |difference| between any two baseline runs
    rows, applied = [], []
    for name in cfg.rungs:
        rung = RUNGS_BY_NAME[name]
        row = {"name": name, "summary": rung.summary, "kind": rung.kind}
        if name in skipped:
            rows.append({**row, "status": "skipped", "reason": skipped[name]})
            continue
        applied.append(name)
        setup = setup_for(applied)
        missing = {"status": "failed", "reason": "was not run (a shard is missing)"}
        result = reference if setup == Setup() else results.get(name, missing)
        rows.append({**row, "applied": list(applied), "setup": setup.to_dict(), **result})
    judge(rows, reference, spread, cfg)
    allowed = allowed_gap(reference["final_val"], spread, cfg.tolerance, cfg.floor)
    rule = {"text": rule_text(cfg), "spread": spread, "floor": cfg.floor, "tolerance": cfg.tolerance,
            "baseline_val": reference["final_val"], "allowed_abs": allowed,
            "allowed_rel": allowed / reference["final_val"]}
    passed = all(r.get("verdict") == "PASS" for r in rows if r["status"] != "skipped")
    return {"command": "parity", "config": dataclasses.asdict(cfg), "schedule": _schedule(cfg),
            "model": preset(cfg.preset).to_dict(), "rule": rule, "baseline_runs": runs, "rungs": rows,
            "passed": passed}


def judge(rows: list[dict], reference: dict, spread: float, cfg: ParityConfig) -> None:
    """Add the gaps to the reference and the verdict to every row that trained."""
    base_val, base_train = reference["final_val"], reference["final_train"]
    for row in rows:
        if row["status"] != "ok":
            continue
        row["train_diff"] = row["final_train"] - base_train
        row["train_rel"] = row["train_diff"] / base_train
        row["val_diff"] = row["final_val"] - base_val
        row["val_rel"] = row["val_diff"] / base_val
        row["first_loss_diff"] = row["first_loss"] - reference["first_loss"]
        ok = verdict(row["final_val"], base_val, spread, cfg.tolerance, cfg.floor)
        row["verdict"] = "PASS" if ok else "FAIL"


def _context(cfg: ParityConfig, device: torch.device, progress: bool) -> tuple[_Context, data_mod.TokenData]:
    tokens = data_mod.load_tokens(Path(cfg.data) if cfg.data else None)  # DataUnavailable is the error
    evals = [data_mod.to_device(x, y, device)
             for x, y in data_mod.eval_batches(tokens.val, cfg.batch_size, cfg.seq_len, cfg.eval_batches)]
    return _Context(cfg, preset(cfg.preset), tokens, evals, device, progress), tokens


def run_parity(cfg: ParityConfig, device: torch.device, progress: bool = True,
               shard: tuple[int, int] = (0, 1)) -> dict:
    """Train the baseline seeds and every rung (or shard k of n of those runs); the record.

    With n > 1 the record holds this shard's raw results only; `merge_shards` makes the report.
    """
    from gpt2ladder.hardware import detect
    from gpt2ladder.report import record_header

    caps = detect(device)
    ctx, tokens = _context(cfg, device, progress)
    units, skipped = work_units(cfg, caps)
    k, n = shard
    results = run_units(ctx, units[k::n])
    header = {**record_header(caps, device),
              "data": {"source": tokens.source, "sha256": tokens.sha256, "n_tokens": tokens.n_tokens}}
    if n > 1:
        return {**header, "command": "parity-shard", "shard": [k, n], "config": dataclasses.asdict(cfg),
                "skipped": skipped, "results": results}
    return {**header, **assemble(cfg, results, skipped)}


def merge_shards(shards: list[dict]) -> dict:
    """One report from parity shard records (shards may come from several GPUs and commands).

    The shards must share every setting but the rung path, and each path must be the start of the
    longest one: a rung's run then trains the same setup whichever command ran it, so a later command
    can add rungs to an earlier one's runs (its fp32 baselines, for one) instead of repeating them.
    """
    def settings(s: dict) -> str:
        return json.dumps({k: v for k, v in s["config"].items() if k != "rungs"}, sort_keys=True)

    if len({settings(s) for s in shards}) != 1:
        raise UsageError("the parity shards were run with different settings; merge shards of one configuration")
    paths = [list(s["config"]["rungs"]) for s in shards]
    longest = max(paths, key=len)
    if any(p != longest[:len(p)] for p in paths):
        raise UsageError("the parity shards follow different rung paths; each must be the start of the longest")
    results: dict[str, dict] = {}
    for s in shards:
        for uid, r in s["results"].items():
            if uid in results:
                raise UsageError(f"the parity run {uid!r} is in more than one shard; merge one of them")
            results[uid] = r
    cfg = ParityConfig(**{**{k: tuple(v) if isinstance(v, list) else v for k, v in shards[0]["config"].items()},
                          "rungs": tuple(longest)})
    skipped = {k: v for s in shards for k, v in s["skipped"].items()}
    missing = [uid for uid in _unit_ids(cfg, skipped) if uid not in results]
    if missing:
        raise UsageError(f"parity runs missing from the shards: {', '.join(missing)}; run the shards that hold them")
    header = {k: v for k, v in shards[0].items() if k not in ("command", "shard", "config", "skipped", "results")}
    header["devices"] = sorted({s["device"]["name"] for s in shards})
    header["shards"] = [{"shard": s["shard"], "git_sha": s.get("git_sha"), "rungs": list(s["config"]["rungs"]),
                         "runs": sorted(s["results"])} for s in shards]
    return {**header, **assemble(cfg, results, skipped)}


def _unit_ids(cfg: ParityConfig, skipped: dict[str, str]) -> list[str]:
    """The ids of the runs a report on `cfg` needs (what `work_units` makes), given the skipped rungs."""
    ids = [f"baseline-seed{cfg.seed + i}" for i in range(cfg.seeds)]
    applied = []
    for name in cfg.rungs:
        if name in skipped:
            continue
        applied.append(name)
        if setup_for(applied) != Setup():
            ids.append(name)
    return ids


def _schedule(cfg: ParityConfig) -> dict:
    return {"optimizer": dataclasses.asdict(OptimConfig(lr=cfg.lr, grad_clip=GRAD_CLIP)),
            "warmup_steps": cfg.n_warmup, "decay": f"cosine to {MIN_LR_FRACTION:g} x lr at the last step",
            "eval_every": cfg.eval_interval, "eval_batches": cfg.eval_batches,
            "final_train_loss": "mean of the last 10% of steps"}


# --- output -----------------------------------------------------------------------------------------

HEADERS = ["rung", "train loss", "Δ train", "val loss", "Δ val", "Δ val %", "step-0 Δ", "verdict"]


def table_rows(record: dict) -> list[list[str]]:
    """The rows the terminal and Markdown share; a skipped or failed rung is its status and reason."""
    from gpt2ladder.report import rung_rows

    return rung_rows(record["rungs"], lambda r: [
        r["name"], f"{r['final_train']:.4f}", f"{r['train_diff']:+.4f}", f"{r['final_val']:.4f}",
        f"{r['val_diff']:+.4f}", f"{100 * r['val_rel']:+.2f}", f"{r['first_loss_diff']:+.1e}", r["verdict"]])


def _summary_lines(record: dict) -> list[str]:
    rule = record["rule"]
    seeds = ", ".join(f"seed {r['seed']}: {r['final_val']:.4f}" for r in record["baseline_runs"])
    return [f"fp32 baseline final val loss ({seeds}); spread {rule['spread']:.4f}",
            f"allowed gap: {rule['allowed_abs']:.4f} ({100 * rule['allowed_rel']:.2f}% of the baseline's val loss)",
            f"rule: {rule['text']}"]


def format_table(record: dict) -> str:
    from gpt2ladder.report import text_table

    verdict_line = "all rungs PASS" if record["passed"] else "NOT every rung passes"
    return "\n".join([text_table(HEADERS, table_rows(record)), ""] + _summary_lines(record) + [verdict_line])


def format_markdown(record: dict) -> str:
    cfg, dev = record["config"], record["device"]
    head = [f"# gpt2ladder parity: {cfg['preset']} on {dev['name']}", "",
            f"- {cfg['steps']} steps per run, batch {cfg['batch_size']} x {cfg['seq_len']}, lr {cfg['lr']:g} "
            f"(warm-up {record['schedule']['warmup_steps']}, {record['schedule']['decay']}); "
            f"data: {record['data']['source']}",
            f"- torch {record['versions']['torch']}, CUDA {record['versions']['cuda']}; "
            f"gpt2ladder {record['gpt2ladder']} at {record['git_sha']}; {record['date']}"]
    head += [f"- {line}" for line in _summary_lines(record)]
    for shard in record.get("shards", []):  # a merged report: which command ran which training runs
        k, n = shard["shard"]
        head.append(f"- shard {k} of {n} (rungs {', '.join(shard['rungs'])}) at {shard['git_sha']}: "
                    f"{', '.join(shard['runs'])}")
    from gpt2ladder.report import markdown_table

    return "\n".join(head + [""] + markdown_table(HEADERS, table_rows(record))) + "\n"


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average (shorter at the start), so curves show trends rather than batches."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot_parity(record: dict, path: Path) -> Path:
    """Left: smoothed train loss of every rung and baseline seed. Right: each rung's final val loss
    against the band the rule allows around the baseline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_v) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    _plot_train(ax_t, record)
    _plot_final_val(ax_v, record)
    fig.suptitle(f"parity: {record['config']['preset']}, {record['config']['steps']} steps on "
                 f"{record['device']['name']}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def _plot_train(ax, record: dict) -> None:
    window = max(1, record["config"]["steps"] // 20)
    runs = [(f"fp32 seed {r['seed']}", r, dict(color="#888888", linestyle="--", linewidth=1.0))
            for r in record["baseline_runs"][1:]]
    runs += [(r["name"], r, dict(linewidth=1.2)) for r in record["rungs"] if r["status"] == "ok"]
    tails = []
    for label, run, style in runs:
        curve = smooth(run["train_loss"], window)
        ax.plot(range(1, len(curve) + 1), curve, label=label, **style)
        tails += [v for v in curve[len(curve) // 10:] if math.isfinite(v)]
    if tails:  # zoom past the first tenth, where every run falls from ln(vocab) alike
        pad = 0.05 * (max(tails) - min(tails)) or 0.01
        ax.set_ylim(min(tails) - pad, max(tails) + pad)
    ax.set_title(f"train loss (moving average of {window} steps)", fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend(frameon=False, fontsize=7, ncol=2)
    ax.spines[["top", "right"]].set_visible(False)


def _plot_final_val(ax, record: dict) -> None:
    rule, ref = record["rule"], record["baseline_runs"][0]
    base, allowed = ref["final_val"], rule["allowed_abs"]
    rows = [r for r in record["rungs"] if r["status"] == "ok"]
    ax.axvspan(base - allowed, base + allowed, color="#55A868", alpha=0.15, label="allowed gap")
    ax.axvline(base, color="#333333", linewidth=1.0, label=f"fp32 seed {ref['seed']}")
    for run in record["baseline_runs"][1:]:
        ax.axvline(run["final_val"], color="#888888", linestyle="--", linewidth=1.0, label=f"fp32 seed {run['seed']}")
    for i, r in enumerate(rows):
        ax.plot(r["final_val"], i, "o", color="#4C72B0" if r["verdict"] == "PASS" else "#C44E52")
    ax.set_yticks(range(len(rows)), [f"{r['name']} ({r['verdict']})" for r in rows])
    ax.invert_yaxis()
    xs = [v for v in [r["final_val"] for r in rows + record["baseline_runs"]] if math.isfinite(v)]
    lo, hi = min(xs + [base - allowed]), max(xs + [base + allowed])
    ax.set_xlim(lo - 0.15 * (hi - lo), hi + 0.15 * (hi - lo))
    ax.set_title(f"final validation loss; allowed gap {allowed:.4f}", fontsize=10)
    ax.set_xlabel("loss")
    ax.legend(frameon=False, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3)
    ax.spines[["top", "right"]].set_visible(False)


def write_outputs(record: dict, out: Path) -> list[Path]:
    from gpt2ladder.report import write_record

    return write_record(out, "parity", record, format_markdown, plot_parity)


# --- command ----------------------------------------------------------------------------------------


def defaults_for(device: torch.device) -> dict:
    """GPU: GPT-2 124M at B=16, T=1024 for 300 steps. CPU: the tiny preset, a few minutes in all."""
    if device.type == "cuda":
        return {"preset": "gpt2", "batch_size": 16, "seq_len": None, "steps": 300}
    return {"preset": "tiny", "batch_size": 4, "seq_len": 64, "steps": 60}


def config_from_args(args, device: torch.device, caps) -> ParityConfig:
    from gpt2ladder.bench import resolve_rungs

    d = defaults_for(device)
    name = args.preset or d["preset"]
    return ParityConfig(
        preset=name, rungs=tuple(resolve_rungs(args.rungs, caps)), batch_size=args.batch_size or d["batch_size"],
        seq_len=args.seq_len or d["seq_len"] or preset(name).block_size, steps=args.steps or d["steps"],
        seeds=args.seeds, tolerance=args.tolerance, lr=args.lr, eval_every=args.eval_every,
        eval_batches=args.eval_batches, seed=args.seed, data=args.data,
    )


def parity_command(args) -> int:
    """Exit 0 when every rung that ran passes, 1 when one fails or breaks (skipped rungs do not count)."""
    from gpt2ladder.hardware import detect, resolve_device
    from gpt2ladder.report import prepare_out_dir, write_json

    if args.merge:
        return _merge_command(args)
    device = resolve_device(args.device)
    caps = detect(device)
    cfg = config_from_args(args, device, caps)
    shard = parse_shard(args.shard)
    out = prepare_out_dir(args.out)
    print(f"gpt2ladder parity: {cfg.preset} on {caps.name}, batch {cfg.batch_size} x {cfg.seq_len}, "
          f"{cfg.steps} steps per run, {cfg.seeds} baseline seeds, rungs: {', '.join(cfg.rungs)}"
          + (f", shard {shard[0]} of {shard[1]}" if shard[1] > 1 else ""), flush=True)
    record = run_parity(cfg, device, progress=not args.no_progress, shard=shard)
    if shard[1] > 1:
        path = out / f"parity-shard-{shard[0]}-of-{shard[1]}.json"
        write_json(path, record)
        print(f"wrote {path}; make the report with: gpt2ladder parity --merge DIR ... --out DIR")
        return 0
    return _finish(record, out)


def _finish(record: dict, out: Path) -> int:
    paths = write_outputs(record, out)
    print(format_table(record))
    print(f"wrote {', '.join(str(p) for p in paths)}")
    return 0 if record["passed"] else 1


def parse_shard(text: str | None) -> tuple[int, int]:
    """`K/N`: run every N-th training run starting at K (0-based); None: all of them."""
    if not text:
        return (0, 1)
    try:
        k, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise UsageError(f"--shard takes K/N, e.g. 0/3, got {text!r}") from None
    if not (n >= 1 and 0 <= k < n):
        raise UsageError(f"--shard {text}: need 0 <= K < N")
    return (k, n)


def _merge_command(args) -> int:
    from gpt2ladder.report import prepare_out_dir

    files = [f for d in args.merge for f in sorted(Path(d).glob("parity-shard-*.json"))] if all(
        Path(d).is_dir() for d in args.merge) else [Path(d) for d in args.merge]
    if not files or not all(f.is_file() for f in files):
        raise UsageError(f"no parity shard files (parity-shard-K-of-N.json) in {', '.join(args.merge)}")
    try:
        shards = [json.loads(f.read_text()) for f in files]
    except (OSError, ValueError) as err:
        raise UsageError(f"cannot read a parity shard: {err}") from None
    for f, shard in zip(files, shards):
        if not isinstance(shard, dict) or shard.get("command") != "parity-shard" or not {
                "shard", "config", "skipped", "results", "device"} <= shard.keys():
            raise UsageError(f"{f} is not a parity shard record (one written by `parity --shard K/N`)")
    return _finish(merge_shards(shards), prepare_out_dir(args.out))
