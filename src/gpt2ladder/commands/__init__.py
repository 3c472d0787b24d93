"""One module per command: the parsed flags -> a frozen config (defaults from `defaults.py`) -> the
library call -> the files and the lines the user sees. No measuring or training logic lives here.

Each command decides everything once, at its start, and checks its input before it prints anything:
a flag's form in its argparse type (`cli.py`), a setting's range in its config's `__post_init__`, and
the files it reads (the text, a checkpoint, a baseline) by reading them, all before the first line
it prints. A lower layer never asks again.
"""
