"""Run a gpt2ladder command with Inductor config options set first: an A/B harness for compile knobs.

    python3 benchmarks/micro/inductor_knobs.py triton.enable_pdl=1 combo_kernels=1 -- bench ...

Each KEY=VALUE before `--` is set on `torch._inductor.config` (VALUE read as a Python literal);
what follows `--` is gpt2ladder's own command line. Prints the options it set.
"""

import ast
import sys

import torch._inductor.config as inductor_config

from gpt2ladder.cli import main

if __name__ == "__main__":
    split = sys.argv.index("--")
    for item in sys.argv[1:split]:
        key, value = item.split("=", 1)
        inductor_config.__setattr__(key, ast.literal_eval(value))  # dotted keys reach sub-configs
        print(f"inductor config: {key} = {inductor_config.__getattr__(key)!r}", flush=True)
    sys.exit(main(sys.argv[split + 1:]))
