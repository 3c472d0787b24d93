"""The profile record (profile.json) as a terminal table, Markdown (profile.md) and a picture
(profile.png): one stacked bar per rung, a segment per category of the step's time."""

from __future__ import annotations

from pathlib import Path

from gpt2ladder.model.recipe import recipe_label
from gpt2ladder.report.plots import pyplot, save_figure
from gpt2ladder.report.records import write_record
from gpt2ladder.report.tables import markdown_table, rung_rows, text_table

COLOURS = {"matmul": "#4C72B0", "attention": "#8172B3", "elementwise": "#55A868", "loss": "#C44E52",
           "optimizer": "#DD8452", "copies": "#937860", "other": "#8C8C8C", "idle": "#E5E5E5"}


def headers(record: dict) -> list[str]:
    """rung, ms/step, one column per category the record names (in its order), unprofiled."""
    return ["rung", "ms/step"] + list(record["categories"].values()) + ["unprofiled"]


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


UNPROFILED = ("'unprofiled' = median of the later warm-up steps after the first and after the last one that "
              "compiled, without the profiler; n/a: no warm-up step came after those, raise --warmup")


def _unprofiled(row: dict) -> str:
    value = row["unprofiled_ms_per_step"]
    return "n/a" if value is None else _ms(value)


def table_rows(record: dict) -> list[list[str]]:
    return rung_rows(record["rungs"], lambda r: [r["name"], _ms(r["ms_per_step"])]
                     + [_ms(r["categories_ms"][c]) for c in record["categories"]] + [_unprofiled(r)])


def format_table(record: dict) -> str:
    lines = [text_table(headers(record), table_rows(record), right=True)]
    lines.append(f"(ms per step by category; {_timed_by(record)}; {UNPROFILED})")
    return "\n".join(lines)


def _timed_by(record: dict) -> str:
    return next((r["timed_by"] for r in record["rungs"] if r["status"] == "ok"), "nothing ran")


def format_markdown(record: dict) -> str:
    cfg, dev = record["config"], record["device"]
    lines = [f"# gpt2ladder profile: {cfg['preset']} on {dev['name']}, recipe {recipe_label(cfg.get('recipe'))}", "",
             f"- batch {cfg['batch_size']} x {cfg['seq_len']}, {cfg['steps']} profiled "
             f"step{'s' if cfg['steps'] != 1 else ''} after {cfg['warmup']} warm-up; categories by "
             f"{_timed_by(record)}; idle = step time not covered",
             f"- {UNPROFILED}",
             f"- torch {record['versions']['torch']}, CUDA {record['versions']['cuda']}; "
             f"gpt2ladder {record['gpt2ladder']} at {record['git_sha']}; {record['date']}", "",
             "ms per step:", ""]
    lines += markdown_table(headers(record), table_rows(record))
    for r in record["rungs"]:
        if r["status"] == "ok":
            lines += ["", f"## {r['name']}: top kernels", "", "| ms/step | calls | category | kernel |",
                      "|---|---|---|---|"]
            lines += [f"| {_ms(k['ms_per_step'])} | {k['calls_per_step']:g} | {k['category']} | "
                      f"`{_short(k['name'])}` |" for k in r["top_kernels"][:5]]
    return "\n".join(lines) + "\n"


def _short(name: str, n: int = 90) -> str:
    return (name[:n] + "...") if len(name) > n else name


def plot_profile(record: dict, path: Path) -> Path:
    """profile.png: `profile_figure` saved; bbox_inches="tight" grows the figure to hold the legend below."""
    return save_figure(profile_figure(record), path)


def profile_figure(record: dict):
    """One stacked horizontal bar per rung, a segment per category, the step's total at its end; a rung
    that did not run is its status, set off from the axis."""
    plt = pyplot()

    rungs = record["rungs"]
    fig, ax = plt.subplots(figsize=(10, 1.0 + 0.45 * len(rungs)))
    top = max([r["ms_per_step"] for r in rungs if r["status"] == "ok"] + [1e-3])
    for i, r in enumerate(rungs):
        if r["status"] != "ok":
            ax.annotate(r["status"], (0, i), xytext=(6, 0), textcoords="offset points", va="center", fontsize=8,
                        color="#777777")
            continue
        _stacked_bar(ax, i, r, record["categories"], top, i == _first_ok(rungs))
    ax.set_yticks(range(len(rungs)), [r["name"] for r in rungs])
    ax.invert_yaxis()
    ax.set_xlim(0, top * 1.15)
    ax.set_xlabel(f"ms per training step ({_timed_by(record)})")
    cfg = record["config"]
    ax.set_title(f"where the step goes: {cfg['preset']}, batch {cfg['batch_size']} x {cfg['seq_len']} "
                 f"on {record['device']['name']}", fontsize=10)
    if _first_ok(rungs) >= 0:  # below the axes, whatever the rung count
        ax.legend(loc="upper left", bbox_to_anchor=(0.0, -0.7 / (1.0 + 0.45 * len(rungs))), ncol=4, frameon=False,
                  fontsize=8)
    ax.spines[["top", "right"]].set_visible(False)
    return fig


def _stacked_bar(ax, i: int, r: dict, categories: dict, top: float, labelled: bool) -> None:
    """Row i: a segment per category (wide ones with their value), the step's total after them."""
    left = 0.0
    for c, label in categories.items():
        width = r["categories_ms"][c]
        ax.barh(i, width, left=left, color=COLOURS[c], edgecolor="white", linewidth=0.5,
                label=label if labelled else None)
        if width > 0.08 * top:
            ax.text(left + width / 2, i, _ms(width), ha="center", va="center", fontsize=7)
        left += width
    ax.text(left + top * 0.01, i, f"{_ms(r['ms_per_step'])} ms", va="center", fontsize=9)


def _first_ok(rungs: list[dict]) -> int:
    return next((i for i, r in enumerate(rungs) if r["status"] == "ok"), -1)


def write_outputs(record: dict, out: Path) -> list[Path]:
    return write_record(out, "profile", record, format_markdown, plot_profile)
