"""The doctor's report for a person: aligned columns, one line per check, ticks where the terminal can
show them."""

from __future__ import annotations

from gpt2ladder.errors import SMALLER_STEP


# The rungs doctor recommends are auto's for the gpt2 recipe: a rung may decline another recipe (tied_grad an untied
# head, flash doc_windows' attention), and train, parity and profile name each one they leave out so.
RECOMMENDED = ("recommended for the gpt2 recipe (what --rungs auto runs; another --recipe may leave some out, and "
               "says which)")


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _header(d: dict) -> list[str]:
    dev, v = d["device"], d["versions"]
    device = dev["name"] if dev["type"] != "cuda" else f"{dev['name']}, compute capability {dev['capability_text']}"
    memory = f", {_gib(dev['memory_bytes'])}" if dev["memory_bytes"] else ""
    host = d["os"] + (f", {_gib(dev['host_memory_bytes'])} RAM" if dev["host_memory_bytes"] else "")
    versions = (f"Python {v['python']}, torch {v['torch']}, CUDA {v['cuda'] or '-'}, "
                f"cuDNN {v['cudnn'] or '-'}, Triton {v['triton'] or '-'}")
    return [f"device     {device}{memory}", f"host       {host}", f"versions   {versions}"]


def _section(title: str, checks: dict, marks: tuple[str, str, str]) -> list[str]:
    width = max(len(c["label"]) for c in checks.values())
    mark_width = max(len(m) for m in marks)
    lines = ["", title]
    for c in checks.values():
        mark = marks[0] if c["usable"] else marks[2] if c["usable"] is None else marks[1]
        lines.append(f"  {mark.ljust(mark_width)} {c['label'].ljust(width)}  {c['reason']}")
    return lines


def format_report(d: dict, marks: tuple[str, str, str] = ("✓", "✗", "?")) -> str:
    """The human-readable report of a diagnosis (`measure.doctor.diagnose`): one line per check."""
    probe = f" ({d['sdpa']['probe']})" if d["sdpa"]["probe"] else ""
    lines = ["gpt2ladder doctor", ""] + _header(d)
    lines += _section("features", d["features"], marks)
    lines += _section(f"attention kernels behind the flash rung{probe}", d["sdpa"]["backends"], marks)
    lines += _section("rungs", d["rungs"], marks)
    lines += ["", f"{RECOMMENDED}: {','.join(d['recommended_rungs'])}"]
    if d.get("race"):
        lines += _section("race rungs (gpt2ladder race: rung k adds its part to the rungs before it)", d["race"],
                          marks)
    if d.get("memory"):
        lines += _memory(d["memory"])
    if d.get("data_cache"):
        lines += _disk(d["data_cache"])
    return "\n".join(lines)


def _disk(disk: dict) -> list[str]:
    return ["", f"data cache {disk['path']}: {_gib(disk['free_bytes'])} free of {_gib(disk['total_bytes'])} "
            "(token caches; a prepared corpus takes 2 bytes a token, 20 GB for FineWeb-Edu's 10B)"]


def _memory(m: dict) -> list[str]:
    cap = " (--gpu-memory)" if m["capped"] else ""
    lines = ["", f"memory: {m['preset']} at {m['seq_len']} tokens per sequence on {_gib(m['memory_bytes'])} for "
             f"PyTorch{cap}, "
             "the largest batch per rung (estimated from shapes and dtypes; bench confirms it with a probe)"]
    width = max(len(n) for n in m["rungs"])
    lines += [f"  {name.ljust(width)}  {r['largest_batch']:>4} sequences  ({r['gib_per_sequence']:.2f} GiB each)"
              for name, r in m["rungs"].items()]
    t = m["train"]
    if t["micro_batch"]:
        graph = ", without a CUDA graph (it would not fit beside the step)" if t.get("cuda_graph_left_out") else ""
        lines.append(f"train: {t['tokens_per_step']:,} tokens per step as micro-batch {t['micro_batch']} x "
                     f"{t['accumulation']} accumulation step{'s' if t['accumulation'] != 1 else ''}{graph}")
    else:
        lines.append(f"train: not even one sequence fits at the top rung; {SMALLER_STEP}")
    return lines


def marks_for(stream) -> tuple[str, str, str]:
    """Tick and cross where the terminal can show them; yes/no where it cannot (e.g. a cp1252 console)."""
    try:
        "✓✗".encode(getattr(stream, "encoding", None) or "ascii")
        return ("✓", "✗", "?")
    except (UnicodeEncodeError, LookupError):
        return ("yes", "no", "?")
