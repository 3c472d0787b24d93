"""The parity record (parity.json) as a terminal table, Markdown (parity.md) and a picture (parity.png):
smoothed train losses of every run, and each rung's final validation loss against the allowed band."""

from __future__ import annotations

import math
from pathlib import Path

from gpt2ladder.model.recipe import recipe_label
from gpt2ladder.report.plots import pyplot, save_figure
from gpt2ladder.report.records import write_record
from gpt2ladder.report.tables import markdown_table, rung_rows, signed, text_table

HEADERS = ["rung", "train loss", "Δ train", "val loss", "Δ val", "Δ val %", "step-0 Δ", "verdict"]


def table_rows(record: dict) -> list[list[str]]:
    """The rows the terminal and Markdown share; a skipped or failed rung is its status and reason."""
    return rung_rows(record["rungs"], lambda r: [
        r["name"], f"{r['final_train']:.4f}", signed(r["train_diff"], 4), f"{r['final_val']:.4f}",
        signed(r["val_diff"], 4), signed(100 * r["val_rel"], 2), f"{r['first_loss_diff']:+.1e}", r["verdict"]])


def _summary_lines(record: dict) -> list[str]:
    rule = record["rule"]
    seeds = ", ".join(f"seed {r['seed']}: {r['final_val']:.4f}" for r in record["baseline_runs"])
    return [f"fp32 baseline final val loss ({seeds}); spread {rule['spread']:.4f}",
            f"allowed gap: {rule['allowed_abs']:.4f} ({100 * rule['allowed_rel']:.2f}% of the baseline's val loss)",
            f"rule: {rule['text']}"]


def verdict_line(record: dict) -> str:
    """One line: whether every rung that ran passed, and which were skipped and why: those the recipe leaves out by
    name, then how many this machine cannot run (a skipped rung is not judged, so a run that skipped them all has
    nothing to pass). A record without `skipped_by` (an older one) skipped them all on its machine."""
    skipped = [r for r in record["rungs"] if r["status"] == "skipped"]
    by_recipe = [r["name"] for r in skipped if r.get("skipped_by") == "recipe"]
    on_machine = len(skipped) - len(by_recipe)
    aside = f"; {len(by_recipe)} skipped by the recipe ({', '.join(by_recipe)})" if by_recipe else ""
    aside += f"; {on_machine} skipped on this machine" if on_machine else ""
    if len(skipped) == len(record["rungs"]):
        return f"no rung ran{aside}"
    return ("all rungs PASS" if record["passed"] else "NOT every rung passes") + aside


def format_table(record: dict) -> str:
    return "\n".join([text_table(HEADERS, table_rows(record), right=True), ""] + _summary_lines(record)
                     + [verdict_line(record)])


def rates(record: dict) -> str:
    """The peak learning rates the runs trained at, which the schedule scales alike: --lr alone under AdamW; under
    Muon, AdamW's (embeddings, head, biases and gains) with Muon's for the Blocks' matrices beside it."""
    lr, optimizer = record["config"]["lr"], record["schedule"].get("optimizer") or {}
    if optimizer.get("name") != "muon":
        return f"lr {lr:g}"
    return f"AdamW lr {lr:g} and Muon lr {optimizer['muon_lr']:g} for the Blocks' matrices"


def format_markdown(record: dict) -> str:
    cfg, dev = record["config"], record["device"]
    head = [f"# gpt2ladder parity: {cfg['preset']} on {dev['name']}, recipe {recipe_label(cfg.get('recipe'))}", "",
            f"- {cfg['steps']} step{'s' if cfg['steps'] != 1 else ''} per run, batch {cfg['batch_size']} x "
            f"{cfg['seq_len']}, {rates(record)} (warm-up {record['schedule']['warmup_steps']}, "
            f"{record['schedule']['decay']}); data: {record['data']['source']}",
            f"- torch {record['versions']['torch']}, CUDA {record['versions']['cuda']}; "
            f"gpt2ladder {record['gpt2ladder']} at {record['git_sha']}; {record['date']}"]
    head += [f"- {line}" for line in _summary_lines(record)]
    for shard in record.get("shards", []):  # a merged report: which command ran which training runs
        k, n = shard["shard"]
        head.append(f"- shard {k} of {n} (rungs {', '.join(shard['rungs'])}) at {shard['git_sha']}: "
                    f"{', '.join(shard['runs'])}")
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
    """parity.png: `parity_figure` saved."""
    return save_figure(parity_figure(record), path)


def parity_figure(record: dict):
    """Left: the smoothed train loss of every run, from its first step. Middle: each run's train loss minus
    the fp32 baseline's (the same weights and batches), where a rung that trains as the baseline is a line
    on zero. Right: each rung's final val loss against the band the rule allows around the baseline.

    Identical curves are drawn widest first, so each one shows as a stripe of its own colour, and the
    legend names the runs identical to the baseline.
    """
    plt = pyplot()
    fig, (ax_t, ax_d, ax_v) = plt.subplots(1, 3, figsize=(17, 4.8), gridspec_kw={"width_ratios": [3, 3, 2]})
    runs = _train_runs(record)
    window = max(1, record["config"]["steps"] // 20)
    _plot_train(ax_t, runs, window)
    _plot_difference(ax_d, runs, record["baseline_runs"][0]["train_loss"], window)
    _plot_final_val(ax_v, record)
    fig.suptitle(f"parity: {record['config']['preset']}, {record['config']['steps']} steps on "
                 f"{record['device']['name']}" + _averaged(window), fontsize=11)
    fig.tight_layout()
    return fig


def _train_runs(record: dict) -> list[tuple[str, list[float], dict]]:
    """(label, train losses, line style) of the other baseline seeds and every rung that ran, in the
    order they are drawn: widest first. A label says how far the run is from the fp32 baseline."""
    base = record["baseline_runs"][0]["train_loss"]
    runs = [(f"fp32 seed {r['seed']}", r["train_loss"], dict(color="#888888", linestyle="--", linewidth=1.0))
            for r in record["baseline_runs"][1:]]
    rungs = [r for r in record["rungs"] if r["status"] == "ok"]
    for k, r in enumerate(rungs):
        width = 1.2 + 3.3 * (len(rungs) - 1 - k) / max(1, len(rungs) - 1)
        runs.append((r["name"], r["train_loss"], dict(color=f"C{k % 10}", linewidth=width, solid_capstyle="butt")))
    return [(f"{label} ({_distance(losses, base)})", losses, style) for label, losses, style in runs]


def _distance(losses: list[float], base: list[float]) -> str:
    """How far a run's train losses are from the baseline's, step for step: identical, the largest gap, or
    not finite."""
    gaps = [abs(a - b) for a, b in zip(losses, base)]
    if not all(math.isfinite(g) for g in gaps):
        return "not finite"
    return "identical" if max(gaps, default=0.0) == 0 else f"max |Δ| {max(gaps):.1g}"


def _averaged(window: int) -> str:
    return f"; train losses as moving averages of {window} steps" if window > 1 else ""


def _plot_train(ax, runs, window: int) -> None:
    """Every run from its first step; no zoom past the first fall: the middle panel shows the detail."""
    for label, losses, style in runs:
        curve = smooth(losses, window)
        ax.plot(range(1, len(curve) + 1), curve, label=label, **style)
    ax.set_title("train loss", fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend(frameon=False, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    ax.spines[["top", "right"]].set_visible(False)


def _plot_difference(ax, runs, base: list[float], window: int) -> None:
    ax.axhline(0.0, color="#333333", linewidth=0.8)  # the fp32 baseline itself
    for label, losses, style in runs:
        curve = smooth([a - b for a, b in zip(losses, base)], window)
        ax.plot(range(1, len(curve) + 1), curve, **style)
    ax.set_title("train loss minus the fp32 baseline's (seed 0)", fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel("loss difference")
    ax.spines[["top", "right"]].set_visible(False)


def _plot_final_val(ax, record: dict) -> None:
    """A run whose loss is not finite (a diverged --lr) has no point and no band; the limits come from the
    finite values only, so matplotlib is never asked for NaN or infinite limits."""
    rule, ref = record["rule"], record["baseline_runs"][0]
    base, allowed = ref["final_val"], rule["allowed_abs"]
    rows = [r for r in record["rungs"] if r["status"] == "ok"]
    band = [base - allowed, base + allowed] if math.isfinite(base) and math.isfinite(allowed) else []
    if band:
        ax.axvspan(*band, color="#55A868", alpha=0.15, label="allowed gap")
    for k, run in enumerate(record["baseline_runs"]):
        if math.isfinite(run["final_val"]):
            ax.axvline(run["final_val"], color="#333333" if k == 0 else "#888888", linestyle="-" if k == 0 else "--",
                       linewidth=1.0, label=f"fp32 seed {run['seed']}")
    for i, r in enumerate(rows):
        if math.isfinite(r["final_val"]):
            ax.plot(r["final_val"], i, "o", color="#4C72B0" if r["verdict"] == "PASS" else "#C44E52")
    ax.set_yticks(range(len(rows)), [f"{r['name']} ({r['verdict']})" for r in rows])
    ax.invert_yaxis()
    xs = [v for v in [r["final_val"] for r in rows + record["baseline_runs"]] if math.isfinite(v)] + band
    if xs:
        lo, hi = min(xs), max(xs)
        pad = 0.15 * (hi - lo) or 0.01
        ax.set_xlim(lo - pad, hi + pad)
    ax.set_title(f"final validation loss; allowed gap {allowed:.4f}", fontsize=10)
    ax.set_xlabel("loss")
    if ax.get_legend_handles_labels()[0]:  # none when every run diverged; matplotlib would warn on stderr
        ax.legend(frameon=False, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3)
    ax.spines[["top", "right"]].set_visible(False)


def write_outputs(record: dict, out: Path) -> list[Path]:
    return write_record(out, "parity", record, format_markdown, plot_parity)
