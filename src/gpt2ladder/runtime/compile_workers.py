"""Inductor's compile workers, started in a session of their own.

A signal sent to a process group reaches every process in it: GNU `timeout`'s at its deadline, `kill -TERM -PGID`.
Inductor starts its compile workers (a sidecar process and the pool it forks, by `subprocess.Popen` in
torch/_inductor/compile_worker/subproc_pool.py) in the trainer's group. So a SIGTERM that lands during a compile
ends them as well, while the trainer, which only notes the signal and stops after the step in flight
(`training/signals.py`), waits for their kernels: with no end, since the pool keeps its own copy of the pipe the
sidecar answers on and never sees the sidecar go (torch 2.11 to 2.13). In a session of their own the workers never
get the group's signal: the compile ends, then the step, and the run stops with its checkpoint saved. When the
trainer dies, the sidecar sees its job pipe close and stops its pool, as it does without this.

A signal sent to each process on its own (a scheduler that signals every process of a job's cgroup) still reaches
them. Ctrl-C does no harm either way: the workers ignore SIGINT once started.
"""

from __future__ import annotations

import types

_MARK = "_gpt2ladder_own_session"  # set on the module Inductor's pool starts its workers through, once replaced


def detach() -> bool:
    """From now on, have Inductor start its compile workers in a new session; whether it will. False where this
    torch starts them some other way (no subproc_pool, no `subprocess` module in it, or a worker_start_method other
    than "subprocess"). A pool already started keeps its session; calling this again changes nothing."""
    try:
        from torch._inductor import config
        from torch._inductor.compile_worker import subproc_pool
    except ImportError:
        return False
    if getattr(config, "worker_start_method", "subprocess") != "subprocess":  # a pool of the trainer's own children
        return False
    real = getattr(subproc_pool, "subprocess", None)
    if not isinstance(real, types.ModuleType) or not isinstance(getattr(real, "Popen", None), type):
        return False
    if getattr(real, _MARK, False):
        return True

    class OwnSession(real.Popen):
        """Popen whose process starts a new session, unless the caller says otherwise."""

        def __init__(self, *args, **kwargs):
            kwargs.setdefault("start_new_session", True)
            super().__init__(*args, **kwargs)

    shim = types.ModuleType(real.__name__, real.__doc__)
    shim.__dict__.update({k: v for k, v in vars(real).items() if k not in ("__name__", "__doc__")})
    shim.Popen = OwnSession
    setattr(shim, _MARK, True)
    subproc_pool.subprocess = shim  # that module's name alone: every other Popen in the process is as it was
    return True
