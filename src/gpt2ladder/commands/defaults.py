"""The commands' defaults: the table lives in `gpt2ladder/defaults.py`, below every layer, so the configs and
the optimizer read the same values; the commands import it from here as before."""

from gpt2ladder.defaults import (  # noqa: F401 (re-exported)
    COMPILE_BACKEND_ENV,
    DEFAULTS,
    MUON_RATES,
    RUNGS_WHY,
    default_text,
    defaults,
)
