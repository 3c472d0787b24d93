"""The race record (race.json) as a line per rung while it runs, a terminal table, Markdown (race.md) and a chart
(race.png: the time to the target per rung, and every rung's validation loss against its training seconds)."""

from __future__ import annotations

import re
from pathlib import Path

from gpt2ladder.defaults import NEAR_SPLIT
from gpt2ladder.model.recipe import PARTS_BY_NAME
from gpt2ladder.report.notices import first_step_work
from gpt2ladder.report.plots import pyplot, save_figure
from gpt2ladder.report.tables import fmt, markdown_table, text_table

HEADERS = ["rung", "train s to target (range)", "vs rung before", "wall s", "tokens", "steps", "ms/step", "MFU %",
           "compile s", "validation s"]


def compiled(record: dict) -> bool:
    """Whether any rung's step compiled (else its first step, left out of the time, is a plain warm-up: a CPU)."""
    return any("compile" in r.get("step_rungs", ()) for r in record["rungs"])


def headers(record: dict) -> list[str]:
    """HEADERS, with "warm-up s" for "compile s" where no rung compiled."""
    return HEADERS if compiled(record) else [("warm-up s" if h == "compile s" else h) for h in HEADERS]


def not_reached(row: dict) -> str:
    seeds = "" if row["seeds_run"] <= 1 else f" ({row['seeds_reached']} of {row['seeds_run']} seeds reached it)"
    return f"not reached in {row['planned_tokens']:,} tokens{seeds}"


def time_text(row: dict) -> str:
    """'12.3 (11.8-13.0)': the median and range of the training seconds; one seed: the value alone."""
    t = row["train_seconds"]
    if t["min"] == t["max"]:
        return f"{t['median']:.1f}"
    return f"{t['median']:.1f} ({t['min']:.1f}-{t['max']:.1f})"


def vs_prev(row: dict, before: dict | None = None) -> str:
    """The gain over the row it is read against, naming that row where it is not `before`, the row above it, and
    its seeds that reached the target at an earlier validation (`seeds_text`)."""
    if row.get("gain_vs_prev") is None:
        return "-"
    against = row.get("gain_vs")
    named = "" if against is None or before is None or against == before["name"] else f" vs {against}"
    if row["within_noise_of_prev"]:
        return "within noise" + seeds_text(row) + named
    return (f"{row['gain_vs_prev']:.2f}x"
            + (", under one validation" if row.get("within_one_validation_of_prev") else "")
            + seeds_text(row) + named)


def seeds_text(row: dict) -> str:
    """', earlier validation in 3/3 seeds': in how many of the seeds both rows ran this one reached the target at an
    earlier validation (two or more seeds)."""
    seeds = row.get("seeds_earlier")
    return f", earlier validation in {seeds['earlier']}/{seeds['of']} seeds" if seeds and seeds["of"] > 1 else ""


def _gain_against(row: dict) -> str:
    """'1.06x against speedrun, under one validation': the gain, the rung it is read against, then the noise rule
    and the seeds that reached the target at an earlier validation."""
    base = row.get("gain_vs") or "the rung before"
    if row["within_noise_of_prev"]:
        return f"within noise of {base}{seeds_text(row)}"
    rule = ", under one validation" if row.get("within_one_validation_of_prev") else ""
    return f"{row['gain_vs_prev']:.2f}x against {base}{rule}{seeds_text(row)}"


def _median(row: dict, key: str, spec: str) -> str:
    return fmt(row[key]["median"], spec)


def _count_median(row: dict, key: str) -> str:
    """A median of counts (steps, tokens): whole, or with its half where an even number of seeds gives one."""
    value = row[key]["median"]
    return _median(row, key, ",.0f" if value is None or float(value).is_integer() else ",.1f")


def rows(record: dict) -> list[list[str]]:
    """One table row per rung: its figures, or why it has none (not reached, failed, cut off)."""
    out, rungs = [], record["rungs"]
    for i, r in enumerate(rungs):
        if r["status"] != "ok":
            out.append([r["name"], f"{r['status']}: {r['reason'] or 'the race stopped before its seeds ran'}"])
        elif not r["reached"]:
            out.append([r["name"], not_reached(r)])
        else:
            out.append([r["name"], time_text(r), vs_prev(r, rungs[i - 1] if i else None),
                        _median(r, "wall_seconds", ".1f"),
                        _count_median(r, "tokens"), _count_median(r, "steps"), fmt(r["ms_per_step"], ".1f"),
                        fmt(r["mfu"] and 100 * r["mfu"], ".1f"), _median(r, "warmup_seconds", ".1f"),
                        _median(r, "validation_seconds", ".1f")])
    return out


def format_table(record: dict) -> str:
    return text_table(headers(record), rows(record))


def progress_line(row: dict, target: float) -> str:
    """What the race says when a rung's seeds are done."""
    if row["status"] != "ok":
        return f"race {row['name']}: {row['status']}: {row['reason'] or 'cut off'}"
    if not row["reached"]:
        return f"race {row['name']}: target {target:g} {not_reached(row)}"
    gain, seeds = vs_prev(row), row["seeds_run"]
    over = "" if seeds == 1 else f" (median and range of {seeds} seeds)"
    against = "" if gain == "-" else f", {_gain_against(row)}"
    return (f"race {row['name']}: target {target:g} reached in {time_text(row)} s of training{over}{against}, "
            f"{row['tokens']['median']:,.0f} tokens, {row['ms_per_step']:.1f} ms/step")


def run_line(rung: str, result: dict, target: float | None, step_rungs=("compile", "cuda_graph")) -> str:
    """What the race says when one run (a rung's seed) is done (target None: still to be set by this run's rung): the
    validation loss it measured at the target's step, and the seconds left out of its time (its first step's: a
    compile and capture as its step rungs have them, else a warm-up)."""
    head = f"  {rung} seed {result['seed']}: "
    if result["status"] != "ok":
        return head + f"{result['status']}: {result['reason']}"
    if target is None:
        last = result["curve"][-1]["val_loss"] if result["curve"] else float("nan")
        return head + f"val loss {last:.4f} after all {result['steps_run']} steps ({result['planned_tokens']:,} tokens)"
    if not result["reached"]:
        return head + f"not reached in {result['steps_run']} steps ({result['planned_tokens']:,} tokens)"
    hit = next((p["val_loss"] for p in result["curve"] if p["step"] == result["steps"]), None)
    measured = "" if hit is None else f"val loss {hit:.4f} "
    first = first_step_work("compile" in step_rungs, "cuda_graph" in step_rungs) or "warm-up step"
    return (head + f"{measured}(target {target:g}) at step {result['steps']} in "
            f"{result['train_seconds']:.1f} s of training ({result['warmup_seconds']:.1f} s {first}, "
            f"{result['validation_seconds']:.1f} s validation apart; {result['wall_seconds']:.1f} s wall)")


def target_text(record: dict) -> str:
    """The target as the record says it; a race cut off inside the gpt2 rung that sets it has none yet."""
    target = record["target_val_loss"]
    return "gpt2's (not set: its rung did not finish)" if target is None else f"{target:g}"


def cards_text(record: dict) -> str:
    """The card the race's runs trained on; 'X and Y (mixed cards)' where they trained on more than one (a record
    written before runs named their card: the header's)."""
    cards = record.get("cards") or [record["device"]["name"]]
    return cards[0] if len(cards) == 1 else f"{' and '.join(cards)} (mixed cards)"


def mixed_cards_line(record: dict) -> list[str]:
    """The line race.md adds where the runs trained on more than one card: which rung's seeds ran where."""
    if len(record.get("cards") or []) < 2:
        return []
    where = "; ".join(f"{row['name']} on {', '.join(row['cards'])}" for row in record["rungs"] if row.get("cards"))
    return [f"- mixed cards: {where}. Seconds from two cards are not one race's: compare the tokens and steps, or run "
            "the race again on one card"]


def reused_line(record: dict) -> list[str]:
    """The line race.md adds where runs were copied from another race (--reuse), not trained in this one."""
    reused = [f"{row['name']} seed {run['seed']} from {run['reused_from']}" for row in record["rungs"]
              for run in row.get("runs") or [] if run.get("reused_from")]
    return [f"- reused runs, trained by another race with the same settings: {'; '.join(reused)}"] if reused else []


def planned_apart(record: dict) -> str:
    """What the rungs that plan their runs otherwise than the race do: steps of their own (`speedrun@steps=1000`),
    batches of their own (`speedrun@tokens_per_step=8192`); empty where none does."""
    s = record["config"]["settings"]
    rows = record["rungs"]
    steps = any(row["planned_tokens"] != s["steps"] * row.get("tokens_per_step", s["tokens_per_step"]) for row in rows)
    batch = any(row.get("tokens_per_step", s["tokens_per_step"]) != s["tokens_per_step"] for row in rows)
    return (", but" * (steps or batch) + " a rung with @steps=N, planned for N" * steps + "," * (steps and batch)
            + " a rung with @tokens_per_step=N, steps of N tokens, validated after the same tokens" * batch)


def format_markdown(record: dict) -> str:
    cfg, s = record["config"], record["config"]["settings"]
    source = "" if record["target_source"] == "given" else f" ({record['target_source']})"
    head = [
        f"# gpt2ladder race: model {s['preset']} on {cards_text(record)}, to validation loss {target_text(record)}",
        "",
        f"- target: validation loss {target_text(record)}{source}, on {record['data']['source']}",
        f"- every run planned for {s['steps']:,} steps of {s['tokens_per_step']:,} tokens "
        f"({s['steps'] * s['tokens_per_step']:,} tokens)" + planned_apart(record)
        + f", validated every {s['eval_every']} steps"
        + (f" (every {max(1, s['eval_every'] // NEAR_SPLIT)} within {s['eval_near']:g} nats of the target)"
           if s.get("eval_near") else "") + "; "
        + (f"seeds 0 to {cfg['seeds'] - 1} per rung" if cfg["seeds"] > 1 else "one seed (0) per rung"),
        "- the time: training seconds of the timed steps up to the first validation at or below the target, in a "
        "run planned for the steps above; " + ("compile and capture (the first step)" if compiled(record) else
                                                "the first step (a warm-up)")
        + ", validation and checkpoints apart",
        "- median and range (lowest-highest) over the seeds; 'within noise': the seeds' ranges of this rung and "
        "the rung it is read against overlap (the rung before; for a rung written with + or -, the longest start of "
        "its name raced before it, else the rung before; for a rung with @ settings, the rung before its @); "
        "'under one validation': their medians lie nearer than one validation interval takes (the steps before the "
        "validation a rung's time was read at, at its step; the longer of the two), finer than the reading can "
        "tell; 'earlier validation in k/n seeds': in k of the n seeds both rungs reached the target in, this "
        "rung's run reached it at an earlier validation (on fewer tokens) than the same seed's run of the rung it "
        "is read against (the noise rule does not read it; given for two seeds or more)",
        f"- torch {record['versions']['torch']}, CUDA {record['versions']['cuda']}; gpt2ladder "
        f"{record['gpt2ladder']} at {record['git_sha']}",
        f"- {record['date']}",
        *mixed_cards_line(record),
        *reused_line(record),
    ]
    if record.get("partial"):
        head.append("- partial: the race stopped before every rung had run; a row it did not finish says so")
    steps = ["", "| rung | recipe | step rungs | micro-batch |", "|---|---|---|---|"]
    steps += [f"| {r['name']} | {r['recipe']} | {', '.join(r['step_rungs'])} | {r['batch_size']} |"
              for r in record["rungs"]]
    return "\n".join(head + [""] + markdown_table(headers(record), rows(record)) + steps) + "\n"


def race_chart(record: dict, path: Path) -> Path:
    """race.png: `race_figure`, saved."""
    return save_figure(race_figure(record), path)


def race_figure(record: dict):
    """Bars of the training seconds to the target per rung (whiskers: the seeds' range), and every rung's
    validation loss against its training seconds (seed 0's curve) with the target as a line. The bars' panel
    widens with the rungs, so that each bar's labels (a gain, the rung it is read against, the noise rule) fit."""
    plt = pyplot()
    rungs = record["rungs"]
    widths = (max(5.0, 0.95 * len(rungs)), 5.5)  # inches: the bars' panel, the curves'
    fig, (bars, curves) = plt.subplots(1, 2, figsize=(sum(widths), 4.8), gridspec_kw={"width_ratios": widths})
    colours = plt.get_cmap("viridis")
    for i, r in enumerate(rungs):
        colour = colours(i / max(1, len(rungs) - 1))
        _bar(bars, i, r, colour, rungs[i - 1] if i else None)
        curve = (r["runs"][0].get("curve") or []) if r["runs"] else []
        if curve:  # a rung with no run that validated has no curve, and no entry in the legend
            curves.plot([p["train_seconds"] for p in curve], [p["val_loss"] for p in curve], color=colour,
                        label=r["name"], linewidth=1.4)
    # a rung of the race's order adds its part to the rungs before it ("+ rope"); speedrun and the rungs written
    # with + and - are recipes of their own, named as written
    bars.set_xticks(range(len(rungs)), [("+ " if r["name"] in PARTS_BY_NAME else "") + r["name"] for r in rungs],
                    rotation=30, ha="right")
    bars.set_ylim(0, bars.get_ylim()[1] * 1.25)  # room for the labels over the tallest bar
    bars.set_ylabel("training seconds to the target (median, range)")
    bars.set_title(f"time to validation loss {target_text(record)}", fontsize=10)
    if record["target_val_loss"] is not None:
        curves.axhline(record["target_val_loss"], color="#C44E52", linestyle="--", linewidth=1)
    curves.set_xlabel("training seconds (timed steps)")
    curves.set_ylabel("validation loss")
    curves.set_title(f"model {record['config']['settings']['preset']} on {record['data']['source']}, "
                     f"{cards_text(record)}", fontsize=10)
    if curves.get_legend_handles_labels()[0]:  # none where no run validated; matplotlib would warn on stderr
        curves.legend(frameon=False, fontsize=7)
    for ax in (bars, curves):
        ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig


def _bar(ax, i: int, row: dict, colour, before: dict | None) -> None:
    t = row["train_seconds"]
    if row["status"] != "ok" or not row["reached"]:
        ax.annotate("not reached" if row["status"] == "ok" else row["status"], (i, 0), ha="center", va="bottom",
                    rotation=90, fontsize=8, color="#8C8C8C")
        return
    ax.bar(i, t["median"], color=colour)
    ax.errorbar(i, t["median"], yerr=[[t["median"] - t["min"]], [t["max"] - t["median"]]], color="black",
                capsize=3, linewidth=1)
    gain = (vs_prev(row, before).replace(", ", "\n").replace(" vs ", "\nvs ")  # short lines, each narrower than a bar
            .replace("under one validation", "under one\nvalidation")
            .replace("earlier validation in ", "earlier in\n"))
    head, vs, against = gain.rpartition("\nvs ")
    if vs:  # a recipe read against, one line per part it adds, takes away or sets (speedrun / +unet_skips / @steps=)
        gain = head + vs + re.sub(r"(?<=.)(?<![0-9][eE])([+@-])", r"\n\1", against)  # not a number's exponent, 1e-3
    label = f"{t['median']:.1f}" + ("" if row.get("gain_vs_prev") is None else f"\n{gain}")
    ax.annotate(label, (i, t["max"]), ha="center", va="bottom", fontsize=7, xytext=(0, 2), textcoords="offset points")


# --- several budgets (race --steps A,B,...) ---------------------------------------------------------------------

def _budget_rungs(record: dict) -> list[str]:
    return list(dict.fromkeys(r["name"] for b in record["budgets"] for r in b["rungs"]))


def _budget_cell(budget: dict, name: str) -> str:
    """A rung's time at one budget: its median seconds and, after the first rung, its share of the first's."""
    row = next((r for r in budget["rungs"] if r["name"] == name), None)
    if row is None:
        return "not run"
    if row["status"] != "ok":
        return row["status"]
    if not row["reached"]:
        return "not reached"
    share = ""
    if row["share_of_first"] is not None and row is not budget["rungs"][0]:
        rule = (", within noise" if row.get("within_noise_of_first")
                else ", under one validation" if row.get("within_one_validation_of_first") else "")
        share = f" ({row['share_of_first']:.2f}{rule})"
    return f"{row['train_seconds']['median']:.1f}{share}"


def token_count(n: int) -> str:
    """'24.6M', '3.07B', '512K' or '640': a token count short enough for a header."""
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n}"


def _budget_headers(record: dict) -> list[str]:
    shortest = ["shortest budget to it"] if record.get("shortest") else []
    return (["rung"] + [f"{b['steps']:,} steps ({token_count(b['planned_tokens'])} tokens)" for b in record["budgets"]]
            + shortest)


def _shortest_cell(record: dict, name: str) -> list[str]:
    """The shortest planned budget whose every seed reached the one target of every budget, and its median seconds."""
    if not record.get("shortest"):
        return []
    row = next((r for r in record["shortest"] if r["name"] == name), None)
    if row is None or row["steps"] is None:
        return ["none of these"]
    return [f"{row['steps']:,} steps: {row['train_seconds']['median']:.1f} s"]


def _budget_rows(record: dict) -> list[list[str]]:
    targets = ["target"] + ["-" if b["target_val_loss"] is None else f"{b['target_val_loss']:.4f}"
                            for b in record["budgets"]] + [""] * bool(record.get("shortest"))
    return [targets] + [[name] + [_budget_cell(b, name) for b in record["budgets"]] + _shortest_cell(record, name)
                        for name in _budget_rungs(record)]


def format_budgets_table(record: dict) -> str:
    return text_table(_budget_headers(record), _budget_rows(record))


def format_budgets(record: dict) -> str:
    first = record["budgets"][0]["rungs"][0]["name"] if record["budgets"] and record["budgets"][0]["rungs"] else "-"
    cards = (list(dict.fromkeys(c for b in record["budgets"] for c in b.get("cards") or []))
             or [record["device"]["name"]])
    where = (cards[0] if len(cards) == 1
             else f"{' and '.join(cards)} (mixed cards: seconds from two cards are not one race's)")
    n = len(record["budgets"])
    head = [f"# gpt2ladder race at {n} budget{'s' * (n != 1)}, on {where}", "",
            "- each column is a race whose runs were all planned for that many steps (its schedule spanning them), "
            "to that budget's target; its race.md (steps-N/) has every figure, range and seed",
            f"- a cell: the median training seconds to the target and, in brackets, that median over {first}'s "
            f"at the same budget; 'within noise': the seeds' ranges of the rung and {first} overlap; 'under one "
            "validation': the medians lie nearer than one validation interval",
            f"- torch {record['versions']['torch']}; gpt2ladder {record['gpt2ladder']} at {record['git_sha']}; "
            f"{record['date']}"]
    own = list(dict.fromkeys(row["name"] for b in record["budgets"] for row in b["rungs"]
                             if row.get("tokens_per_step", b["tokens_per_step"]) != b["tokens_per_step"]))
    if own:  # a header's tokens are the race's batch; these rungs' steps hold another
        head.append(f"- {', '.join(own)}: each a rung whose steps are of a batch of its own (@tokens_per_step), its "
                    "runs planned for the column's steps of that batch, not for the column's tokens")
    if record.get("shortest"):
        head.append("- one target at every budget: the last column is a rung's shortest planned budget whose every "
                    "seed reached it, with the median training seconds there (the horizon read as the NanoGPT "
                    "speedrun reads it: a run planned to end at the target)")
    if record.get("partial"):
        head.append("- partial: the races stopped before every budget had run")
    return "\n".join(head + [""] + markdown_table(_budget_headers(record), _budget_rows(record))) + "\n"


def budgets_chart(record: dict, path: Path) -> Path:
    """budgets.png: per rung, the training seconds to its budget's target against the planned tokens (left), and
    after the first rung, that time's share of the first rung's (right, 1 = as long)."""
    plt = pyplot()
    names = _budget_rungs(record)
    fig, (seconds, shares) = plt.subplots(1, 2, figsize=(11, 4.6))
    colours = plt.get_cmap("viridis")
    planned = [b["planned_tokens"] for b in record["budgets"]]
    nan = float("nan")
    for i, name in enumerate(names):
        # a budget where the rung has no time is a gap in its line, not a line drawn across it
        rows = [next((r for r in b["rungs"] if r["name"] == name and r["reached"] and r["status"] == "ok"), None)
                for b in record["budgets"]]
        if not any(rows):
            continue
        colour = colours(i / max(1, len(names) - 1))
        t = [r["train_seconds"] if r else {"median": nan, "min": nan, "max": nan} for r in rows]
        seconds.plot(planned, [v["median"] for v in t], marker="o", color=colour, label=name)
        seconds.vlines(planned, [v["min"] for v in t], [v["max"] for v in t], color=colour, linewidth=1)
        share = [nan if r is None or r["share_of_first"] is None else r["share_of_first"] for r in rows]
        if i and any(v == v for v in share):
            shares.plot(planned, share, marker="o", color=colour, label=name)
    shares.axhline(1.0, color="#8C8C8C", linestyle="--", linewidth=1)
    shares.set_ylim(bottom=0)
    for ax, empty in ((seconds, "no rung reached its target"), (shares, "no rung after the first reached its target")):
        ax.set_xscale("log")
        ax.set_xticks(planned, [token_count(n) for n in planned])
        ax.minorticks_off()
        ax.set_xlabel("tokens the runs were planned for")
        ax.spines[["top", "right"]].set_visible(False)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(frameon=False, fontsize=7)
        else:
            ax.text(0.5, 0.5, empty, transform=ax.transAxes, ha="center", color="#8C8C8C")
    seconds.set_ylabel("training seconds to the budget's target (median, range)")
    shares.set_ylabel(f"share of {names[0] if names else 'the first rung'}'s time")
    seconds.set_title("time to each budget's target", fontsize=10)
    shares.set_title("below 1: faster than the first rung at that budget", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)
