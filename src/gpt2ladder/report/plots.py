"""Pictures of results: the ladder's bar chart (the write-up's figure, measured) and loss curves.

matplotlib with the Agg backend, so plots work on machines without a screen.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from gpt2ladder.data.files import atomic_file
from gpt2ladder.ladder import WRITEUP_RUNGS
from gpt2ladder.report.bench import spread_note  # the rule ladder.md's first line states too

KIND_COLOURS = {"baseline": "#8C8C8C", "precision": "#4C72B0", "memory": "#55A868", "overhead": "#DD8452",
                "best": "#8172B3"}
KIND_LABELS = {"baseline": "baseline", "precision": "precision", "memory": "memory traffic",
               "overhead": "launch / optimizer overhead", "best": "the rungs that pay, together"}
NOTE_COLOUR = "#C44E52"  # a warning about the measurement itself


def pyplot():
    """matplotlib.pyplot on the Agg backend (no screen needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> Path:
    """A chart's figure written as its PNG (grown to hold what lies outside its axes) and closed."""
    fig.savefig(path, dpi=130, bbox_inches="tight")
    pyplot().close(fig)
    return path


def ladder_labels(rungs: list[dict]) -> list[str]:
    """Rung k adds to rung k-1 ("+ name"); the `best` row of --rungs best is a combination, not a step up."""
    return [("+ " if i and r.get("kind") != "best" else "") + r["name"] for i, r in enumerate(rungs)]


def ladder_chart(record: dict, path: Path) -> Path:
    """ladder.png: `ladder_figure` saved."""
    return save_figure(ladder_figure(record), path)


def ladder_figure(record: dict):
    """Milliseconds per step per rung, coloured by kind, with the median on each bar and p10-p90 whiskers.

    The write-up's rungs and gpt2ladder's own are set apart by a dashed line; a rung within noise of
    the one before it (their p10-p90 overlap) says so under its value. The legend, and a note when the
    run was too noisy to rank the rungs, stand right of the bars, where no bar or label can be.
    """
    plt = pyplot()
    rungs = record["rungs"]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(rungs) + 2), 4.8))
    top = max([r["ms_p90"] for r in rungs if r["status"] == "ok"] + [1.0])
    dropped = {d["rung"] for d in (record.get("best") or {}).get("decisions", []) if not d["kept"]}
    for i, r in enumerate(rungs):
        _bar(ax, i, r, top, r["name"] in dropped and r.get("kind") != "best")
    labels = [label + (" (dropped)" if r["name"] in dropped else "") for label, r in zip(ladder_labels(rungs), rungs)]
    ax.set_xticks(range(len(rungs)), labels, rotation=30, ha="right")
    ax.set_ylabel("ms per training step (median, p10-p90)")
    ax.set_ylim(0, top * 1.25)  # room above the tallest whisker for its label and the section names
    _mark_writeup_rungs(ax, rungs, top)
    ax.set_title(ladder_title(record), fontsize=10)
    kinds = dict.fromkeys(_kind(r) for r in rungs if r["status"] == "ok")
    handles = [plt.Rectangle((0, 0), 1, 1, color=KIND_COLOURS[k]) for k in kinds]
    ax.legend(handles, [KIND_LABELS[k] for k in kinds], frameon=False, fontsize=8, loc="upper left",
              bbox_to_anchor=(1.01, 1.0))
    notes = [n for n in ((record.get("best") or {}).get("too_noisy"), spread_note(rungs)) if n]
    if notes:
        ax.annotate("\n\n".join(textwrap.fill(n, 34) for n in notes), xy=(1.02, 0.0), xycoords="axes fraction",
                    ha="left", va="bottom", fontsize=8, color=NOTE_COLOUR)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig


def ladder_bars_chart(record: dict, path: Path, width_px: int = 1000) -> Path:
    """A compact ladder.png for a page of text: `ladder_bars_figure` saved `width_px` wide."""
    plt = pyplot()
    fig = ladder_bars_figure(record, width_px / BARS_DPI)
    with atomic_file(path) as f:  # a new file renamed over path: never written through a link there
        fig.savefig(f, format="png", dpi=BARS_DPI)
    plt.close(fig)
    return path


BARS_DPI = 130


def ladder_bars_figure(record: dict, width_in: float = 1000 / BARS_DPI):
    """One horizontal bar per rung, top to bottom in ladder order: the median ms/step with its p10-p90
    whisker and value, coloured by kind, readable at a page's width however many rungs there are."""
    plt = pyplot()
    rungs = [r for r in record["rungs"] if r["status"] == "ok"]
    fig, ax = plt.subplots(figsize=(width_in, 0.9 + 0.24 * max(len(rungs), 1)))
    top = max([r["ms_p90"] for r in rungs] + [1.0])
    for i, r in enumerate(rungs):
        err = [[r["ms_per_step"] - r["ms_p10"]], [r["ms_p90"] - r["ms_per_step"]]]
        ax.barh(i, r["ms_per_step"], height=0.7, color=KIND_COLOURS[_kind(r)], xerr=err,
                error_kw={"elinewidth": 0.7, "ecolor": "#333333", "capsize": 1.5})
        ax.text(r["ms_p90"] + top * 0.01, i, f"{r['ms_per_step']:.1f}", va="center", fontsize=7)
    ax.set_yticks(range(len(rungs)), ladder_labels(rungs), fontsize=7)
    ax.invert_yaxis()  # the ladder reads downwards, from the baseline
    ax.set_xlim(0, top * 1.1)
    ax.set_xlabel("ms per training step (median, p10-p90)", fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    writeup = [i for i, r in enumerate(rungs) if r["name"] in WRITEUP_RUNGS]
    if writeup and max(writeup) + 1 < len(rungs):
        ax.axhline(max(writeup) + 0.5, color="#999999", linestyle="--", linewidth=0.8)
    ax.set_title(ladder_title(record), fontsize=8)
    kinds = dict.fromkeys(_kind(r) for r in rungs)
    handles = [plt.Rectangle((0, 0), 1, 1, color=KIND_COLOURS[k]) for k in kinds]
    ax.legend(handles, [KIND_LABELS[k] for k in kinds], frameon=False, fontsize=7, loc="upper left",
              bbox_to_anchor=(1.0, 1.0))  # beside the bars, where no bar or value can be
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig


def ladder_title(record: dict) -> str:
    """Preset, batch and device; and, when no text could be had, that the tokens were random."""
    cfg = record["config"]
    cap = record["device"].get("memory_cap_bytes")
    where = record["device"]["name"] + (f" capped at {cap / 2**30:.0f} GiB" if cap else "")
    on_random = (record.get("data") or {}).get("source") == "random"
    return (f"{cfg['preset']}, batch {cfg['batch_size']} x {cfg['seq_len']} on {where}"
            + ("\non random tokens: the text was not available" if on_random else ""))


def _bar(ax, i: int, r: dict, top: float, dropped: bool = False) -> None:
    """One rung's bar; one that --rungs best dropped is pale and hatched, and says so."""
    if r["status"] != "ok":
        ax.bar(i, top * 0.04, color="none", edgecolor="#999999", hatch="//")
        ax.text(i, top * 0.06, r["status"], ha="center", va="bottom", fontsize=8, color="#777777", rotation=90)
        return
    err = [[r["ms_per_step"] - r["ms_p10"]], [r["ms_p90"] - r["ms_per_step"]]]
    ax.bar(i, r["ms_per_step"], color=KIND_COLOURS[_kind(r)], yerr=err, capsize=3, alpha=0.35 if dropped else 1.0,
           hatch="//" if dropped else None, error_kw={"elinewidth": 0.8, "ecolor": "#333333"})
    label = (f"{r['ms_per_step']:.1f}" + ("\nwithin noise" if r.get("within_noise_of_prev") else "")
             + ("\ndropped" if dropped else ""))
    ax.text(i, r["ms_p90"] + top * 0.015, label, ha="center", va="bottom", fontsize=8, linespacing=0.9)


def _mark_writeup_rungs(ax, rungs: list[dict], top: float) -> None:
    """A dashed line after the write-up's rungs when gpt2ladder's own follow them."""
    writeup = [i for i, r in enumerate(rungs) if r["name"] in WRITEUP_RUNGS]
    own = [i for i, r in enumerate(rungs) if r["name"] not in WRITEUP_RUNGS]
    if not writeup or not own or max(writeup) > min(own):
        return
    x = max(writeup) + 0.5
    ax.axvline(x, color="#999999", linestyle="--", linewidth=0.8)
    ax.text(x - 0.1, top * 1.2, "the write-up's rungs", ha="right", va="top", fontsize=8, color="#555555")
    ax.text(x + 0.1, top * 1.2, "gpt2ladder's own", ha="left", va="top", fontsize=8, color="#555555")


def _kind(row: dict) -> str:
    """The colour of a bar: its rung's kind (the baseline rung, grey)."""
    return "baseline" if row["name"] == "baseline" else row["kind"]


def loss_curves(curves: dict[str, tuple[list[float], list[float]]], path: Path, title: str,
                ylabel: str = "loss", xlabel: str = "step", hline: tuple[float, str] | None = None) -> Path:
    """One line per named curve: {name: (xs, losses)}, x the step unless `xlabel` says otherwise; `hline`,
    (value, label), draws a level such as a target loss."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, (steps, losses) in curves.items():
        ax.plot(steps, losses, label=name, linewidth=1.2, marker="." if len(steps) < 40 else None)
    if hline is not None:
        ax.axhline(hline[0], color="#999999", linestyle="--", linewidth=0.8, label=hline[1])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(frameon=False, fontsize=8)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    with atomic_file(path) as f:  # a new file renamed over path: never written through a link there
        fig.savefig(f, format="png", dpi=130)
    plt.close(fig)
    return path
