"""Data-parallel text training (pgcli.hardware.distributed; docs/distributed.md): one update on a fixed batch split
over 2 gloo ranks moves the parameters as one process does on the whole batch (GRPO, SFT, the reward model, PPO's
policy and value network), and the metrics reduced over the ranks are the whole batch's; the per-rank seeds; the
config's rules for hardware.processes.

Tolerance: atol 1e-6, rtol 1e-5 on every parameter and metric (float32 summation order: the ranks sum their shares
of the batch's loss in another order than one pass over the batch). The optimiser is SGD, as in test_lm_sft's
micro-batch test: Adam's first step is about lr * sign(g), and a gradient that is float noise around an exact 0 would
flip its sign with the summation order.
"""

from __future__ import annotations

import math
import os
import socket
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from test_lm_trainers import CONFIGS, CPU, Sampling, make_policy, make_task, starts_low

from pgcli.algo.lm_agent import LMAgentGRPO
from pgcli.algo.lm_base import kl_reference
from pgcli.algo.lm_grpo import LMGRPO
from pgcli.algo.lm_ppo import LMPPO
from pgcli.algo.lm_rollout import CompletionBatch, sample_completions
from pgcli.algo.reward_model import RewardModelTrainer
from pgcli.algo.sft import SFT
from pgcli.config import CountdownToolEnvConfig, FlowGRPOConfig, GRPOConfig, LMModelConfig, RMConfig, SFTConfig
from pgcli.config.compose import compose_train_config
from pgcli.errors import ConfigError
from pgcli.hardware import distributed
from pgcli.lm.load import make_text_policy, make_text_task
from pgcli.lm.pairs import Pair, PairGenerator

ATOL, RTOL = 1e-6, 1e-5
WORLD = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def grpo_trainer(loss_agg: str) -> LMGRPO:
    task = make_task(starts_low)
    cfg = CONFIGS["grpo"](batch_size=16, loss_agg=loss_agg, beta=0.04)  # B = 4 groups x 4 = one minibatch
    policy = make_policy(task)
    trainer = LMGRPO(
        cfg, task=task, policy=policy, reference=kl_reference(cfg, policy, None), model=Sampling(), seed=0, device=CPU
    )
    trainer.optimizer = torch.optim.SGD(trainer.policy.parameters(), lr=0.5)
    return trainer


def ppo_trainer() -> LMPPO:
    """PPO with the value network, whitened advantages and value clipping (the defaults); two epochs on the one
    minibatch of 16, so that the second moves the value network's trunk (its head starts at zero)."""
    task = make_task(starts_low)
    cfg = CONFIGS["ppo_lm"](batch_size=16, n_iterations=2, beta=0.04)
    assert cfg.normalize_advantage and cfg.clip_range_vf is not None
    policy = make_policy(task)
    trainer = LMPPO(
        cfg, task=task, policy=policy, reference=kl_reference(cfg, policy, None), model=Sampling(), seed=0, device=CPU
    )
    trainer.optimizer = torch.optim.SGD(trainer.policy.parameters(), lr=0.5)
    trainer.vf_optimizer = torch.optim.SGD(trainer.value.parameters(), lr=0.5)
    return trainer


def fixed_batch() -> CompletionBatch:
    """16 completions (4 prompts x 4) of the untrained policy, sampled once in this process."""
    trainer = grpo_trainer("token_mean")
    problems = trainer.task.sample(trainer.prompt_rng, 4)
    generator = torch.Generator().manual_seed(1)
    return sample_completions(
        trainer.task,
        trainer.policy,
        problems,
        group_size=4,
        temperature=1.0,
        top_p=1.0,
        generator=generator,
        device=CPU,
    )


def agent_trainer(algo: str) -> LMAgentGRPO:
    """Flow-GRPO or whole-trajectory GRPO on countdown with a calculator: 4 questions x 2 trajectories, every turn in
    the one minibatch (batch_size 64 > 4 turns x 8 trajectories)."""
    task = make_text_task(CountdownToolEnvConfig(n_eval=16), LMModelConfig())
    torch.manual_seed(0)
    policy = make_text_policy(task, LMModelConfig(d_model=32, d_ff=64, n_layers=1), CPU)
    kw = {"group_size": 2, "n_groups": 4, "beta": 0.04}
    cfg = FlowGRPOConfig(**kw, batch_size=64) if algo == "flow_grpo" else GRPOConfig(**kw, batch_size=8)
    cfg.batch_size = 64  # GRPOConfig caps it at the trajectories (8), its rule for episodes: one minibatch here too
    trainer = LMAgentGRPO(
        cfg, task=task, policy=policy, reference=kl_reference(cfg, policy, None), model=Sampling(), seed=0, device=CPU
    )
    trainer.optimizer = torch.optim.SGD(trainer.policy.parameters(), lr=0.5)
    return trainer


def fixed_turns() -> CompletionBatch:
    """The turns of 8 trajectories (4 questions x 2) the untrained policy played, sampled once in this process. It
    solves none and plays every turn there is, so the batch is made uneven: trajectories 0, 3 and 6 are marked solved
    (the update reads only the rewards), which leaves questions 0, 1 and 3 with a reward that varies, and
    trajectories 4 and 5 keep their first turn alone, so that the ranks hold different numbers of turns."""
    batch, _ = agent_trainer("flow_grpo")._sample()
    assert batch.trajectory is not None
    seen: set[int] = set()
    keep = []
    for i, t in enumerate(batch.trajectory.tolist()):
        keep.append(i) if t not in (4, 5) or t not in seen else None
        seen.add(t)
    rows = torch.tensor(keep)
    fields = {
        name: value[rows] if isinstance(value, torch.Tensor) and value.shape[:1] == batch.rewards.shape else value
        for name, value in batch._asdict().items()
    }
    solved = fields["trajectory"] % 3 == 0
    fields |= {"rewards": solved.float(), "correct": solved, "reward_parts": {}}  # a plain dict: saved to a file
    return CompletionBatch(**fields)


def turns_share(batch: CompletionBatch, rank: int) -> CompletionBatch:
    """Rank ``rank``'s questions of ``batch`` (2 of 4: the turns of their trajectories), group and trajectory ids
    from 0."""
    assert batch.trajectory is not None
    rows = ((batch.group_ids >= 2 * rank) & (batch.group_ids < 2 * rank + 2)).nonzero().squeeze(1)
    fields = {
        name: value[rows] if isinstance(value, torch.Tensor) and value.shape[:1] == batch.rewards.shape else value
        for name, value in batch._asdict().items()
    }
    fields["group_ids"] = batch.group_ids[rows] - 2 * rank
    fields["trajectory"] = batch.trajectory[rows] - 4 * rank
    return CompletionBatch(**fields)


def rank_share(batch: CompletionBatch, rank: int) -> CompletionBatch:
    """Rank ``rank``'s whole groups of ``batch`` (half of it), its group and prompt ids from 0."""
    rows = torch.arange(rank * 8, (rank + 1) * 8)
    fields = {
        name: value[rows] if isinstance(value, torch.Tensor) and value.shape[:1] == (16,) else value
        for name, value in batch._asdict().items()
    }
    fields["group_ids"] = batch.group_ids[rows] - 2 * rank
    fields["prompt_ids"] = None if batch.prompt_ids is None else batch.prompt_ids[rows] - 2 * rank
    return CompletionBatch(**fields)


def sft_trainer() -> SFT:
    task = make_task()
    sft = SFT(
        SFTConfig(batch_size=16, warmup_steps=0),
        task=task,
        policy=make_policy(task),
        reference=None,
        model=LMModelConfig(micro_batch=0),
        seed=0,
        device=CPU,
    )
    sft.optimizer = torch.optim.SGD(sft.policy.parameters(), lr=0.5)
    return sft


def sft_batches(sft: SFT) -> list[tuple[torch.Tensor, ...]]:
    """Two fixed batches of 16 demonstrations (sums of two-digit numbers: answers of 2 or 3 digits)."""
    return [sft._batch() for _ in range(2)]


def rm_trainer(micro_batch: int) -> RewardModelTrainer:
    task = make_task()
    rm = RewardModelTrainer(
        RMConfig(batch_size=16),
        task=task,
        policy=make_policy(task),
        reference=None,
        model=LMModelConfig(micro_batch=micro_batch),
        seed=0,
        device=CPU,
    )
    rm.optimizer = torch.optim.SGD(rm.reward_model.parameters(), lr=0.5)
    return rm


def rm_batches() -> list[list[Pair]]:
    """Two fixed batches of 16 checker pairs: the first step moves the head alone (it starts at zero), the second
    the backbone too."""
    pairs = PairGenerator(make_task(), "checker")
    rng = np.random.default_rng(0)
    return [pairs.sample(rng, 16) for _ in range(2)]


def _params(*modules: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for m in modules for p in m.parameters()]


Stats = list[tuple[dict[str, float], dict[str, float]]]
"""Each update's metrics on this rank, and their weights in the mean over the ranks."""


def _train(kind: str, variant: str, rank: int, data: Path) -> tuple[list[torch.Tensor], Stats]:
    """The update(s) of ``kind`` on rank ``rank``'s share of the fixed data (all of it in one process); ``variant``:
    GRPO's ``loss_agg``, the reward model's ``micro_batch``, the multi-turn trainer's algo."""
    world = distributed.world_size() if distributed.active() else 1
    if kind == "agent":
        agent = agent_trainer(variant)
        batch = torch.load(data, weights_only=False)
        share = batch if world == 1 else turns_share(batch, rank)
        stats = agent._update(share)
        # minibatches of 8 turns: as many on each rank as one process has (2 ranks' collectives must line up)
        agent.cfg.batch_size = 8
        stats["minibatches_of_8"] = len(agent._minibatches(torch.arange(len(share.rewards))))
        return _params(agent.policy), [(stats, agent._stat_weights(share))]
    if kind in ("grpo", "ppo"):
        trainer = grpo_trainer(variant) if kind == "grpo" else ppo_trainer()
        batch = torch.load(data, weights_only=False)
        stats = trainer._update(batch if world == 1 else rank_share(batch, rank))
        value = [trainer.value] if isinstance(trainer, LMPPO) else []
        return _params(trainer.policy, *value), [(stats, {})]
    if kind == "rm":
        rm = rm_trainer(int(variant))
        out = [
            rm._train_on(pairs if world == 1 else pairs[rank * 8 : (rank + 1) * 8])
            for pairs in torch.load(data, weights_only=False)
        ]
        return _params(rm.reward_model), [(stats, {}) for stats in out]
    sft = sft_trainer()
    batches = torch.load(data, weights_only=False)
    out = []
    for whole in batches:
        share = whole if world == 1 else tuple(t[rank * 8 : (rank + 1) * 8] for t in whole)
        sft._batch = lambda share=share: share  # type: ignore[method-assign]
        out.append((sft._step(), {}))
    return _params(sft.policy), out


def _rank_main(rank: int, port: int, cases: list[tuple[str, str, Path]], out: Path) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD))
    torch.set_num_threads(1)
    distributed.init(CPU, timeout_s=60)
    try:
        for i, (kind, variant, data) in enumerate(cases):
            params, stats = _train(kind, variant, rank, data)
            reduced = [distributed.mean_stats(s, weights) for s, weights in stats]
            torch.save({"params": params, "stats": reduced}, out / f"{i}.rank{rank}.pt")
    finally:
        distributed.teardown()


CASES = [*(("grpo", agg) for agg in ("token_mean", "seq_mean", "constant")), ("sft", ""), ("rm", "0"), ("rm", "3")]
CASES += [("ppo", ""), ("agent", "flow_grpo"), ("agent", "grpo")]
"""Every (kind, variant) the tests below split over two ranks."""


def fixed_data(kind: str) -> object:
    """The fixed data ``kind`` trains on (made in this process, saved for the ranks)."""
    if kind in ("grpo", "ppo"):
        return fixed_batch()
    if kind == "sft":
        return sft_batches(sft_trainer())
    return rm_batches() if kind == "rm" else fixed_turns()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], tuple[Path, list[dict]]]:
    """(kind, variant) -> its fixed data's file and what each of the two ranks got: every case in one spawn of the
    two ranks (each rank's start imports torch and pgcli, seconds of CPU; the cases follow one another in them)."""
    out = tmp_path_factory.mktemp("ranks")
    data = {kind: out / f"{kind}.pt" for kind, _ in CASES}
    for kind, path in data.items():
        torch.save(fixed_data(kind), path)
    mp.spawn(_rank_main, args=(free_port(), [(k, v, data[k]) for k, v in CASES], out), nprocs=WORLD, join=True)
    ranks = [[torch.load(out / f"{i}.rank{r}.pt", weights_only=False) for r in range(WORLD)] for i in range(len(CASES))]
    return {case: (data[case[0]], got) for case, got in zip(CASES, ranks, strict=True)}


def assert_same(got: dict, params: list[torch.Tensor], stats: Stats) -> None:
    for a, b in zip(params, got["params"], strict=True):
        torch.testing.assert_close(b, a, atol=ATOL, rtol=RTOL)
    for (expected, _), reduced in zip(stats, got["stats"], strict=True):
        assert set(reduced) == set(expected)
        for key, value in expected.items():
            assert reduced[key] == pytest.approx(value, rel=RTOL, abs=ATOL, nan_ok=True), key


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean", "constant"])
def test_a_grpo_update_split_over_two_ranks_is_the_one_process_update(loss_agg: str, two_ranks: dict):
    data, ranks = two_ranks["grpo", loss_agg]
    params, stats = _train("grpo", loss_agg, 0, data)
    moved = [p.detach() for p in grpo_trainer(loss_agg).policy.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(params, moved, strict=True))  # the update moved the policy
    for got in ranks:
        assert_same(got, params, stats)


def test_sft_steps_split_over_two_ranks_are_the_one_process_steps(two_ranks: dict):
    data, ranks = two_ranks["sft", ""]
    batches = torch.load(data, weights_only=False)
    # the halves' trained tokens differ: a mean of the ranks' own token means would not be the batch's mean
    assert any(int(b[4][:8].sum()) != int(b[4][8:].sum()) for b in batches)
    params, stats = _train("sft", "", 0, data)
    for got in ranks:
        assert_same(got, params, stats)


@pytest.mark.parametrize("micro_batch", [0, 3])
def test_reward_model_steps_split_over_two_ranks_are_the_one_process_steps(micro_batch: int, two_ranks: dict):
    data, ranks = two_ranks["rm", str(micro_batch)]
    params, stats = _train("rm", str(micro_batch), 0, data)
    start = _params(rm_trainer(micro_batch).reward_model)
    assert not torch.equal(params[-1], start[-1])  # the head (its one weight) moved
    assert any(not torch.equal(a, b) for a, b in zip(params[:-1], start[:-1], strict=True))  # and the backbone
    for got in ranks:
        assert_same(got, params, stats)


def test_a_ppo_update_split_over_two_ranks_is_the_one_process_update(two_ranks: dict):
    data, ranks = two_ranks["ppo", ""]
    batch = torch.load(data, weights_only=False)
    assert batch.rewards[:8].mean() != batch.rewards[8:].mean()  # whitening each rank's own share would differ
    params, stats = _train("ppo", "", 0, data)
    fresh = ppo_trainer()
    n_policy = len(list(fresh.policy.parameters()))
    start = _params(fresh.policy, fresh.value)
    moved = [not torch.equal(a, b) for a, b in zip(params, start, strict=True)]
    assert any(moved[:n_policy]) and all(moved[-2:]) and any(moved[n_policy:-2])  # policy, value head, value trunk
    for got in ranks:
        assert_same(got, params, stats)


@pytest.mark.parametrize("algo", ["flow_grpo", "grpo"])
def test_a_multi_turn_update_split_over_two_ranks_is_the_one_process_update(algo: str, two_ranks: dict):
    data, ranks = two_ranks["agent", algo]
    batch = torch.load(data, weights_only=False)
    turns = [len(turns_share(batch, rank).rewards) for rank in range(WORLD)]
    assert turns[0] != turns[1]  # the ranks hold different numbers of turns
    params, stats = _train("agent", algo, 0, data)
    assert 0.0 < stats[0][0]["rollout/truncated_frac"] < 1.0  # a per-turn metric: weighted by each rank's turns
    assert stats[0][0]["minibatches_of_8"] == math.ceil(sum(turns) / 8) > math.ceil(min(turns) / 8)
    start = _params(agent_trainer(algo).policy)
    assert any(not torch.equal(a, b) for a, b in zip(params, start, strict=True))
    for got in ranks:
        assert_same(got, params, stats)


def test_rank_seeds_are_distinct_and_rank_0_keeps_the_run_seed():
    seeds = distributed.rank_seeds(7, 4)
    assert seeds[0] == 7 and len(set(seeds)) == 4
    assert distributed.rank_seeds(7, 4) == seeds  # recorded: the same run gets the same seeds
    assert distributed.rank_seeds(8, 4)[1:] != seeds[1:]


def test_one_process_helpers_are_the_identity():
    stats = {"train/loss": 1.5}
    assert distributed.mean_stats(stats) == stats and distributed.sum_stats(stats) == stats
    assert distributed.local_size(8, "algo.batch_size") == 8


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["algo=grpo", "env=addition", "algo.n_groups=3", "algo.batch_size=8"],
            "algo.n_groups must be a multiple of hardware.processes=2",
        ),
        (["algo=sft", "env=addition", "algo.batch_size=9"], "algo.batch_size must be a multiple of hardware.processes"),
        (["algo=ppo", "env=cartpole"], "trains text tasks"),
        (["algo=grpo", "env=addition", "algo.drop_degenerate_groups=true"], "algo.drop_degenerate_groups must be"),
        (["algo=sft", "env=countdown_tool"], "algo=sft on a multi-turn task trains in one process"),
        (["algo=flow_grpo", "env=countdown_tool", "algo.n_groups=5"], "algo.n_groups must be a multiple of"),
        (["algo=sft", "env=addition", "n_seeds=2"], "n_seeds must be 1 with hardware.processes=2"),
    ],
)
def test_sizes_that_do_not_divide_over_the_processes_are_one_line(overrides: list[str], message: str):
    with pytest.raises(ConfigError, match=message):
        compose_train_config([*overrides, "hardware.processes=2"])


@pytest.mark.parametrize("algo", ["flow_grpo", "grpo"])
def test_the_multi_turn_rl_trainers_train_on_several_processes(algo: str):
    cfg = compose_train_config([f"algo={algo}", "env=countdown_tool", "algo.batch_size=8", "hardware.processes=2"])
    assert cfg.hardware.processes == 2 and cfg.env_kind == "multi-turn"
