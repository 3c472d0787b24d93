"""Many processes give the single-process answer: DDP and FSDP2 on CPU with gloo, launched by torchrun.

Each multi-process case runs `python -m torch.distributed.run --standalone --nproc_per_node=2` (torchrun
picks a free port itself) with OMP_NUM_THREADS=1, so two ranks share the two CPU cores of CI.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpt2ladder.cli import main
from gpt2ladder.errors import UsageError
from gpt2ladder.ladder import Setup
from gpt2ladder.measure.scaling import add_scaling, load_baseline
from gpt2ladder.report.bench import format_scaling
from gpt2ladder.runtime import distributed
from gpt2ladder.runtime.distributed import SINGLE, Dist
from gpt2ladder.runtime.engine import Engine

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import distributed_worker as worker  # noqa: E402  (the script the ranks run; its constants are shared)


def torchrun(args: list[str], nproc: int = 2, timeout: int = 120, env: dict | None = None):
    """Run `args` (a script path or `-m module ...`) under torchrun on CPU; returns the CompletedProcess."""
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(launch + args, capture_output=True, text=True, timeout=timeout, env=full_env)


# --- DDP / FSDP2 steps against one process --------------------------------------------------------


@pytest.fixture(scope="module")
def ranks_result(module_tmp):
    out = module_tmp("dist") / "result.pt"
    proc = torchrun([str(HERE / "distributed_worker.py"), str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out, weights_only=False)


def single_process_step(accum: int = 1, setup: Setup = Setup()) -> dict:
    engine = Engine(worker.MODEL, setup, torch.device("cpu"), seed=0, optim=worker.OPTIM, compile_backend="eager")
    x, y = worker.micro_batches(SINGLE, accum)
    loss = engine.step(x, y)
    return {"loss": float(loss), "grads": {n: p.grad.clone() for n, p in engine.raw_model.named_parameters()},
            "params": engine.raw_model.state_dict()}


@pytest.fixture(scope="module")
def single():
    return single_process_step()


@pytest.fixture(scope="module")
def single_accum():
    return single_process_step(accum=worker.ACCUM)


def assert_same_step(ranks: dict, one: dict) -> None:
    assert ranks["loss"] == pytest.approx(one["loss"], rel=1e-6)
    assert ranks["grads"].keys() == one["grads"].keys()
    for name, grad in one["grads"].items():
        torch.testing.assert_close(ranks["grads"][name], grad, rtol=1e-5, atol=1e-7, msg=name)
    assert ranks["params"].keys() == one["params"].keys()  # unwrapped names: no module. / _orig_mod.
    for name, value in one["params"].items():
        torch.testing.assert_close(ranks["params"][name], value, rtol=1e-5, atol=1e-6, msg=name)


def test_ddp_gradients_equal_single_process_gradients(ranks_result, single):
    assert ranks_result["world_size"] == 2
    assert_same_step(ranks_result["ddp"], single)


def test_ddp_with_compile_equals_single_process(ranks_result, single):
    """torch.compile(DDP(model)) (dynamo's DDPOptimizer path), eager backend so it is quick on CPU."""
    assert_same_step(ranks_result["ddp_compiled"], single)


def test_ddp_with_fused_adamw_clips_as_one_process_does(ranks_result):
    """Fused AdamW takes the clipping factor as its grad_scale (runtime/engine.py); under DDP each rank computes it
    from the all-reduced gradients, so the clipped step is the single process's."""
    assert_same_step(ranks_result["ddp_fused"], single_process_step(setup=Setup(fused_adamw=True)))


def test_fsdp2_step_equals_single_process(ranks_result, single):
    """fully_shard runs on CPU with gloo in torch >= 2.6: one clipped AdamW step matches exactly."""
    assert_same_step(ranks_result["fsdp"], single)


def test_fsdp2_with_compile_equals_single_process(ranks_result, single):
    """torch.compile of the sharded model: dynamo breaks the graph at FSDP2's hooks (eager backend on CPU)."""
    assert_same_step(ranks_result["fsdp_compiled"], single)


def test_gradient_accumulation_matches_single_process(ranks_result, single_accum):
    assert_same_step(ranks_result["ddp_accum"], single_accum)
    assert_same_step(ranks_result["fsdp_accum"], single_accum)


def test_ddp_uses_the_measured_bucket_size(ranks_result):
    assert ranks_result["ddp"]["bucket_bytes"] == distributed.DDP_BUCKET_MB * 1024 * 1024 == 200 * 2**20
    assert ranks_result["fsdp"]["bucket_bytes"] is None


def test_inner_micro_steps_do_not_all_reduce(ranks_result):
    # DDP: a comm hook counts bucket all-reduces; three micro-steps reduce as often as one.
    once = ranks_result["ddp"]["allreduce_calls"]
    assert once > 0
    assert ranks_result["ddp_accum"]["allreduce_calls"] == once
    # FSDP2: the sharded .grad only appears when the last micro-step reduce-scatters.
    assert ranks_result["fsdp_accum"]["grads_after_each_backward"] == [False] * (worker.ACCUM - 1) + [True]


def test_fsdp2_checkpoint_is_full_and_loads_back_into_shards(ranks_result, single):
    trip = ranks_result["fsdp_round_trip"]
    saved = trip["saved"]
    # The gathered state has the single-process layout: full tensors under the raw model's names...
    one = single["params"]
    assert saved["model"].keys() == one.keys()
    assert all(saved["model"][k].shape == v.shape for k, v in one.items())
    # ...and optimizer state keyed by parameter index, as optimizer.state_dict() writes it.
    assert sorted(saved["optimizer"]["state"]) == list(range(len(saved["optimizer"]["state"])))
    assert saved["optimizer"]["state"][0]["exp_avg"].shape == one["transformer.wte.weight"].shape
    # Loaded into a fresh sharded engine, the next step is the same step.
    assert trip["losses"][0] == trip["losses"][1]
    for name, value in trip["states"][0].items():
        torch.testing.assert_close(trip["states"][1][name], value, rtol=0, atol=0, msg=name)


# --- launching, strategy and inconsistent launches ------------------------------------------------


def test_without_torchrun_everything_is_a_single_process(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert distributed.init_from_env("cpu") == SINGLE
    assert SINGLE.is_main and not SINGLE.enabled and SINGLE.world_size == 1
    value = torch.tensor(2.5)
    assert distributed.all_reduce_mean(value, SINGLE) is value
    assert distributed.reduce_floats([1.0, 2.0], SINGLE) == [1.0, 2.0]


@pytest.mark.parametrize("env, message", [
    ({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "inconsistent torchrun environment"),
    ({"RANK": "x", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "must be integers"),
])
def test_a_broken_torchrun_environment_is_one_line(monkeypatch, env, message):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(UsageError, match=message):
        distributed.init_from_env("cpu")


def test_strategy_choice():
    two = Dist(rank=0, local_rank=0, world_size=2, backend="gloo")
    assert distributed.resolve_strategy("auto", "gpt2", two) == "ddp"
    assert distributed.resolve_strategy("auto", "gpt2-large", two) == "fsdp"
    assert distributed.resolve_strategy("auto", "gpt2-xl", two) == "fsdp"
    assert distributed.resolve_strategy("fsdp", "tiny", two) == "fsdp"
    assert distributed.resolve_strategy("auto", "gpt2-xl", SINGLE) is None
    assert distributed.parallelize_for(SINGLE, distributed.resolve_strategy("auto", "gpt2", SINGLE)) is None
    assert distributed.parallelize_for(two, "fsdp").keywords == {"dist": two, "strategy": "fsdp"}
    with pytest.raises(UsageError, match="needs several processes: launch with torchrun"):
        distributed.resolve_strategy("fsdp", "gpt2-xl", SINGLE)
    with pytest.raises(UsageError, match="unknown --strategy"):
        distributed.resolve_strategy("zero3", "gpt2", two)


def test_cuda_graphs_are_left_out_under_fsdp_only():
    from gpt2ladder.ladder import strategy_problem

    assert strategy_problem("cuda_graph", None) is None
    assert "FSDP2" in strategy_problem("cuda_graph", "fsdp")
    assert strategy_problem("cuda_graph", "ddp") is None  # the graph captures DDP's all-reduces
    assert strategy_problem("compile", "fsdp") is None


def test_optimizer_state_layout_round_trip():
    """The name-keyed full state of torch.distributed.checkpoint maps onto optimizer.state_dict() indices."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.AdamW([{"params": [model[0].weight, model[1].weight]},
                             {"params": [model[0].bias, model[1].bias], "weight_decay": 0.0}])
    model(torch.randn(5, 3)).sum().backward()
    opt.step()
    names = distributed._param_names(model, opt)
    assert names == ["0.weight", "1.weight", "0.bias", "1.bias"]
    by_name = distributed._indices_to_names(opt.state_dict(), names)
    assert by_name["param_groups"][1]["params"] == ["0.bias", "1.bias"]
    back = distributed._names_to_indices(by_name)
    assert back["param_groups"] == opt.state_dict()["param_groups"]
    assert back["state"].keys() == opt.state_dict()["state"].keys()
    torch.testing.assert_close(back["state"][3]["exp_avg"], opt.state_dict()["state"][3]["exp_avg"])


def test_fsdp_without_torchrun_is_one_line(shakespeare_cache, tmp_path, monkeypatch, capfd):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert main(["bench", "--strategy", "fsdp", "--device", "cpu", "--out", str(tmp_path)]) == 2
    assert capfd.readouterr().err.strip().splitlines() == [
        "gpt2ladder: error: --strategy fsdp needs several processes: launch with torchrun --nproc_per_node=N "
        "-m gpt2ladder ..."]


# --- bench under torchrun ---------------------------------------------------------------------------


def fake_ladder(world: int, tokens_per_s: dict, **config) -> dict:
    cfg = {"preset": "gpt2", "batch_size": 16, "seq_len": 1024, **config}
    rows = [{"name": n, "status": "ok", "tokens_per_s": t} for n, t in tokens_per_s.items()]
    rows.append({"name": "cuda_graph", "status": "skipped", "reason": "x"})
    return {"command": "bench", "config": cfg, "world_size": world, "strategy": "ddp" if world > 1 else None,
            "global_batch_size": 16 * world, "rungs": rows}


def test_scaling_efficiency_is_per_gpu_throughput_against_the_baseline(tmp_path):
    path = tmp_path / "one.json"
    path.write_text(json.dumps(fake_ladder(1, {"baseline": 100.0, "compile": 300.0})))
    baseline = load_baseline(path, {"preset": "gpt2", "batch_size": 16, "seq_len": 1024})
    record = fake_ladder(4, {"baseline": 380.0, "compile": 1080.0, "flash": 1500.0})
    add_scaling(record, baseline)
    rows = {r["name"]: r for r in record["rungs"]}
    assert rows["baseline"]["tokens_per_s_per_gpu"] == 95.0
    assert rows["baseline"]["scaling_efficiency"] == pytest.approx(0.95)
    assert rows["compile"]["scaling_efficiency"] == pytest.approx(0.90)
    assert "scaling_efficiency" not in rows["flash"]  # not in the baseline: no made-up figure
    assert record["baseline"]["world_size"] == 1
    table = format_scaling(record)
    assert "| compile | 1,080 | 270 | 300 | 90.0% |" in table and "| flash | 1,500 | 375 | - | - |" in table


def test_a_baseline_of_another_step_is_refused(tmp_path):
    path = tmp_path / "one.json"
    path.write_text(json.dumps(fake_ladder(1, {"baseline": 100.0}, batch_size=8)))
    with pytest.raises(UsageError, match="batch_size 8 vs 16"):
        load_baseline(path, {"preset": "gpt2", "batch_size": 16, "seq_len": 1024})
    with pytest.raises(UsageError, match="does not exist"):
        load_baseline(tmp_path / "missing.json", {})
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(UsageError, match="not a readable ladder.json"):
        load_baseline(tmp_path / "bad.json", {})


@pytest.mark.slow
def test_bench_under_torchrun(shakespeare_cache, tmp_path):
    """Every rank runs the rungs, rank 0 alone prints and writes; the global batch is per-GPU x ranks."""
    common = ["--rungs", "baseline", "--batch-size", "2", "--seq-len", "32", "--steps", "2", "--warmup", "1",
              "--device", "cpu", "--no-progress"]
    one = tmp_path / "one.json"  # stands for a one-process ladder.json of the same step
    one.write_text(json.dumps(fake_ladder(1, {"baseline": 1000.0}, preset="tiny", batch_size=2, seq_len=32)))
    two = tmp_path / "two"
    proc = torchrun(["-m", "gpt2ladder", "bench", *common, "--out", str(two), "--baseline-json", str(one)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("gpt2ladder bench:") == 1 and proc.stdout.count("wrote ") == 1
    record = json.loads((two / "ladder.json").read_text())
    assert record["world_size"] == 2 and record["strategy"] == "ddp" and record["global_batch_size"] == 4
    row = record["rungs"][0]
    assert row["tokens_per_s"] == pytest.approx(4 * 32 / (row["ms_per_step"] / 1000))
    assert row["tokens_per_s_per_gpu"] == pytest.approx(row["tokens_per_s"] / 2)
    assert row["scaling_efficiency"] == pytest.approx(row["tokens_per_s_per_gpu"] / 1000.0)
    assert "efficiency" in (two / "ladder.md").read_text()


# --- the train command under torchrun ---------------------------------------------------------------

# A constant learning rate, so a 3-step run resumed to 6 steps follows the 6-step run's schedule.
# 256 tokens per step = micro-batch 2 x 32 x 4 micro-batches on one process, x 2 on each of two.
TRAIN = ["-m", "gpt2ladder", "train", "--device", "cpu", "--preset", "tiny", "--rungs", "baseline",
         "--batch-size", "2", "--seq-len", "32", "--tokens-per-step", "256", "--lr", "1e-3", "--min-lr", "1e-3",
         "--warmup-steps", "0", "--eval-every", "3", "--eval-batches", "2", "--ckpt-every", "3", "--no-progress"]


def one_process(*args: str):
    return subprocess.run([sys.executable, *TRAIN, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def curve(out: Path) -> list[tuple]:
    entries = map(json.loads, (out / "log.jsonl").read_text().splitlines())
    return [(e["step"], e["loss"], e.get("val_loss")) for e in entries]


def assert_same_curve(got: list[tuple], expected: list[tuple]) -> None:
    assert [s for s, _, _ in got] == [s for s, _, _ in expected]
    for (step, loss, val), (_, ref_loss, ref_val) in zip(got, expected):
        assert loss == pytest.approx(ref_loss, rel=1e-4), step
        assert (val is None) == (ref_val is None) and (val is None or val == pytest.approx(ref_val, rel=1e-4)), step


@pytest.fixture(scope="module")
def one_process_run(shakespeare_cache, module_tmp):
    out = module_tmp("train") / "one"
    proc = one_process("--steps", "6", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.slow
def test_two_process_training_follows_the_one_process_curve(one_process_run, tmp_path):
    out = tmp_path / "ddp"
    proc = torchrun([*TRAIN, "--steps", "6", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_curve(curve(out), curve(one_process_run))
    config = json.loads((out / "config.json").read_text())
    assert config["world_size"] == 2 and config["strategy"] == "ddp" and config["grad_accum"] == 2
    assert proc.stdout.count("gpt2ladder train: micro-batch") == 1  # rank 0 alone speaks
    assert "(2 x 32 x 2 micro-batches x 2 processes, ddp)" in proc.stdout


@pytest.mark.slow
def test_a_checkpoint_of_two_fsdp_ranks_resumes_on_one_process(one_process_run, tmp_path):
    out = tmp_path / "fsdp-then-one"
    proc = torchrun([*TRAIN, "--strategy", "fsdp", "--steps", "3", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = one_process("--steps", "6", "--resume", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resuming from step 3" in proc.stdout
    assert_same_curve(curve(out), curve(one_process_run))
    from gpt2ladder.training.checkpoint import load_checkpoint

    resumed, reference = load_checkpoint(out)["model"], load_checkpoint(one_process_run)["model"]
    assert resumed.keys() == reference.keys()
    for name, value in reference.items():
        # AdamW moves a weight by about lr * g / (|g| + eps) a step: where |g| is near eps, summation-order
        # noise in g shows in the weight, up to a few percent of one step (lr = 1e-3) after six steps.
        torch.testing.assert_close(resumed[name], value, rtol=1e-4, atol=5e-5, msg=name)


def test_a_bad_launch_is_one_line_from_rank_zero(shakespeare_cache, tmp_path):
    proc = torchrun([*TRAIN[:-1], "--tokens-per-step", "192", "--steps", "2", "--out", str(tmp_path)])
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if "gpt2ladder: error:" in line]
    assert errors == ["gpt2ladder: error: --tokens-per-step 192 is not a multiple of batch size x seq len x "
                      "processes = 2 x 32 x 2 = 128"]



def test_a_signal_seen_by_one_rank_stops_every_rank():
    """Saving is a collective, so every rank must stop after the same step: whether any rank was asked to stop
    travels in the step's loss all-reduce (train.Trainer._reduced), every rank reads it back with that step,
    and only what was read back decides (train.Trainer._stopping), never a rank's own signal alone."""
    from types import SimpleNamespace

    from gpt2ladder.training.signals import StopSignals
    from gpt2ladder.training.trainer import Trainer

    def peer(asked):
        class Peer(Dist):  # this rank's [loss, asked] averaged with a peer's [3.0, asked]
            def mean(self, value):
                return (value + torch.tensor([3.0, float(asked)])) / 2
        return Peer(0, 0, 2, "gloo")

    def reduced(dist, signum):
        stop = StopSignals()
        stop.signum = signum
        return Trainer._reduced(SimpleNamespace(dist=dist), torch.tensor(1.0), stop).tolist()

    assert reduced(peer(False), 15) == [2.0, 0.5] and reduced(peer(True), None) == [2.0, 0.5]
    assert reduced(peer(True), 15) == [2.0, 1.0] and reduced(peer(False), None) == [2.0, 0.0]
    assert reduced(SINGLE, 15) == [1.0]  # one process: the loss alone, its own signal is all there is

    def stopping(dist, signum, read_back):
        stop = StopSignals()
        stop.signum = signum
        return Trainer._stopping(SimpleNamespace(dist=dist, peer_asked=read_back), stop)

    assert not stopping(peer(False), 15, read_back=False)  # not before the flag is read back on every rank
    assert stopping(peer(False), None, read_back=True) and stopping(SINGLE, 15, read_back=False)
