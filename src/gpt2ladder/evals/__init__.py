"""Evaluation: measuring a model on a benchmark, apart from training. One module per task (HellaSwag
first: `hellaswag.py`) holds its data and how an example becomes token rows; `scoring.py` scores rows
as a pure function; `runner.py` runs the model over a task's examples in padded batches. `gpt2ladder
eval` and the trainer evaluate through the same two calls, `runner.prepare` and `runner.evaluate`."""
