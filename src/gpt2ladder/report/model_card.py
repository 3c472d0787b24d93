"""The README.md of an exported model (a Hugging Face model card): what the run recorded about its data,
steps and losses, and how to load it. A fact the run did not record is left out, never guessed."""

from __future__ import annotations


def model_card(name: str, shape: str, dtype: str, facts: dict) -> str:
    """Markdown for the folder `name`; `facts` as `commands/export.py` reads them from the run."""
    rows = "\n".join(f"| {label} | {text} |" for label, text in _rows(facts))
    return f"""---
library_name: transformers
pipeline_tag: text-generation
tags:
- gpt2
- gpt2ladder
---

# {name}

A GPT-2 trained with gpt2ladder: {shape}.
Exported as a Hugging Face `GPT2LMHeadModel` with {dtype} weights and the GPT-2 tokenizer.

## Training, as the run recorded it

| | |
|---|---|
{rows}

## Use

```python
from transformers import AutoTokenizer, GPT2LMHeadModel

tokenizer = AutoTokenizer.from_pretrained("{name}")
model = GPT2LMHeadModel.from_pretrained("{name}")
```

or `gpt2ladder sample {name}`, or `gpt2ladder train --init-from {name}` to train on from it.
"""


def _rows(f: dict) -> list[tuple[str, str]]:
    rows = []
    data = f.get("data") or {}
    if data.get("source"):
        extra = [f"{data['n_tokens']:,} tokens"] if data.get("n_tokens") else []
        extra += [f"sha256 {data['sha256'][:16]}…"] if data.get("sha256") else []
        rows.append(("data", data["source"] + (f" ({', '.join(extra)})" if extra else "")))
    steps = f"{f['step']:,}" + (f" of {f['steps']:,} planned" if f.get("steps") else "")
    if f.get("tokens_per_step"):
        steps += f", {f['tokens_per_step']:,} tokens per step"
    rows.append(("steps", steps))
    if f.get("init_from"):
        rows.append(("started from", f"the weights of {f['init_from']}"))
    elif f.get("seed") is not None:
        rows.append(("started from", f"random weights, seed {f['seed']}"))
    if f.get("loss") is not None:
        rows.append(("training loss", f"{f['loss']:.4f} at step {f['step']:,}"))
    val = f.get("val")
    rows.append(("validation loss", f"{val['loss']:.4f} at step {val['step']:,}" + _batches(f) if val else "not recorded"))
    if f.get("rungs"):
        rows.append(("rungs", ", ".join(f["rungs"])))
    where = [f.get(k) for k in ("device", "date") if f.get(k)]
    if f.get("gpt2ladder"):
        where.append(f"gpt2ladder {f['gpt2ladder']}" + (f" ({f['git_sha']})" if f.get("git_sha") else ""))
    if where:
        rows.append(("run on", ", ".join(where)))
    return rows


def _batches(f: dict) -> str:
    shape = [f.get(k) for k in ("eval_batches", "batch_size", "seq_len")]
    return f" (mean over {shape[0]} batches of {shape[1]} x {shape[2]} tokens)" if all(shape) else ""
