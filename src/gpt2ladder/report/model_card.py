"""The README.md of an exported model (a Hugging Face model card): the metadata the hub reads (license,
datasets, base model, language, library, pipeline and a model-index of measured results, written by
huggingface_hub's own `ModelCardData`), what the run recorded about its data, steps and losses, and how
to load it. A fact the run did not record is left out, never guessed; a loss that is not finite never
reaches the card."""

from __future__ import annotations

import math

from gpt2ladder.errors import UsageError
from gpt2ladder.model.recipe import parse_recipe, recipe_label

# Data sources whose text is a dataset on the hub, by the name a run records.
HUB_DATASETS = {"tinyshakespeare": ("karpathy/tiny_shakespeare", "Tiny Shakespeare")}
PLACEHOLDER_REPO = "your-name/{name}"


def model_card(name: str, shape: str, dtype: str, facts: dict, repo: str | None = None) -> str:
    """Markdown for the folder `name`; `facts` as `commands/export.py` reads them from the run (or, for
    weights that were not trained here, only `base_model`). `repo`: where it is pushed, if it is."""
    rows = "\n".join(f"| {label} | {text} |" for label, text in _rows(facts))
    where = repo or PLACEHOLDER_REPO.format(name=name)
    trained = facts.get("step") is not None
    return f"""---
{metadata(name, facts)}---

# {name}

A GPT-2 {'trained with' if trained else 'exported by'} gpt2ladder: {shape}.
Exported as a Hugging Face `GPT2LMHeadModel` with {dtype} weights and the GPT-2 tokenizer, which reads
a literal `<|endoftext|>` in a text as GPT-2's end-of-text token (id 50256), as gpt2ladder does in training.

## {'Training, as the run recorded it' if trained else 'Where the weights came from'}

| | |
|---|---|
{rows}

## Use

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

repo = "{where}"{'' if repo else '  # the repository this folder was pushed to, or the folder itself'}
tokenizer = AutoTokenizer.from_pretrained(repo)
model = AutoModelForCausalLM.from_pretrained(repo)
```

gpt2ladder reads it as well: `gpt2ladder sample {where}`, `gpt2ladder eval {where}`, and
`gpt2ladder train --init-from {where}` to train on from it.
"""


def metadata(name: str, facts: dict) -> str:
    """The card's YAML header, through huggingface_hub's ModelCardData (the hub's own field names)."""
    from huggingface_hub import ModelCardData

    dataset = HUB_DATASETS.get((facts.get("data") or {}).get("source"))
    data = ModelCardData(language="en", license=facts.get("license"), library_name="transformers",
                         pipeline_tag="text-generation", tags=["gpt2", "gpt2ladder"],
                         datasets=[dataset[0]] if dataset else None, base_model=facts.get("base_model"),
                         model_name=name, eval_results=_results(facts) or None)
    return data.to_yaml() + "\n"


def _results(f: dict) -> list:
    """The model-index entries: the validation loss, and HellaSwag when it was measured on these weights."""
    from huggingface_hub import EvalResult

    results = []
    val, source = f.get("val"), (f.get("data") or {}).get("source")
    if val and finite(val.get("loss")):
        dataset_id, dataset_name = HUB_DATASETS.get(source, (source, source))
        results.append(EvalResult(task_type="text-generation", dataset_type=dataset_id, dataset_name=dataset_name,
                                  dataset_split="validation", metric_type="loss", metric_name="validation loss",
                                  metric_value=round(val["loss"], 4)))
    hs = f.get("hellaswag")
    if hs:
        for metric in ("acc_norm", "acc"):
            results.append(EvalResult(task_type="multiple-choice", task_name="HellaSwag (completion style)",
                                      dataset_type="Rowan/hellaswag", dataset_name="HellaSwag",
                                      dataset_split="validation", metric_type=metric, metric_name=metric,
                                      metric_value=round(hs[metric], 4)))
    return results


def finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _rows(f: dict) -> list[tuple[str, str]]:
    rows = []
    data = f.get("data") or {}
    if data.get("source"):
        extra = [f"{data['n_tokens']:,} tokens"] if data.get("n_tokens") else []
        extra += [f"sha256 {data['sha256'][:16]}…"] if data.get("sha256") else []
        rows.append(("data", data["source"] + (f" ({', '.join(extra)})" if extra else "")))
    if f.get("step") is not None:
        rows += _recipe(f.get("recipe"))
        rows.append(("steps", _steps(f)))
    if f.get("step") is None:
        rows.append(("weights", f"those of {f['base_model']}" if f.get("base_model") else "a Hugging Face folder"))
    elif f.get("init_from") or f.get("base_model"):
        rows.append(("started from", f"the weights of {f.get('base_model') or f['init_from']}"))
    elif f.get("seed") is not None:
        rows.append(("started from", f"random weights, seed {f['seed']}"))
    if finite(f.get("loss")):
        rows.append(("training loss", f"{f['loss']:.4f} at step {f['step']:,}"))
    val = f.get("val")
    if f.get("step") is not None:
        rows.append(("validation loss", f"{val['loss']:.4f} at step {val['step']:,}" + _batches(f)
                     if val and finite(val.get("loss")) else "not recorded"))
    if f.get("hellaswag"):
        hs = f["hellaswag"]
        rows.append(("HellaSwag", f"acc_norm {hs['acc_norm']:.4f}, acc {hs['acc']:.4f} over {hs['n']:,} validation "
                                  "examples (completion style, as build-nanogpt and llm.c score it)"))
    rows += _where(f)
    return rows


def _recipe(name: str | None) -> list[tuple[str, str]]:
    """The recipe row: what trained the weights (the model is GPT-2's whatever the recipe, or it would not export);
    none for a recipe the run recorded in a form this version does not read."""
    if name is None:  # a run from before recipes recorded none: left out, not guessed
        return []
    try:
        recipe = parse_recipe(name)
    except UsageError:
        return []
    optimizer = ("Muon for the Blocks' matrices, AdamW for the rest" if recipe.optimizer == "muon" else "AdamW")
    schedule = ("linear warm-up, then stable, then linear decay" if recipe.schedule == "wsd"
                else "linear warm-up, then cosine decay")
    return [("recipe", f"{recipe_label(recipe.name)} ({optimizer}; {schedule})")]


def _steps(f: dict) -> str:
    steps = f"{f['step']:,}" + (f" of {f['steps']:,} planned" if f.get("steps") else "")
    return steps + (f", {f['tokens_per_step']:,} tokens per step" if f.get("tokens_per_step") else "")


def _where(f: dict) -> list[tuple[str, str]]:
    rows = [("rungs", ", ".join(f["rungs"]))] if f.get("rungs") else []
    where = [f.get(k) for k in ("device", "date") if f.get(k)]
    if f.get("gpt2ladder"):
        where.append(f"gpt2ladder {f['gpt2ladder']}" + (f" ({f['git_sha']})" if f.get("git_sha") else ""))
    return rows + ([("run on", ", ".join(where))] if where else [])


def _batches(f: dict) -> str:
    shape = [f.get(k) for k in ("eval_batches", "batch_size", "seq_len")]
    return f" (mean over {shape[0]} batches of {shape[1]} x {shape[2]} tokens)" if all(shape) else ""
