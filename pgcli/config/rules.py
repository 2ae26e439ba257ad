"""The rules a config value must follow, shared by every schema: each failure is one line naming the key, the value,
the rule and a fix (a :class:`~pgcli.errors.ConfigError`).

Only pure checks of the values live here; whether an env id is registered or a text task fits the model is decided
after composition, by :mod:`pgcli.training.checks`, which raises through :func:`require` too. The other helpers
(underscored) are the schema modules' own.
"""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any

from pgcli.errors import ConfigError

ACTIVATIONS = ("tanh", "relu", "elu", "gelu", "leaky_relu")
"""The values of ``model.activation`` (their torch functions and modules: ``pgcli.algo.networks.ACTIVATIONS``)."""
SCHEDULES = ("constant", "linear")
# Sane bounds (docs/configuration.md, "Validation"): values past these are typos (1e300, an extra zero) that would
# otherwise run for ever, exhaust memory or diverge at once; each error names the bound and a typical value.
MAX_LEARNING_RATE = 1.0
MAX_TOTAL_STEPS = 10**12
MAX_N_ENVS = 1024
MAX_ROLLOUT = 10**7
"""n_steps * n_envs: one rollout of more steps than this does not fit in memory with its tensors."""
MAX_EPOCHS = 1000
MAX_WIDTH = 16384
MAX_SEED = 2**32 - 1
"""numpy's legacy seeding (SB3, np.random.seed) takes seeds below 2**32."""
MAX_CG_RESIDUAL_TOL = 1e-6


def require(ok: bool, key: str, value: object, rule: str, hint: str = "") -> None:
    """Raise a one-line :class:`ConfigError` naming the key, the value and the rule when ``ok`` is false."""
    if not ok:
        raise ConfigError(f"{key} must be {rule} (got {value!r})" + (f"; {hint}" if hint else ""))


def _positive(key: str, value: float, hint: str = "") -> None:
    require(isinstance(value, (int, float)) and math.isfinite(value) and value > 0, key, value, "> 0", hint)


def _finite_fields(obj: Any, prefix: str) -> None:
    """Reject nan and inf in every float field of ``obj``: nan fails every comparison and inf passes ``>= 0``, so
    range rules alone let them through to the optimiser."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{prefix}.{f.name} must be a finite number (got {value})")


def _learning_rate(key: str, value: float, hint: str) -> None:
    _positive(key, value, hint)
    require(
        value <= MAX_LEARNING_RATE, key, value, f"<= {MAX_LEARNING_RATE:g}", f"a step size above 1 diverges; {hint}"
    )


def _at_most(key: str, value: float, bound: float, hint: str = "") -> None:
    require(value <= bound, key, value, f"<= {bound:g}", hint)


def _trust_region(key: str, value: float) -> None:
    """A mean-KL radius: > 0, and at most 1 nat (past that the "trust region" no longer restrains the step)."""
    _positive(key, value, "typical: 0.01")
    _at_most(key, value, 1.0, "a KL radius above 1 nat no longer restrains the policy step; typical: 0.01")


def _sde_sample_freq(value: int) -> None:
    require(value >= -1, "algo.sde_sample_freq", value, ">= -1", "-1 or 0: sample the gSDE noise once per rollout")


def _rollout_rules(
    algo: Any,
    n_envs: int,
    *,
    minibatch: bool = True,
    needs_two_samples: bool = False,
    sub_sampling: tuple[str, int] | None = None,
) -> None:
    """Cross-group rules on the rollout ``algo.n_steps * env.n_envs`` (called from :class:`TrainConfig`).

    Args:
        algo: an algo config with ``n_steps`` (and ``batch_size`` when ``minibatch``).
        n_envs: ``env.n_envs``.
        minibatch: whether ``algo.batch_size`` counts samples of the rollout (it must then fit in it).
        needs_two_samples: SB3 standardises advantages over the rollout and asserts ``n_steps * n_envs > 1``.
        sub_sampling: (key, k) of a Fisher sub-sampling factor: every k-th sample of a shorter rollout is one sample.
    """
    rollout = algo.n_steps * n_envs
    size = f"algo.n_steps * env.n_envs = {algo.n_steps} * {n_envs} = {rollout}"
    hint = "a rollout this large does not fit in memory; typical: 2048 * 8"
    require(rollout <= MAX_ROLLOUT, "algo.n_steps * env.n_envs", rollout, f"<= {MAX_ROLLOUT:g}", hint)
    if needs_two_samples:
        hint = "one sample has no standard deviation (SB3 asserts this); raise algo.n_steps or env.n_envs"
        require(rollout > 1, "algo.n_steps * env.n_envs", rollout, "> 1 with algo.normalize_advantage=true", hint)
    if minibatch:
        hint = "a minibatch cannot be larger than the rollout; lower algo.batch_size or raise algo.n_steps"
        require(algo.batch_size <= rollout, "algo.batch_size", algo.batch_size, f"<= {size}", hint)
    if sub_sampling is not None:
        key, k = sub_sampling
        require(k <= rollout, key, k, f"<= {size}", "every k-th sample of a shorter rollout is a single sample")


def _unit_open(key: str, value: float, hint: str = "") -> None:
    require(0 < value < 1, key, value, "in (0, 1)", hint)


def _gamma(key: str, value: float) -> None:
    require(0 < value <= 1, key, value, "in (0, 1]", "typical: 0.99")


def _lambda(key: str, value: float) -> None:
    require(0 <= value <= 1, key, value, "in [0, 1]", "typical: 0.95")


def _choice(key: str, value: str, options: tuple[str, ...]) -> None:
    require(value in options, key, value, f"one of {', '.join(options)}")
