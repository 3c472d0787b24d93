"""Results that describe themselves: the header every record carries, and the ladder as JSON, Markdown
and a terminal table.

A record holds the config, versions, device and git SHA, so one file reproduces the run.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import tempfile
from pathlib import Path

import torch

from gpt2ladder.errors import UsageError


def record_header(caps, device: torch.device) -> dict:
    from gpt2ladder import __version__

    return {
        "gpt2ladder": __version__,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "git_sha": git_sha(),
        "device": {"type": device.type, "name": caps.name, "capability": list(caps.capability),
                   "memory_bytes": caps.total_memory, "count": torch.cuda.device_count() if device.type == "cuda" else 0},
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "cuda": torch.version.cuda, "triton": caps.triton_version,
                     "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None},
        "host": {"os": platform.system(), "machine": platform.machine(), "cpus": os.cpu_count()},
    }


def git_sha() -> str | None:
    """The commit of the source tree this package was run from, when it is a git checkout."""
    if os.environ.get("GPT2LADDER_GIT_SHA"):  # a copy of the tree without .git (e.g. shipped to a GPU host)
        return os.environ["GPT2LADDER_GIT_SHA"]
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode:
        return None
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                           capture_output=True, text=True, timeout=5).stdout.strip()
    return out.stdout.strip() + ("-dirty" if dirty else "")


def prepare_out_dir(path: str | Path) -> Path:
    """Create the output directory, or fail in one line before any work is done."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".write-test-"):
            pass
    except OSError as err:
        raise UsageError(f"cannot write to output directory {out}: {err.strerror or err}") from None
    return out


def write_json(path: Path, record: dict) -> None:
    """Atomic: a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def _fmt(value, spec: str, none: str = "-") -> str:
    return none if value is None else format(value, spec)


def rung_rows(rungs: list[dict], cells) -> list[list[str]]:
    """Table rows: `cells(row)` for a measured rung, its status and reason for any other."""
    return [cells(r) if r["status"] == "ok" else [r["name"], f"{r['status']}: {r.get('reason', '')}"]
            for r in rungs]


def ladder_rows(record: dict) -> list[list[str]]:
    """The table the terminal and Markdown share: one row per rung."""
    return rung_rows(record["rungs"], _ladder_cells)


def _ladder_cells(r: dict) -> list[str]:
    mem = _fmt(r["peak_mem_bytes"] and r["peak_mem_bytes"] / 2**30, ".2f")
    return [
        r["name"], f"{r['ms_per_step']:.1f}", f"{r['ms_p10']:.1f}-{r['ms_p90']:.1f}",
        f"{r['speedup_vs_baseline']:.2f}x", _fmt(r["speedup_vs_prev"], ".2f", "-") + ("x" if r["speedup_vs_prev"] else ""),
        f"{r['tokens_per_s']:,.0f}", _fmt(r["mfu"] and 100 * r["mfu"], ".1f"), mem,
        f"{r['loss']:.4f}", r["logits_dtype"], r["weight_dtype"],
    ]


HEADERS = ["rung", "ms/step", "p10-p90", "vs base", "vs prev", "tokens/s", "MFU %", "peak GiB",
           "loss", "logits", "weights"]


def text_table(headers: list[str], rows: list[list[str]], right: bool = False) -> str:
    """Aligned columns for the terminal; a row shorter than the headers is a name and a message
    (a skipped or failed rung) and does not set the column widths."""
    full = [r for r in rows if len(r) == len(headers)]
    widths = [max([len(h)] + [len(r[i]) for r in full]) for i, h in enumerate(headers)]

    def line(cells):
        return "  ".join(c.rjust(w) if right and i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(headers)] + [line(r) if len(r) == len(headers) else f"{r[0].ljust(widths[0])}  {r[1]}"
                                        for r in rows])


def markdown_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """The same rows as Markdown lines; short rows are padded with empty cells."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return lines + ["| " + " | ".join(r + [""] * (len(headers) - len(r))) + " |" for r in rows]


def format_table(record: dict) -> str:
    return text_table(HEADERS, ladder_rows(record))


def format_markdown(record: dict) -> str:
    dev = record["device"]
    cfg = record["config"]
    head = [
        f"# gpt2ladder bench: {cfg['preset']} on {dev['name']}",
        "",
        f"- batch {cfg['batch_size']} x seq {cfg['seq_len']}, {cfg['steps']} timed steps after "
        f"{cfg['warmup']} warm-up; data: {record['data']['source']}",
        f"- torch {record['versions']['torch']}, CUDA {record['versions']['cuda']}, "
        f"Triton {record['versions']['triton']}; gpt2ladder {record['gpt2ladder']} at {record['git_sha']}",
        f"- MFU against {_fmt(record['peak_flops'] and record['peak_flops'] / 1e12, '.0f', 'no known')} "
        "TFLOP/s dense bf16 peak" + ("" if record["peak_flops"] else f" (device {dev['name']} not in the table)"),
        f"- {record['date']}",
        "",
    ]
    auto = record.get("auto_batch")
    if auto:
        head.insert(-2, f"- --batch-size auto: {auto['probed']} sequences fit the memory probe; measured at "
                        f"{auto['measured']}")
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


def progress_bar(total: int, label: str, enabled: bool = True):
    """One bar per rung or run, on stderr, gone when done; `enabled=False` keeps logs clean."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=f"{label:>11}", unit="step", leave=False, disable=not enabled)


def write_record(out: Path, stem: str, record: dict, markdown, plot) -> list[Path]:
    """STEM.json, STEM.md and STEM.png in `out`, from a record and its Markdown and plot functions."""
    paths = [out / f"{stem}.json", out / f"{stem}.md", out / f"{stem}.png"]
    write_json(paths[0], record)
    paths[1].write_text(markdown(record))
    plot(record, paths[2])
    return paths
