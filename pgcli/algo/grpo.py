"""Group Relative Policy Optimization (Shao et al., 2024, "DeepSeekMath", section 4.1) for episodic control.

GRPO drops the critic. For each "prompt" it samples a group of G outputs from the old policy, scores them, and uses
the group-normalised score as the advantage of every token inside a PPO-style clipped objective. On a gymnasium task
a prompt is an initial state: the G members of a group reset with the same seed (identical first observation) and
then act stochastically until termination or the time limit. One update uses M groups (E = M * G episodes):

    J(theta) = agg_{i,t} [ min(r_{i,t} A_{i,t}, clip(r_{i,t}, 1 - eps, 1 + eps_high) A_{i,t})
                           - beta * k3(pi_theta, pi_ref)_{i,t} + c_ent * H(pi_theta(.|s_{i,t})) ]
    r_{i,t} = pi_theta(a_{i,t}|s_{i,t}) / pi_old(a_{i,t}|s_{i,t}),   k3 = pi_ref/pi_theta - log(pi_ref/pi_theta) - 1

with A from `group_normalized_advantages` (`advantage`: outcome / process / step_baseline; `scale_rewards`: group /
batch / none), `agg` from `LOSS_AGGREGATIONS` (`loss_agg`: seq_mean = GRPO's (1/G) sum_i (1/|o_i|) sum_t,
token_mean = DAPO, constant = Dr. GRPO), eps_high = DAPO's clip-higher, maximised for `n_iterations` (mu) epochs of
minibatches of episodes. The math lives in `pgcli.ops.grpo`; this file collects groups and runs the update.

Group collection (`collect_groups`). The E members of a batch are jobs handed to the N sub-envs of the vector env
in group order, so the members of a group run side by side when N >= G. A sub-env whose member's episode ends
(terminated or truncated) starts the next unplayed member at once: a partial reset of that sub-env alone with the
member's group seed (``options={"reset_mask": ...}``), which overrides the same-step autoreset. Only when no member
is left does a sub-env idle until the batch is complete; the vector env still steps it, so those steps count
towards the budget (``steps`` = vector steps * N, every env step actually taken) and are discarded. Waiting for a
whole group (instead of refilling) would waste every step between a member's end and its group's longest episode;
`train/collect_efficiency` reports the share of env steps that landed in a member's episode. No episode is cut
short: every member plays to its end, so all members of a group come from the same policy and the same start.
"""

from __future__ import annotations

import copy
from typing import Any, NamedTuple

import numpy as np
import torch
from gymnasium.vector import VectorEnv
from torch import Tensor

from pgcli.algo.checkpoint import Restored, Stateful
from pgcli.algo.control_base import ControlTrainer
from pgcli.algo.guard import check_finite
from pgcli.algo.policies import Policy, make_policy, obs_tensor
from pgcli.config import GRPOConfig, ModelConfig
from pgcli.config.pixels import CNNModelConfig
from pgcli.contracts import Monitor
from pgcli.ops.aggregate import LOSS_AGGREGATIONS
from pgcli.ops.grpo import clip_bounds, clip_fractions, group_normalized_advantages, grpo_clipped_objective, k3_kl

STD_EPS = 1e-4
"""Added to the std before dividing the advantages (TRL's value)."""


class EpisodeBatch(NamedTuple):
    """The E = M * G episodes of one update, padded to the longest (L steps); member e belongs to group e // G."""

    obs: Tensor
    """[E, L, D] observations, or [E, L, C, H, W] uint8 frames (padding repeats the episode's last observation:
    finite, never evaluated)."""
    actions: Tensor
    """[E, L] (discrete) or [E, L, A] sampled, unclipped actions."""
    rewards: Tensor
    """[E, L] rewards as the env gives them (normalised when env.normalize_reward)."""
    mask: Tensor
    """[E, L] 1.0 on real steps, 0.0 on padding."""
    group_ids: Tensor
    """[E] long, 0..M-1."""
    returns: list[float]
    """Raw (unnormalised) undiscounted return of each episode."""
    lengths: list[int]
    """Length of each episode."""
    env_steps: int
    """Env steps taken to collect the batch: vector steps * N, idle sub-envs included."""


@torch.no_grad()
def collect_groups(
    env: VectorEnv, policy: Policy, *, group_seeds: list[int], group_size: int, device: torch.device
) -> EpisodeBatch:
    """Play G = `group_size` complete episodes from each initial state ``reset(seed=s)``, s in `group_seeds`.

    See the module docstring for how members are scheduled on the sub-envs. The env's state on entry is ignored:
    every sub-env starts with a reset.

    Args:
        env: a same-step-autoreset vector env (pgcli.envs.make.make_vec_env).
        policy: samples the actions (`Policy.sample`) and converts them for the env (`Policy.to_env`).
        group_seeds: M reset seeds, one per group.
        group_size: G >= 1 members per group.
        device: where the returned tensors live.
    """
    schedule = _Schedule([s for s in group_seeds for _ in range(group_size)], env.num_envs)  # e plays group e // G
    # Sync/AsyncVectorEnv take one seed per sub-env (VectorEnv's annotation says int)
    obs, _ = env.reset(seed=schedule.seeds(schedule.playing >= 0))  # type: ignore[arg-type]
    obs_steps, action_steps, reward_steps = [], [], []  # one [N, ...] entry per vector step
    while schedule.n_done < schedule.n_members:
        actions = policy.sample(obs_tensor(obs, device, policy.obs_dtype))  # [N] or [N, A]
        obs_steps.append(obs)
        action_steps.append(actions)
        obs, rewards, terminated, truncated, info = env.step(policy.to_env(actions))
        reward_steps.append(rewards)
        restart = schedule.end_episodes(terminated | truncated, info, t=len(reward_steps))
        if restart.any():  # overrides the same-step autoreset of these sub-envs
            obs, _ = env.reset(seed=schedule.seeds(restart), options={"reset_mask": restart})  # type: ignore[arg-type]
    group_ids = torch.arange(len(group_seeds), device=device).repeat_interleave(group_size)  # [E]
    return _episode_batch(
        schedule, obs_steps, action_steps, reward_steps, group_ids=group_ids, obs_dtype=policy.obs_dtype, device=device
    )


class _Schedule:
    """Which member each sub-env plays, and where each member's episode lies in the record of vector steps."""

    def __init__(self, member_seeds: list[int], n_envs: int) -> None:
        self.member_seeds, self.n_members = member_seeds, len(member_seeds)
        self.playing = np.full(n_envs, -1)  # member on each sub-env; -1: idle (stepped, discarded)
        self.first_step = np.zeros(self.n_members, dtype=np.int64)  # vector step at which the member's episode starts
        self.env_index = np.zeros(self.n_members, dtype=np.int64)
        self.lengths = np.zeros(self.n_members, dtype=np.int64)
        self.returns = np.zeros(self.n_members)
        self.n_started = min(n_envs, self.n_members)
        self.n_done = 0
        self.playing[: self.n_started] = self.env_index[: self.n_started] = np.arange(self.n_started)

    def seeds(self, where: np.ndarray) -> list[int | None]:
        """Reset seeds per sub-env: the group seed of its member where ``where`` [N] (bool) is set, else None."""
        return [self.member_seeds[m] if w else None for m, w in zip(self.playing, where, strict=True)]

    def end_episodes(self, ended: np.ndarray, info: dict[str, Any], *, t: int) -> np.ndarray:
        """Record the episodes that ended (``ended`` [N] bool: terminated or truncated) with vector step ``t`` and
        hand each such sub-env the next unplayed member (or idle it); the sub-envs to reset: [N] bool."""
        restart = np.zeros(len(self.playing), dtype=bool)
        for i in np.flatnonzero(ended & (self.playing >= 0)):
            member = self.playing[i]
            self.lengths[member] = t - self.first_step[member]
            self.returns[member] = float(info["final_info"]["episode"]["r"][i])  # raw, from RecordEpisodeStatistics
            self.n_done += 1
            if self.n_started < self.n_members:  # hand this sub-env the next member
                self.playing[i], self.first_step[self.n_started], self.env_index[self.n_started] = self.n_started, t, i
                restart[i] = True
                self.n_started += 1
            else:
                self.playing[i] = -1
        return restart


def _episode_batch(
    schedule: _Schedule,
    obs_steps: list[np.ndarray],
    action_steps: list[Tensor],
    reward_steps: list[np.ndarray],
    *,
    group_ids: Tensor,
    obs_dtype: torch.dtype,
    device: torch.device,
) -> EpisodeBatch:
    """Gather each member's steps from its sub-env's column of the T recorded vector steps: [T, N, ...] ->
    [E, L, ...], padded by repeating the last real step (finite values; `evaluate_steps` skips it, every sum
    masks it)."""
    lengths_t = torch.as_tensor(schedule.lengths, device=device)
    offsets = torch.arange(int(schedule.lengths.max()), device=device)  # [L]
    last = torch.minimum(offsets[None, :], lengths_t[:, None] - 1)  # [E, L]
    step_idx = torch.as_tensor(schedule.first_step, device=device)[:, None] + last  # [E, L]
    env_idx = torch.as_tensor(schedule.env_index, device=device)[:, None].expand_as(step_idx)  # [E, L]
    obs_all = torch.as_tensor(np.stack(obs_steps), dtype=obs_dtype, device=device)  # [T, N, D] or [T, N, C, H, W]
    rewards_all = torch.as_tensor(np.stack(reward_steps), dtype=torch.float32, device=device)  # [T, N]
    return EpisodeBatch(
        obs=obs_all[step_idx, env_idx],
        actions=torch.stack(action_steps)[step_idx, env_idx],
        rewards=rewards_all[step_idx, env_idx],
        mask=(offsets[None, :] < lengths_t[:, None]).float(),
        group_ids=group_ids,
        returns=schedule.returns.tolist(),
        lengths=schedule.lengths.tolist(),
        env_steps=len(reward_steps) * len(schedule.playing),
    )


class GRPOLoss(NamedTuple):
    """One minibatch's loss terms (summed by the update) and diagnostics."""

    loss_policy: Tensor
    """-agg(min(r A, clip(r) A))."""
    loss_kl: Tensor
    """beta * agg(k3(pi, pi_ref)); 0 when beta = 0."""
    loss_entropy: Tensor
    """-ent_coef * agg(entropy)."""
    kl_ref: float
    """Mean k3 KL to the reference over real steps (nan when beta = 0: no reference pass)."""
    entropy: float
    """Mean policy entropy over real steps."""
    clip_frac_low: float
    """Share of real steps clipped at 1 - eps (A < 0)."""
    clip_frac_high: float
    """Share of real steps clipped at 1 + eps_high (A > 0)."""


def evaluate_steps(policy: Policy, obs: Tensor, actions: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """log pi(a|s) and the entropy of pi(.|s) on the real steps of padded episodes: two [B, L], 0.0 on padding.

    Only the real steps go through the network: early in training padding is over half of a CartPole batch.

    Args:
        policy: the policy to evaluate.
        obs: [B, L, D] observations (or [B, L, C, H, W] frames).
        actions: [B, L] or [B, L, A] actions.
        mask: [B, L] 1.0 on real steps.
    """
    real = mask.bool()
    params = policy.dist_params(obs[real])  # [n_real, D] in
    logp, entropy = torch.zeros_like(mask), torch.zeros_like(mask)
    logp[real] = policy.log_prob_of(params, actions[real])
    entropy[real] = policy.entropy_of(params)
    return logp, entropy


def grpo_loss(
    policy: Policy,
    cfg: GRPOConfig,
    *,
    obs: Tensor,
    actions: Tensor,
    old_logp: Tensor,
    ref_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    max_len: int,
) -> GRPOLoss:
    """The GRPO loss on a minibatch of B episodes: obs [B, L, D], actions [B, L(, A)], the rest [B, L]."""
    logp, entropy = evaluate_steps(policy, obs, actions, mask)  # [B, L] each
    ratio = torch.exp(logp - old_logp)  # 1.0 on padding: both log-probabilities are 0 there
    low, high = clip_bounds(cfg.epsilon, cfg.epsilon_high)
    aggregate = LOSS_AGGREGATIONS[cfg.loss_agg]
    objective = grpo_clipped_objective(ratio, advantages, low, high)  # [B, L]
    clip_low, clip_high = clip_fractions(ratio, advantages, low, high, mask)
    n_real = mask.sum()
    loss_kl, kl_ref = torch.zeros((), device=mask.device), float("nan")
    if ref_logp is not None:  # beta > 0 (DeepSeekMath eq. 3: the KL sits inside the per-step sum)
        kl = k3_kl(logp, ref_logp)  # [B, L]
        loss_kl = cfg.beta * aggregate(kl, mask, max_len=max_len)
        kl_ref = float((kl.detach() * mask).sum() / n_real)
    return GRPOLoss(
        loss_policy=-aggregate(objective, mask, max_len=max_len),
        loss_kl=loss_kl,
        loss_entropy=-cfg.ent_coef * aggregate(entropy, mask, max_len=max_len),
        kl_ref=kl_ref,
        entropy=float((entropy.detach() * mask).sum() / n_real),
        clip_frac_low=clip_low,
        clip_frac_high=clip_high,
    )


class GRPO(ControlTrainer[GRPOConfig]):
    """Critic-free GRPO trainer: collect M groups of G episodes, group-normalise, clipped policy epochs."""

    def __init__(
        self, cfg: GRPOConfig, *, env: VectorEnv, model: ModelConfig | CNNModelConfig, seed: int, device: torch.device
    ) -> None:
        self.cfg, self.env, self.device = cfg, env, device
        self.policy = make_policy(env.single_observation_space, env.single_action_space, model).to(device)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=cfg.learning_rate)
        # pi_ref = the initial policy (DeepSeekMath: the SFT model); none at all when beta = 0 (TRL does the same)
        self.ref_policy: Policy | None = copy.deepcopy(self.policy) if cfg.beta > 0 else None
        self.seed_rng = np.random.default_rng(seed)  # initial-state seeds of the groups
        spec = env.unwrapped.get_attr("spec")[0]  # type: ignore[attr-defined]  # Sync/AsyncVectorEnv
        self.time_limit: int | None = spec.max_episode_steps if spec is not None else None
        self.steps = 0
        self.n_updates = 0

    def learn(self, total_steps: int, monitor: Monitor) -> int:
        while self.steps < total_steps:
            # 1. collect M groups of G episodes with the old policy
            seeds = self.seed_rng.integers(0, 2**31 - 1, size=self.cfg.n_groups).tolist()
            batch = collect_groups(
                self.env, self.policy, group_seeds=seeds, group_size=self.cfg.group_size, device=self.device
            )
            self.steps += batch.env_steps
            check_finite(monitor, self.steps, observation=batch.obs, reward=batch.rewards)  # [E, L, ...] episodes
            monitor.add_episodes(self.steps, batch.returns, batch.lengths)
            # 2. group-relative advantages; 3. clipped policy epochs
            stats = self._update(batch)
            stats["train/collect_efficiency"] = sum(batch.lengths) / batch.env_steps
            losses = ("train/policy_loss", "train/loss", "train/grad_norm") if "train/loss" in stats else ()
            self._report(monitor, stats, losses, self.policy.parameters())
        return self.steps

    def _update(self, batch: EpisodeBatch) -> dict[str, float]:
        cfg = self.cfg
        adv = group_normalized_advantages(
            batch.rewards,
            batch.mask,
            batch.group_ids,
            mode=cfg.advantage,
            scale=cfg.scale_rewards,
            gamma=cfg.gamma,
            eps=STD_EPS,
        )
        stats = {
            "train/group_return_mean": float(adv.group_return_mean.mean()),
            "train/group_return_std": float(adv.group_return_std.mean()),
            "train/degenerate_frac": float(adv.degenerate.float().mean()),
        }
        keep = torch.ones_like(batch.group_ids, dtype=torch.bool)
        if cfg.drop_degenerate_groups:  # DAPO dynamic sampling: zero-advantage groups carry no gradient
            keep = ~adv.degenerate[batch.group_ids]
        episodes = keep.nonzero().squeeze(1)  # [E']
        if len(episodes) == 0:
            return stats | {"train/n_episodes_used": 0.0}
        obs, actions = batch.obs[episodes], batch.actions[episodes]
        advantages, mask = adv.advantages[episodes], batch.mask[episodes]
        # Dr. GRPO's constant divides by the longest possible episode (the time limit), else the longest seen
        max_len = max(self.time_limit or 0, mask.shape[1])
        with torch.no_grad():  # one batched pass each: the policy did not change during collection
            old_logp = evaluate_steps(self.policy, obs, actions, mask)[0]  # [E', L]
            ref_logp = None
            if self.ref_policy is not None:
                ref_logp = evaluate_steps(self.ref_policy, obs, actions, mask)[0]

        totals: dict[str, float] = dict.fromkeys(("policy_loss", "loss", "entropy", "kl_ref", "low", "high"), 0.0)
        grad_norms: list[Tensor] = []
        n_minibatches = 0
        for _ in range(cfg.n_iterations):  # mu policy updates per batch
            for mb in torch.randperm(len(episodes), device=self.device).split(cfg.batch_size):
                out = grpo_loss(
                    self.policy,
                    cfg,
                    obs=obs[mb],
                    actions=actions[mb],
                    old_logp=old_logp[mb],
                    ref_logp=None if ref_logp is None else ref_logp[mb],
                    advantages=advantages[mb],
                    mask=mask[mb],
                    max_len=max_len,
                )
                loss = out.loss_policy + out.loss_kl + out.loss_entropy
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norms.append(torch.nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.max_grad_norm))
                self.optimizer.step()
                n_minibatches += 1
                totals["policy_loss"] += out.loss_policy.item()
                totals["loss"] += loss.item()
                totals["entropy"] += out.entropy
                totals["kl_ref"] += out.kl_ref
                totals["low"] += out.clip_frac_low
                totals["high"] += out.clip_frac_high
        self.n_updates += 1
        if self.ref_policy is not None and cfg.ref_update_interval and self.n_updates % cfg.ref_update_interval == 0:
            self.ref_policy.load_state_dict(self.policy.state_dict())

        with torch.no_grad():  # KL(old || new) over the whole update: k3 on the sampled actions
            new_logp = evaluate_steps(self.policy, obs, actions, mask)[0]
            approx_kl = float((k3_kl(old_logp, new_logp) * mask).sum() / mask.sum())
        mean = {key: value / n_minibatches for key, value in totals.items()}
        stats |= {
            "train/policy_loss": mean["policy_loss"],
            "train/loss": mean["loss"],
            "train/entropy": mean["entropy"],
            "train/clip_frac_low": mean["low"],
            "train/clip_frac_high": mean["high"],
            "train/clip_fraction": mean["low"] + mean["high"],
            "train/approx_kl": approx_kl,
            "train/n_episodes_used": float(len(episodes)),
            "train/grad_norm": float(torch.stack(grad_norms).mean()),  # before clipping, mean over minibatches
        }
        if self.ref_policy is not None:
            stats["train/kl_ref"] = mean["kl_ref"]
        return stats

    def _stateful(self) -> dict[str, Stateful | None]:
        return {"policy": self.policy, "optimizer": self.optimizer, "ref_policy": self.ref_policy}

    def _counters(self) -> dict[str, Any]:
        """The env steps, the updates and the group-seed generator."""
        return super()._counters() | {"n_updates": self.n_updates, "seed_rng": self.seed_rng.bit_generator.state}

    def _restore(self, restored: Restored) -> None:
        super()._restore(restored)
        self.n_updates = int(restored.values["n_updates"])
        self.seed_rng.bit_generator.state = restored.values[
            "seed_rng"
        ]  # every batch resets the env with seeds from here
