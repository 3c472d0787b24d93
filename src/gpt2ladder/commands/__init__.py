"""One module per command: the parsed flags -> a frozen config (defaults from `defaults.py`) -> the
library call -> the files and the lines the user sees. No measuring or training logic lives here."""
