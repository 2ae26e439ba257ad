"""On-policy core: rollout collection (true final observations, termination vs truncation), minibatches, fit_value."""

import copy
import os
import signal
import time

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from pgcli.algo.policies import CategoricalPolicy, ValueNetwork
from pgcli.algo.rollout import CriticProcess, RolloutCollector, fit_value, minibatches
from pgcli.config import ModelConfig
from pgcli.errors import PgcliError


class Counter(gym.Env):
    """obs = [steps taken in this episode]; reward 1 per step; terminates after `terminate_at` steps."""

    observation_space = gym.spaces.Box(0.0, 100.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, terminate_at: int) -> None:
        self.terminate_at, self.t = terminate_at, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([float(self.t)], np.float32), 1.0, self.t == self.terminate_at, False, {}


def counter_envs() -> SyncVectorEnv:
    """env 0 terminates after 2 steps; env 1 would after 99 but is truncated by a 3-step time limit."""

    def make(terminate_at: int, limit: int):
        return lambda: gym.wrappers.RecordEpisodeStatistics(
            gym.wrappers.TimeLimit(Counter(terminate_at), max_episode_steps=limit)
        )

    return SyncVectorEnv([make(2, 100), make(99, 3)], autoreset_mode=AutoresetMode.SAME_STEP)


class EpisodeLog:
    def __init__(self) -> None:
        self.calls: list[int] = []

    def episodes(self, step, info):
        self.calls.append(step)


def test_collect_keeps_termination_and_truncation_apart_and_bootstraps_from_true_final_obs():
    torch.manual_seed(0)
    collector = RolloutCollector(counter_envs(), n_steps=4, seed=0, device=torch.device("cpu"))
    policy = CategoricalPolicy(1, 2, ModelConfig())
    value_fn = lambda obs: 10.0 * obs[:, 0]  # noqa: E731  V(s) = 10 * steps taken
    log = EpisodeLog()
    batch = collector.collect(policy, value_fn, log, step=100)

    # env 0: 0 1 | 0 1 (terminates at 2); env 1: 0 1 2 | 0 (truncated at 3)
    assert batch.obs[:, :, 0].T.tolist() == [[0, 1, 0, 1], [0, 1, 2, 0]]
    assert batch.terminated.T.tolist() == [[0, 1, 0, 1], [0, 0, 0, 0]]
    assert batch.dones.T.tolist() == [[0, 1, 0, 1], [0, 0, 1, 0]]
    assert batch.rewards.eq(1.0).all()
    assert batch.values.T.tolist() == [[0, 10, 0, 10], [0, 10, 20, 0]]
    # next value after an episode end is V(true final obs) = V(2) or V(3), not V(reset obs) = 0
    assert batch.next_values.T.tolist() == [[10, 20, 10, 20], [10, 20, 30, 10]]
    assert torch.allclose(batch.log_probs, policy.log_prob(batch.obs.flatten(0, 1), batch.actions.flatten()).view(4, 2))
    assert log.calls == [104, 106, 108]  # env steps (N = 2 per vector step) at which episodes ended
    assert batch.n_samples == 8

    # the next rollout continues where this one stopped: env 0 at 0 (just reset), env 1 at 1
    second = collector.collect(policy, value_fn, log, step=108)
    assert second.obs[0, :, 0].tolist() == [0.0, 1.0]


def test_minibatches_cover_every_sample_once_with_a_remainder():
    x, y = torch.arange(10), torch.arange(10) * 2
    batches = list(minibatches(x, y, batch_size=4))
    assert [len(b[0]) for b in batches] == [4, 4, 2]
    assert sorted(torch.cat([b[0] for b in batches]).tolist()) == list(range(10))
    assert all(torch.equal(bx * 2, by) for bx, by in batches)  # rows stay aligned across tensors
    with pytest.raises(ValueError, match="first dimension"):
        next(minibatches(x, torch.zeros(3), batch_size=2))
    with pytest.raises(ValueError, match="batch_size"):
        next(minibatches(x, batch_size=0))


@pytest.mark.parametrize("activation", ["tanh", "relu", "elu"])
def test_mlp_mse_grads_match_autograd(activation):
    torch.manual_seed(0)
    value = ValueNetwork(5, ModelConfig(vf_hidden_sizes=[7, 6], activation=activation))
    obs, returns = torch.randn(33, 5), torch.randn(33)
    loss, grads = value.mse_grads(obs, returns)
    ref = F.mse_loss(value(obs), returns)
    ref_grads = torch.autograd.grad(ref, list(value.parameters()))
    assert torch.allclose(loss, ref)
    for g, r in zip(grads, ref_grads, strict=True):
        assert g.shape == r.shape and torch.allclose(g, r, atol=1e-6)


@pytest.mark.parametrize("activation", ["tanh", "relu", "elu"])  # elu: the autograd fallback
def test_fit_value_takes_the_same_steps_as_backward_and_adam_step(activation):
    torch.manual_seed(0)
    obs, returns = torch.randn(300, 4), torch.randn(300)  # minibatches of 64: the last one holds 44
    model = ModelConfig(activation=activation)
    ref_net, fast_net = ValueNetwork(4, model), ValueNetwork(4, model)
    fast_net.load_state_dict(ref_net.state_dict())
    ref_opt = torch.optim.Adam(ref_net.parameters(), lr=1e-2)
    fast_opt = torch.optim.Adam(fast_net.parameters(), lr=1e-2)

    torch.manual_seed(1)  # the same minibatch permutations for both
    ref_losses = []
    for _ in range(3):
        for mb_obs, mb_returns in minibatches(obs, returns, batch_size=64):
            loss = F.mse_loss(ref_net(mb_obs), mb_returns)
            ref_opt.zero_grad()
            loss.backward()
            ref_opt.step()
            ref_losses.append(loss.item())
    torch.manual_seed(1)
    mean_loss = fit_value(fast_net, fast_opt, obs, returns, n_epochs=3, batch_size=64)

    assert mean_loss == pytest.approx(np.mean(ref_losses), rel=1e-5)
    for p, q in zip(ref_net.parameters(), fast_net.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)
    ref_state, fast_state = ref_opt.state_dict(), fast_opt.state_dict()
    assert fast_state["state"][0]["step"].item() == ref_state["state"][0]["step"].item() == 15
    torch.optim.Adam(ValueNetwork(4, ModelConfig()).parameters()).load_state_dict(fast_state)  # standard layout


def test_fit_value_rejects_an_optimizer_it_cannot_reproduce():
    value = ValueNetwork(4, ModelConfig())
    with pytest.raises(ValueError, match="plain Adam"):
        fit_value(
            value,
            torch.optim.Adam(value.parameters(), weight_decay=0.1),
            torch.zeros(4, 4),
            torch.zeros(4),
            n_epochs=1,
            batch_size=2,
        )


def test_critic_process_fits_exactly_as_fit_value_in_process():
    torch.manual_seed(0)
    value = ValueNetwork(5, ModelConfig(vf_hidden_sizes=[16, 16]))
    optimizer = torch.optim.Adam(value.critic_parameters(), lr=3e-3)
    remote_value = copy.deepcopy(value)
    remote_optimizer = torch.optim.Adam(remote_value.critic_parameters(), lr=3e-3)
    process = CriticProcess(remote_value, remote_optimizer)
    try:
        deadline = time.monotonic() + 120
        while not process.ready():  # started: the trainer submits from now on (before: fits in process)
            assert time.monotonic() < deadline
            time.sleep(0.05)  # polling interval
        for lr in (3e-3, 3e-3, 1e-3):  # the first fit creates Adam's state on both sides; a scheduled step size
            for opt in (optimizer, remote_optimizer):
                opt.param_groups[0]["lr"] = lr
            obs, returns = torch.randn(300, 5), torch.randn(300)
            rng = torch.get_rng_state()
            loss = fit_value(value, optimizer, obs, returns, n_epochs=3, batch_size=64)  # draws 3 permutations
            after = torch.get_rng_state()
            torch.set_rng_state(rng)
            process.submit(remote_value, remote_optimizer, obs, returns, n_epochs=3, batch_size=64)
            assert process.result(remote_value, remote_optimizer) == loss
            assert torch.equal(torch.get_rng_state(), after)  # the RNG moved on as the in-process fit moved it
            for p, q in zip(value.critic_parameters(), remote_value.critic_parameters(), strict=True):
                assert torch.equal(p, q)
                for key in ("step", "exp_avg", "exp_avg_sq"):
                    assert torch.equal(optimizer.state[p][key], remote_optimizer.state[q][key]), key
        # drawing from the RNG while the process fits would change the run: refused
        process.submit(remote_value, remote_optimizer, obs, returns, n_epochs=1, batch_size=64)
        torch.rand(1)
        with pytest.raises(RuntimeError, match="RNG"):
            process.result(remote_value, remote_optimizer)
    finally:
        process.close()


def test_a_dead_critic_process_is_a_one_line_error():
    value = ValueNetwork(3, ModelConfig(vf_hidden_sizes=[8]))
    optimizer = torch.optim.Adam(value.critic_parameters(), lr=1e-3)
    process = CriticProcess(value, optimizer)
    os.kill(process._process.pid, signal.SIGKILL)
    process._process.join(timeout=30)
    with pytest.raises(PgcliError) as err:
        process.submit(value, optimizer, torch.randn(10, 3), torch.randn(10), n_epochs=1, batch_size=4)
        process.result(value, optimizer)
    assert "\n" not in str(err.value) and "critic process" in str(err.value) and "died" in str(err.value)
    process.close()
