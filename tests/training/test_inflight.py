"""Steps in flight (training/inflight.py): read back in the order they were queued, `lag` behind unless every
one is asked for, each with its own values and facts; lag 0 is the synchronous loop."""

import torch

from gpt2ladder.training.inflight import CUDA_LAG, InFlight, readback_lag

CPU = torch.device("cpu")


def _queue(flight, step):
    flight.start()
    flight.queue(torch.tensor([float(step), -float(step)]), {"step": step})


def test_lag_zero_reads_each_step_as_it_is_queued():
    flight = InFlight(CPU, 0)
    for step in (1, 2):
        _queue(flight, step)
        (done,) = flight.finished()
        assert done.facts == {"step": step} and done.values == (step, -step) and done.ms >= 0
    assert len(flight) == 0


def test_a_lag_holds_back_the_newest_steps_until_every_one_is_asked_for():
    flight, read = InFlight(CPU, 2), []
    for step in range(1, 6):
        _queue(flight, step)
        read.append([d.facts["step"] for d in flight.finished()])
    assert read == [[], [], [1], [2], [3]]  # two steps stay in flight
    rest = flight.finished(everything=True)
    assert [d.facts["step"] for d in rest] == [4, 5] and [d.values for d in rest] == [(4, -4), (5, -5)]
    assert flight.finished(everything=True) == []


def test_only_a_cuda_gpu_runs_ahead():
    assert readback_lag(CPU) == 0 and readback_lag(torch.device("mps")) == 0
    assert readback_lag(torch.device("cuda", 0)) == CUDA_LAG >= 1
    assert not InFlight(CPU, 2).events  # a CPU has no CUDA events: its lag only delays the reading
