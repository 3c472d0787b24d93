"""What a run's time went to: its timed steps, the steps that compiled and captured, validation and
HellaSwag, checkpoints, and the wall time from its start, with the tokens it has trained on.

The wall time runs from the moment the run starts building its model (reading the data comes before it).
The training time is the sum of the timed steps: every step but the first of each session, which pays
for torch.compile, the CUDA-graph capture and the allocator's growth (`warmup_ms`, reported apart, as a
benchmark leaves out its warm-up). Validation, HellaSwag and checkpoints run between the steps, outside
any step's time.

Across a resume the figures keep adding up: the checkpoint holds them as they stood at its step, so a run
stopped and resumed reports the time its weights took, summed over its sessions. Not counted: the time
between a stop and its --resume, and steps done after the last checkpoint of a killed session (they are
done again, and counted then). A checkpoint without a clock (from an older gpt2ladder) starts it at its
step (`from_step`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


BETWEEN = ("validation", "HellaSwag", "checkpoints")  # what runs between the steps, timed apart from them


def _no_time() -> dict[str, float]:
    return dict.fromkeys(BETWEEN, 0.0)


@dataclass
class RunClock:
    train_ms: float = 0.0  # the timed steps
    warmup_ms: float = 0.0  # the first step of each session: compile, capture
    warmup_steps: int = 0
    between_s: dict[str, float] = field(default_factory=_no_time)  # the run's, over its sessions
    wall_before_s: float = 0.0  # the sessions before this one, up to the checkpoint it resumed
    tokens: int = 0  # trained on, all processes together
    from_step: int = 0  # the step the clock started at
    started: float = field(default_factory=time.perf_counter)  # this session's start
    session_s: dict[str, float] = field(default_factory=_no_time)  # this session's share of between_s

    def add_step(self, ms: float, tokens: int, warmup: bool) -> None:
        if warmup:
            self.warmup_ms += ms
            self.warmup_steps += 1
        else:
            self.train_ms += ms
        self.tokens += tokens

    def add_between(self, kind: str, seconds: float) -> None:
        self.between_s[kind] += seconds
        self.session_s[kind] += seconds

    def wall_s(self) -> float:
        return self.wall_before_s + time.perf_counter() - self.started

    def state_dict(self) -> dict:
        """What a checkpoint keeps: every figure as it stands now."""
        return {"train_ms": self.train_ms, "warmup_ms": self.warmup_ms, "warmup_steps": self.warmup_steps,
                "between_s": dict(self.between_s), "wall_s": self.wall_s(), "tokens": self.tokens,
                "from_step": self.from_step}

    def resumed(self, state: dict | None, step: int) -> RunClock:
        """This session's clock going on from a checkpoint's at `step` (one without a clock starts it there)."""
        if not isinstance(state, dict):
            return RunClock(from_step=step, started=self.started)
        between = {kind: float(state["between_s"][kind]) for kind in BETWEEN}
        return RunClock(train_ms=float(state["train_ms"]), warmup_ms=float(state["warmup_ms"]),
                        warmup_steps=int(state["warmup_steps"]), between_s=between,
                        wall_before_s=float(state["wall_s"]), tokens=int(state["tokens"]),
                        from_step=int(state["from_step"]), started=self.started)

    def summary(self) -> dict:
        """The figures log.jsonl keeps, in seconds: at every step that validated or scored HellaSwag (`clock`), after
        that measurement, and for the step that reached the target (`target`)."""
        return {"train_s": round(self.train_ms / 1000, 3), "warmup_s": round(self.warmup_ms / 1000, 3),
                "warmup_steps": self.warmup_steps, "wall_s": round(self.wall_s(), 3), "tokens": self.tokens,
                **{f"{kind.lower()}_s": round(s, 3) for kind, s in self.between_s.items()},
                "from_step": self.from_step}
