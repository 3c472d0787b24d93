"""A training run: its config, the learning-rate schedule, the loop (`trainer`), the run around it
(`run`: the directory's lock, config.json, what is said at the start and the end), the run log, Ctrl-C
and SIGTERM handling, and checkpoints that survive crashes."""
