"""Schema of ``algo=rm``: a reward model trained on preference pairs of a text task (``pgcli rm``; docs/lm.md,
"Reward models: `pgcli rm`").

Pure value rules only (``algo.pairs=policy`` needs ``init=``: a rule of :class:`pgcli.config.TrainConfig`); the pairs
themselves are generated from the task at run time (:mod:`pgcli.lm.pairs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pgcli.config.rules import _at_most, _choice, _finite_fields, _learning_rate, _positive, require

PAIR_KINDS = ("checker", "partial", "policy")
"""Values of ``algo.pairs`` (:data:`pgcli.lm.pairs.PAIR_KINDS`)."""


@dataclass
class RMConfig:
    """Reward model: the policy's architecture with a scalar head, trained with the Bradley-Terry loss on preference
    pairs generated from a text task (``pgcli rm``, docs/lm.md)."""

    name: ClassVar[str] = "rm"

    learning_rate: float = 1e-3
    """AdamW step size (constant after a linear warm-up of warmup_steps pairs)."""
    warmup_steps: int = 0
    """Preference pairs over which the learning rate rises linearly from 0."""
    batch_size: int = 64
    """Preference pairs per gradient step."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip."""
    pairs: str = "checker"
    """How a pair is made: 'checker' (chosen a correct completion, rejected a perturbed wrong one), 'partial' (both
    wrong, the one with more partial credit chosen) or 'policy' (rejected a wrong sample of the init=<SFT run> policy,
    chosen a correct completion: the policy's own mistakes)."""
    policy_samples: int = 4
    """pairs=policy: samples of the init policy per prompt, among which the first wrong one is the rejected completion
    (a prompt with none falls back to the checker's wrong completion)."""
    label_noise: float = 0.0
    """Probability that a training pair's label is flipped (chosen and rejected swapped); held-out pairs are clean."""

    def __post_init__(self) -> None:
        _finite_fields(self, "algo")
        _learning_rate("algo.learning_rate", self.learning_rate, "typical: 1e-3")
        require(self.warmup_steps >= 0, "algo.warmup_steps", self.warmup_steps, ">= 0")
        require(self.batch_size >= 1, "algo.batch_size", self.batch_size, ">= 1")
        _at_most("algo.batch_size", self.batch_size, 65536, "typical: 64")
        require(self.weight_decay >= 0, "algo.weight_decay", self.weight_decay, ">= 0")
        _positive("algo.max_grad_norm", self.max_grad_norm)
        _choice("algo.pairs", self.pairs, PAIR_KINDS)
        require(self.policy_samples >= 1, "algo.policy_samples", self.policy_samples, ">= 1", "typical: 4")
        _at_most("algo.policy_samples", self.policy_samples, 1024, "typical: 4")
        require(
            0 <= self.label_noise < 0.5,
            "algo.label_noise",
            self.label_noise,
            "in [0, 0.5)",
            "at 0.5 the labels carry no preference; typical: 0 to 0.3",
        )

    def check_rollout(self, n_envs: int) -> None:
        """No env rollout: a reward model trains on text tasks only."""

    def check_text_env(self) -> None:
        """Every reward-model option applies to a text task."""
