"""The shared on-policy core: rollout collection on a vector env into preallocated [T, N] tensors, minibatches, and
the critic regression (:func:`fit_value`).

:class:`RolloutCollector` steps a pgcli vector env (same-step autoreset, see ``pgcli.envs.make``) for ``n_steps`` steps
with the current policy and returns a :class:`Rollout` of [T, N] tensors (T = n_steps, N = n_envs):

- ``obs`` [T, N, D] float32, or [T, N, C, H, W] uint8 frames (``model=cnn``: a quarter of float32's memory; the
  torso scales them on the device), ``actions`` [T, N] (discrete) or [T, N, A] (continuous, unclipped);
- ``rewards``, ``terminated`` and ``dones`` (terminated or truncated) as float [T, N];
- ``log_probs`` = log pi_old(a_t | s_t), ``values`` = V(s_t) and ``next_values`` = V(s_{t+1}), where s_{t+1} is the
  TRUE final observation when the episode ended at t (``info["final_obs"]``), not the auto-reset one, so a truncated
  episode bootstraps from where it actually stopped (Pardo et al., 2018; SB3 does the same).

Speed (docs/benchmarks/trpo.md, "Speed"): the step loop only samples actions and copies numpy arrays into buffers that
live for the whole run. The policy and value network do not change during a rollout, so ``log_probs``, ``values``
and ``next_values`` are computed afterwards in one batched forward pass each instead of T small ones; the result is
the same as evaluating them step by step.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gymnasium.vector import VectorEnv
from torch import Tensor

from pgcli.algo import kernels
from pgcli.algo.guard import check_steps
from pgcli.algo.policies import Policy, ValueNetwork, obs_layout
from pgcli.contracts import Monitor
from pgcli.errors import PgcliError
from pgcli.hardware.child import ChildProcess
from pgcli.ops import advantages
from pgcli.ops.losses import explained_variance


@dataclass
class Rollout:
    """One batch of on-policy experience; every field is [T, N] unless noted. Views of the collector's buffers:
    valid until its next ``collect``."""

    obs: Tensor
    """[T, N, D] observations s_t (normalised when the env normalises), or [T, N, C, H, W] uint8 frames."""
    actions: Tensor
    """[T, N] (discrete, int64) or [T, N, A] (continuous, unclipped) actions a_t."""
    log_probs: Tensor
    """log pi_old(a_t | s_t)."""
    rewards: Tensor
    """r_t (normalised when the env normalises rewards)."""
    values: Tensor
    """V(s_t)."""
    next_values: Tensor
    """V(s_{t+1}), with s_{t+1} the true final observation where the episode ended at t."""
    terminated: Tensor
    """1.0 where the episode terminated at t (no bootstrap)."""
    dones: Tensor
    """1.0 where the episode ended at t, terminated or truncated (the GAE recursion stops)."""

    @property
    def n_samples(self) -> int:
        """T * N."""
        return self.rewards.numel()

    def gae(self, *, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
        """GAE(gamma, lambda) advantages and the return targets A + V, both [T, N] (``pgcli.ops.advantages.gae``)."""
        return advantages.gae(
            self.rewards, self.values, self.next_values, self.terminated, self.dones, gamma=gamma, lam=lam
        )

    def critic_stats(self, loss: float, returns: Tensor) -> dict[str, float]:
        """The critic's metrics: its regression ``loss`` and how much of ``returns`` [T * N] V(s_t) explains."""
        return {
            "train/value_loss": loss,
            "train/explained_variance": explained_variance(self.values.flatten(), returns),
        }


class RolloutCollector:
    """Collects :class:`Rollout` s of ``n_steps`` steps per env from ``env``, reusing its buffers.

    Args:
        env: a pgcli vector env (``pgcli.envs.make.make_vec_env``); it is reset here with ``seed``.
        n_steps: T, steps per env per rollout.
        seed: reset seed (the same one ``make_vec_env`` used, so the first episodes are the seeded ones).
        device: where the returned tensors live (the buffers stay on the CPU, where the env is).
    """

    def __init__(self, env: VectorEnv, *, n_steps: int, seed: int, device: torch.device) -> None:
        self.env, self.n_steps, self.device = env, n_steps, device
        n_envs, (obs_shape, obs_dtype) = env.num_envs, obs_layout(env.single_observation_space)
        action_shape = tuple(env.single_action_space.shape or ())
        action_dtype = torch.int64 if not action_shape else torch.float32
        # [T + 1]: the row after the last step holds the bootstrap observation
        self.obs = torch.zeros(n_steps + 1, n_envs, *obs_shape, dtype=obs_dtype)
        self.final_obs = torch.zeros(n_steps, n_envs, *obs_shape, dtype=obs_dtype)  # filled only where an episode ended
        self.actions = torch.zeros(n_steps, n_envs, *action_shape, dtype=action_dtype)
        self.rewards = torch.zeros(n_steps, n_envs)
        self.terminated = torch.zeros(n_steps, n_envs)
        self.dones = torch.zeros(n_steps, n_envs)
        # per-step row views, made once: indexing a tuple is far cheaper than indexing a tensor in the step loop
        self._obs_rows, self._action_rows = self.obs.unbind(0), self.actions.unbind(0)
        # numpy views of the same memory: the step loop writes through these
        self._obs_np, self._final_obs_np = self.obs.numpy(), self.final_obs.numpy()
        self._rewards_np, self._terminated_np, self._dones_np = (
            self.rewards.numpy(),
            self.terminated.numpy(),
            self.dones.numpy(),
        )
        self.last_obs, _ = env.reset(seed=seed)
        """The observation batch the next rollout starts from (a checkpoint restores it with the env's episodes)."""

    @torch.no_grad()
    def collect(
        self,
        policy: Policy,
        value_fn: Callable[[Tensor], Tensor],
        monitor: Monitor,
        step: int,
    ) -> Rollout:
        """Step every env ``n_steps`` times with ``policy``; report ended episodes to ``monitor``.

        Args:
            policy: samples the actions.
            value_fn: V, mapping [B, D] observations (or [B, C, H, W] frames) to [B] values.
            monitor: receives ``episodes(step, info)`` whenever an episode ends.
            step: env steps taken before this rollout (``step`` of the episode records).

        Returns:
            The :class:`Rollout` (views of this collector's buffers).
        """
        device = self.device
        obs_np, final_obs_np = self._obs_np, self._final_obs_np
        obs_np[0] = self.last_obs
        start_step = step
        n_envs, obs_rows, action_rows = self.env.num_envs, self._obs_rows, self._action_rows
        on_cpu = device.type == "cpu"
        for t in range(self.n_steps):
            actions = policy.sample(obs_rows[t] if on_cpu else obs_rows[t].to(device))  # [N] or [N, A]
            action_rows[t].copy_(actions)
            next_obs, rewards, terminated, truncated, info = self.env.step(policy.to_env(actions))
            step += n_envs
            obs_np[t + 1] = next_obs
            self._rewards_np[t] = rewards
            self._terminated_np[t] = terminated
            np.logical_or(terminated, truncated, out=self._dones_np[t], casting="unsafe")
            if "final_obs" in info:
                for i in np.flatnonzero(info["_final_obs"]):
                    final_obs_np[t, i] = info["final_obs"][i]
                monitor.episodes(step, info)
        self.last_obs = obs_np[self.n_steps].copy()
        # divergence guard: one check per rollout, before any of it reaches the networks
        check_steps(monitor, "observation", self.obs, first_step=start_step)  # row t: returned by step t
        check_steps(monitor, "final observation", self.final_obs, first_step=start_step + n_envs)  # by step t + 1
        check_steps(monitor, "reward", self.rewards, first_step=start_step + n_envs)
        return self._finish(policy, value_fn)

    def _finish(self, policy: Policy, value_fn: Callable[[Tensor], Tensor]) -> Rollout:
        """Batched log pi_old(a|s), V(s_t) and V(s_{t+1}) (the true final observation where an episode ended)."""
        n_steps, device = self.n_steps, self.device
        obs = self.obs.to(device)
        flat_obs = obs.flatten(0, 1)  # [(T + 1) N, D] or [(T + 1) N, C, H, W]
        actions, dones = self.actions.to(device), self.dones.to(device)
        all_values = value_fn(flat_obs).view(n_steps + 1, -1)  # [T + 1, N]
        next_values = all_values[1:].clone()
        ended = dones.bool()
        if ended.any():
            next_values[ended] = value_fn(self.final_obs.to(device)[ended])
        n_samples = actions.shape[0] * actions.shape[1]
        params = policy.dist_params(flat_obs[:n_samples])
        log_probs = policy.log_prob_of(params, actions.flatten(0, 1)).view(n_steps, -1)
        return Rollout(
            obs=obs[:n_steps],
            actions=actions,
            log_probs=log_probs,
            rewards=self.rewards.to(device),
            values=all_values[:n_steps],
            next_values=next_values,
            terminated=self.terminated.to(device),
            dones=dones,
        )


def minibatches(
    *tensors: Tensor, batch_size: int, generator: torch.Generator | None = None
) -> Iterator[tuple[Tensor, ...]]:
    """One epoch of shuffled minibatches over the first dimension of ``tensors`` (all [B, ...] with the same B).

    The tensors are permuted once (one gather each) and then sliced, so each minibatch is a view; the last one holds
    the remainder when ``batch_size`` does not divide B (as SB3's ``RolloutBuffer.get``).

    Args:
        tensors: [B, ...] tensors sharing the first dimension.
        batch_size: samples per minibatch.
        generator: random source of the permutation (default: torch's global one).

    Yields:
        Tuples of [b, ...] tensors, b <= batch_size, covering every sample exactly once.

    Raises:
        ValueError: on mismatched first dimensions or batch_size < 1.
    """
    n = tensors[0].shape[0]
    if any(t.shape[0] != n for t in tensors):
        raise ValueError(f"tensors must share their first dimension, got {[tuple(t.shape) for t in tensors]}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    perm = torch.randperm(n, generator=generator, device=tensors[0].device)
    shuffled = [t[perm] for t in tensors]
    for start in range(0, n, batch_size):
        yield tuple(t[start : start + batch_size] for t in shuffled)


def fit_critic(
    value: ValueNetwork, optimizer: torch.optim.Adam, batch: Rollout, returns: Tensor, *, n_epochs: int, batch_size: int
) -> dict[str, float]:
    """:func:`fit_value` on the rollout's observations [T * N, ...] and ``returns`` [T * N]; the critic's metrics."""
    loss = fit_value(value, optimizer, batch.obs.flatten(0, 1), returns, n_epochs=n_epochs, batch_size=batch_size)
    return batch.critic_stats(loss, returns)


def fit_value(
    value: ValueNetwork,
    optimizer: torch.optim.Adam,
    obs: Tensor,
    returns: Tensor,
    *,
    n_epochs: int,
    batch_size: int,
) -> float:
    """Fit V to the return targets: ``n_epochs`` epochs of Adam steps on shuffled minibatches of mean (V(s) - R)^2.

    The same steps as ``loss.backward(); optimizer.step()`` per minibatch (tests/unit/test_rollout.py compares them),
    computed faster: explicit gradients (:meth:`ValueNetwork.mse_grad_fn`) and one Adam step on ``optimizer``'s own
    state (``pgcli.algo.kernels.adam_step``: torch's fused Adam kernel where this torch has it), instead of autograd
    plus ``Optimizer.step``'s per-call bookkeeping (about 50 us a call). TRPO and VPG take
    n_epochs * T * N / batch_size of these small steps per update (1280 with the defaults and 8 envs), the largest
    cost of an update after the env itself. The losses are kept as residuals and averaged once at the end.

    Args:
        value: the value network.
        optimizer: an Adam over exactly ``value``'s parameters (one group, no weight decay, no amsgrad); its state
            is created here if empty and advanced as ``optimizer.step`` would.
        obs: [B, D] observations.
        returns: [B] targets.
        n_epochs: passes over the data.
        batch_size: minibatch size.

    Returns:
        The mean minibatch loss over all steps.

    Raises:
        ValueError: if ``optimizer`` is not a plain Adam over ``value``'s parameters.
    """
    (group,) = optimizer.param_groups
    params: list[Tensor] = list(value.critic_parameters())
    state = _adam_state(optimizer, params)
    (beta1, beta2), lr, eps = group["betas"], float(group["lr"]), group["eps"]
    hyper = kernels.AdamHyper(lr=lr, beta1=beta1, beta2=beta2, eps=eps)
    grad_fn = value.mse_grad_fn()
    targets = returns.unsqueeze(-1)  # [B, 1]
    residuals: list[Tensor] = []
    with torch.no_grad():
        for _ in range(n_epochs):
            for mb_obs, mb_targets in minibatches(obs, targets, batch_size=batch_size):
                residual, grads = _residual_and_grads(value, grad_fn, mb_obs, mb_targets)
                residuals.append(residual)
                kernels.adam_step(state, grads, hyper)
    return mean_square_per_group(residuals)


def _adam_state(optimizer: torch.optim.Adam, params: list[Tensor]) -> kernels.AdamState:
    """``params`` with ``optimizer``'s moments and step counts, one tensor per parameter, created where empty
    in the layout ``torch.optim.Adam`` creates on its first step (so ``state_dict()`` / loading work unchanged).

    Raises:
        ValueError: if ``optimizer`` is not a plain Adam over exactly ``params``.
    """
    (group,) = optimizer.param_groups
    if group["params"] != params or group["amsgrad"] or group["weight_decay"] or group["maximize"]:
        raise ValueError("fit_value needs a plain Adam (no amsgrad, weight decay or maximize) over the value network")
    for p in params:
        if not optimizer.state[p]:
            optimizer.state[p] = {
                "step": torch.tensor(0.0, device=p.device),
                "exp_avg": torch.zeros_like(p),
                "exp_avg_sq": torch.zeros_like(p),
            }
    states = [optimizer.state[p] for p in params]
    return kernels.AdamState(
        params, [st["exp_avg"] for st in states], [st["exp_avg_sq"] for st in states], [st["step"] for st in states]
    )


def _residual_and_grads(
    value: ValueNetwork,
    grad_fn: Callable[[Tensor, Tensor], tuple[Tensor, list[Tensor]]] | None,
    obs: Tensor,
    targets: Tensor,
) -> tuple[Tensor, list[Tensor]]:
    """One minibatch's residual (a tensor whose mean square is the loss) and gradient of mean((V(obs) - targets)^2)
    per critic parameter, for [b, D] ``obs`` and [b, 1] ``targets``: by ``grad_fn`` (the explicit backprop of
    :meth:`ValueNetwork.mse_grad_fn`) when there is one, else by autograd."""
    if grad_fn is not None:
        return grad_fn(obs, targets)  # residual [b, 1]
    with torch.enable_grad():
        loss, grads = value.mse_grads(obs, targets.squeeze(-1))
    return loss.sqrt().view(1, 1), grads  # its square is the loss


def mean_square_per_group(residuals: list[Tensor]) -> float:
    """The mean over the list of each tensor's mean square (the mean minibatch loss), computed in a few batched
    ops: tensors of equal shape are stacked together (all minibatches but a smaller last one)."""
    if not residuals:
        return float("nan")
    by_shape: dict[tuple[int, ...], list[Tensor]] = {}
    for r in residuals:
        by_shape.setdefault(tuple(r.shape), []).append(r)
    total = sum(float(torch.stack(group).square().flatten(1).mean(1).sum()) for group in by_shape.values())
    return total / len(residuals)


class CriticProcess:
    """:func:`fit_value` in a separate process (TRPO's ``algo.critic_process``), so that the critic fit runs while
    the trainer takes the policy step: the two only share the rollout (docs/benchmarks/trpo.md, "Two cores").

    :meth:`submit` sends the value network's parameters, its Adam state, the batch and torch's global RNG state to
    the process, which loads them into its own copy of the network and optimizer, runs :func:`fit_value` with the
    same RNG stream (the minibatch permutations), and sends everything back; :meth:`result` copies it into the
    trainer's network, optimizer and RNG. Every number is the one an in-process fit gives (tests/unit/test_rollout.py):
    one thread on the same CPU runs the same kernels on the same inputs. The trainer must not draw from torch's
    global RNG between the two calls (checked). A dead process is a one-line :class:`PgcliError`.

    Args:
        value: the trainer's value network (a copy is sent once, at start).
        optimizer: its plain Adam (its hyperparameters are copied; its state is sent with each batch).
    """

    def __init__(self, value: ValueNetwork, optimizer: torch.optim.Adam) -> None:
        (group,) = optimizer.param_groups
        settings = {"lr": float(group["lr"]), "betas": tuple(group["betas"]), "eps": float(group["eps"])}
        self._process = ChildProcess(
            _critic_main,
            copy.deepcopy(value).cpu(),
            settings,
            name="pgcli-critic",
            error=PgcliError,
            died="the critic process (pid {pid}) died (exit code {code}); algo.critic_process=false runs without it",
            failed="critic process failed: {message}",
        )
        self._rng: Tensor | None = None
        self._ready = False

    def ready(self) -> bool:
        """Whether the process has started (imports take seconds): until then the trainer fits in process, which
        gives the same numbers, instead of waiting."""
        if not self._ready and self._process.poll():
            self._process.recv()
            self._ready = True
        return self._ready

    def submit(
        self,
        value: ValueNetwork,
        optimizer: torch.optim.Adam,
        obs: Tensor,
        returns: Tensor,
        *,
        n_epochs: int,
        batch_size: int,
    ) -> None:
        """Start fitting ``value`` (with ``optimizer``'s step size and state) to ``returns`` [B] at ``obs`` [B, D]."""
        params = list(value.critic_parameters())
        state = [optimizer.state[p] for p in params] if all(optimizer.state[p] for p in params) else None
        self._rng = torch.get_rng_state()
        request = {
            "params": [p.detach().numpy() for p in params],
            "adam": None
            if state is None
            else [[st[k].numpy() for k in ("step", "exp_avg", "exp_avg_sq")] for st in state],
            "lr": float(optimizer.param_groups[0]["lr"]),
            "rng": self._rng.numpy(),
            "obs": obs.numpy(),
            "returns": returns.numpy(),
            "n_epochs": n_epochs,
            "batch_size": batch_size,
        }
        self._process.send(request)

    def result(self, value: ValueNetwork, optimizer: torch.optim.Adam) -> float:
        """Wait for the fit; copy the fitted parameters, Adam state and RNG state in; the mean minibatch loss."""
        assert self._rng is not None, "result() without submit()"
        if not torch.equal(torch.get_rng_state(), self._rng):
            raise RuntimeError("torch's global RNG was used while the critic process fitted: the run would differ")
        message = self._process.recv()
        if message[0] == "ready":  # submitted before ready() saw it
            self._ready = True
            message = self._process.recv()
        reply = self._process.unpack(message)
        with torch.no_grad():
            for p, fitted, (step, exp_avg, exp_avg_sq) in zip(
                value.critic_parameters(), reply["params"], reply["adam"], strict=True
            ):
                p.copy_(torch.from_numpy(fitted))
                optimizer.state[p] = {
                    "step": torch.from_numpy(step).clone(),
                    "exp_avg": torch.from_numpy(exp_avg).clone(),
                    "exp_avg_sq": torch.from_numpy(exp_avg_sq).clone(),
                }
        torch.set_rng_state(torch.from_numpy(reply["rng"]))
        self._rng = None
        return float(reply["loss"])

    def close(self) -> None:
        self._process.close(None)


def _critic_main(conn: Any, value: ValueNetwork, settings: dict[str, Any]) -> None:
    """The critic process: fit each submitted batch (see :class:`CriticProcess`) until None."""
    torch.set_num_threads(1)
    optimizer = torch.optim.Adam(value.critic_parameters(), **settings)
    params = list(value.critic_parameters())
    try:
        conn.send(("ready", None))
        while (request := conn.recv()) is not None:
            try:
                with torch.no_grad():
                    for p, saved in zip(params, request["params"], strict=True):
                        p.copy_(torch.from_numpy(saved))
                for p, saved in zip(params, request["adam"] or [None] * len(params), strict=True):
                    if saved is None:  # the first fit: fit_value creates Adam's state
                        optimizer.state.pop(p, None)
                    else:
                        step, exp_avg, exp_avg_sq = (torch.from_numpy(v).clone() for v in saved)
                        optimizer.state[p] = {"step": step, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
                optimizer.param_groups[0]["lr"] = request["lr"]
                torch.set_rng_state(torch.from_numpy(request["rng"]))
                loss = fit_value(
                    value,
                    optimizer,
                    torch.from_numpy(request["obs"]),
                    torch.from_numpy(request["returns"]),
                    n_epochs=request["n_epochs"],
                    batch_size=request["batch_size"],
                )
                reply = {
                    "loss": loss,
                    "params": [p.detach().numpy() for p in params],
                    "adam": [
                        [optimizer.state[p][k].numpy() for k in ("step", "exp_avg", "exp_avg_sq")] for p in params
                    ],
                    "rng": torch.get_rng_state().numpy(),
                }
                conn.send(("ok", reply))
            except Exception as exc:  # reported to the trainer, which raises it as one line
                conn.send(("error", f"{type(exc).__name__}: {exc}"))
    except (EOFError, OSError):  # the trainer went away
        pass
    finally:
        conn.close()
