"""The bench record (ladder.json) as a terminal table, Markdown (ladder.md) and the scaling table."""

from __future__ import annotations

import statistics

from gpt2ladder.report.tables import fmt, markdown_table, rung_rows, text_table

BUSY_RATIO = 1.5  # a rung whose p90 step is this many times its p10 was timed on a machine doing other work


def _noise(row: dict, prev: dict) -> bool:
    """The record's own flag; for records older than it, the same rule from their p10-p90."""
    flag = row.get("within_noise_of_prev")
    return flag if flag is not None else (row["ms_p10"] <= prev["ms_p90"] and prev["ms_p10"] <= row["ms_p90"])


def vs_prev(row: dict) -> str:
    """The 'vs prev' cell: the gain over the rung before, or 'noise' when the two overlap."""
    if row.get("speedup_vs_prev") is None:
        return "-"
    return "noise" if row.get("within_noise_of_prev") else f"{row['speedup_vs_prev']:.2f}x"


def spread_note(rows: list[dict]) -> str | None:
    """When the rungs' p10-p90 spreads are wider than the differences between neighbouring rungs (medians of
    each), what that means for reading the ladder; None when the differences stand out (pure)."""
    ok = [r for r in rows if r["status"] == "ok" and r.get("kind") != "best"]
    if len(ok) < 2:
        return None
    width = statistics.median(r["ms_p90"] - r["ms_p10"] for r in ok)
    gap = statistics.median(abs(b["ms_per_step"] - a["ms_per_step"]) for a, b in zip(ok, ok[1:]))
    if width <= gap:
        return None
    worst = max(ok, key=lambda r: r["ms_p90"] / max(r["ms_p10"], 1e-9))
    ratio = worst["ms_p90"] / max(worst["ms_p10"], 1e-9)
    busy = (f"; {worst['name']}'s slow steps took {ratio:.1f}x its fast ones: the machine was busy, run again on "
            "an idle one" if ratio >= BUSY_RATIO else "")
    return (f"spreads wider than the differences: p10-p90 {width:.1f} ms (median) against {gap:.1f} ms between "
            f"neighbouring rungs, so most differences here were not measured{busy}")


def readme_table(record: dict) -> str:
    """The short Markdown table the README shows for a bench record: each measured rung's median and
    spread, its gain over the rung before (or "within noise"), tokens/s, MFU and peak memory."""
    lines = ["| rung | ms/step (p10–p90) | vs rung before | tokens/s | MFU | peak GiB |", "|---|---|---|---|---|---|"]
    prev = None
    for r in (r for r in record["rungs"] if r["status"] == "ok"):
        if prev is None:
            gain = "—"
        else:
            gain = "within noise" if _noise(r, prev) else f"{prev['ms_per_step'] / r['ms_per_step']:.2f}×"
        mfu = "—" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
        mem = "—" if r["peak_mem_bytes"] is None else f"{r['peak_mem_bytes'] / 2**30:.1f}"
        lines.append(f"| {r['name']} | {r['ms_per_step']:.1f} ({r['ms_p10']:.1f}–{r['ms_p90']:.1f}) | {gain} | "
                     f"{r['tokens_per_s']:,.0f} | {mfu} | {mem} |")
        prev = r
    return "\n".join(lines) + "\n"


def ladder_rows(record: dict) -> list[list[str]]:
    """The table the terminal and Markdown share: one row per rung."""
    return rung_rows(record["rungs"], _ladder_cells)


def _ladder_cells(r: dict) -> list[str]:
    mem = fmt(r["peak_mem_bytes"] and r["peak_mem_bytes"] / 2**30, ".2f")
    return [
        r["name"], f"{r['ms_per_step']:.1f}", f"{r['ms_p10']:.1f}-{r['ms_p90']:.1f}",
        f"{r['speedup_vs_baseline']:.2f}x", vs_prev(r),
        f"{r['tokens_per_s']:,.0f}", fmt(r["mfu"] and 100 * r["mfu"], ".1f"), mem,
        f"{r['loss']:.4f}", r["logits_dtype"], r["weight_dtype"],
    ]


HEADERS = ["rung", "ms/step", "p10-p90", "vs base", "vs prev", "tokens/s", "MFU %", "peak GiB",
           "loss", "logits", "weights"]


def format_table(record: dict) -> str:
    return text_table(HEADERS, ladder_rows(record))


WIDTHS = [13, 8, 13, 8, 7, 10, 6, 8, 7, 13, 8]  # the streamed table's columns: wide enough for GPT-2's rows


def stream_header() -> str:
    """The header of the table bench prints a row at a time, as each rung finishes."""
    return "  ".join(h.ljust(w) for h, w in zip(HEADERS, WIDTHS)).rstrip()


def stream_row(row: dict) -> str:
    """One rung's line under `stream_header`; a rung that did not run is its status and reason."""
    cells = rung_rows([row], _ladder_cells)[0]
    if len(cells) != len(HEADERS):
        return f"{cells[0].ljust(WIDTHS[0])}  {cells[1]}"
    return "  ".join(c.ljust(w) for c, w in zip(cells, WIDTHS)).rstrip()


def format_markdown(record: dict) -> str:
    dev = record["device"]
    cfg = record["config"]
    head = [
        f"# gpt2ladder bench: {cfg['preset']} on {dev['name']}",
        "",
        f"- batch {cfg['batch_size']} x seq {cfg['seq_len']}, {_timed_text(record)} after "
        f"{cfg['warmup']} warm-up; data: {record['data']['source']}",
        f"- torch {record['versions']['torch']}, CUDA {record['versions']['cuda']}, "
        f"Triton {record['versions']['triton']}; gpt2ladder {record['gpt2ladder']} at {record['git_sha']}",
        f"- MFU against {fmt(record['peak_flops'] and record['peak_flops'] / 1e12, '.0f', 'no known')} "
        "TFLOP/s dense bf16 peak" + ("" if record["peak_flops"] else f" (device {dev['name']} not in the table)"),
        f"- {record['date']}",
        "",
    ]
    noisy = spread_note(record["rungs"])
    if noisy:  # the first thing to know about every figure below
        head.insert(2, f"- **{noisy}**")
    plan = record.get("batch_plan")
    if plan:
        probed = "; confirmed by a probe of its eager step" if plan["probed_peak"] else ""
        head.insert(-2, f"- {plan['reason']}{probed}")
    if record.get("step_rule"):
        took = [f"{r['name']} {r['n_timed']}" for r in record["rungs"] if r.get("status") == "ok"]
        head.insert(-2, "- timed steps per rung: " + (", ".join(took) or "none measured"))
    cap = dev.get("memory_cap_bytes")
    if cap:
        head.insert(-2, f"- the allocator was capped at {cap / 2**30:.1f} GiB (--gpu-memory) of this card's "
                        f"{dev['memory_bytes'] / 2**30:.1f} GiB: a smaller card's memory, this card's speed")
    if cfg.get("start"):
        head.insert(-2, f"- timed from {cfg['start']} on: the rungs before it applied, not timed; 'vs base' is "
                        f"against {cfg['start']}")
    head.insert(-2, "- vs prev 'noise': the rung's p10-p90 overlaps the rung before it, no difference was measured")
    best = record.get("best")
    if best:
        head.insert(-2, "- --rungs best kept: " + ", ".join(best["rungs"]) + "; dropped: "
                    + ("; ".join(f"{d['rung']} ({d['why']})" for d in best["decisions"] if not d["kept"]) or "none"))
        if best.get("too_noisy"):
            head.insert(-2, f"- {best['too_noisy']}")
    search = record.get("batch_search")
    if search:
        sizes = ", ".join(f"{t['batch_size']}: " + (f"{t['tokens_per_s']:,.0f}" if t["status"] == "ok" else t["status"])
                          for t in search["tried"])
        head.insert(-2, f"- --batch-size best: {search['largest_fit']} sequences fit; tokens/s at the top rung "
                        f"({search['rung']}) by size: {sizes}; chose {search['chosen']}")
    if record.get("partial"):
        head.insert(-2, "- partial: the run stopped before it had measured every rung; the rows below are the "
                        "ones it finished")
    body = markdown_table(HEADERS, ladder_rows(record))
    return "\n".join(head + body) + "\n"


def _timed_text(record: dict) -> str:
    """The steps each rung timed: the fixed count, or the adaptive rule."""
    rule = record.get("step_rule")
    return rule["text"] if rule else f"{record['config']['steps']} timed steps"


def format_scaling(record: dict) -> str:
    """A Markdown table (it reads in a terminal too): GPUs, tokens/s total and per GPU, efficiency."""
    world = record.get("world_size", 1)
    base = record.get("baseline")
    lines = [f"Scaling over {world} rank(s), {record.get('strategy') or 'single process'}, global batch "
             f"{record.get('global_batch_size')} x {record['config']['seq_len']}"
             + (f"; baseline {base['path']} ({base['world_size']} GPU)" if base else "; no --baseline-json given"),
             "", "| rung | tokens/s total | tokens/s per GPU | baseline per GPU | efficiency |",
             "|---|---|---|---|---|"]
    for r in record["rungs"]:
        if r.get("status") != "ok":
            continue
        b = r.get("baseline_tokens_per_s_per_gpu")
        eff = r.get("scaling_efficiency")
        lines.append(f"| {r['name']} | {r['tokens_per_s']:,.0f} | {r['tokens_per_s_per_gpu']:,.0f} | "
                     f"{'-' if b is None else f'{b:,.0f}'} | {'-' if eff is None else f'{100 * eff:.1f}%'} |")
    return "\n".join(lines) + "\n"
