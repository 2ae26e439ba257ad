"""A reward model of a text task (``pgcli rm``, ``algo=rm``; docs/lm.md, "Reward models: `pgcli rm`"): the model, its
scores, its pairs and its held-out evaluation; the trainer is :mod:`pgcli.algo.reward_model`.

The model is the policy's architecture with a scalar head (InstructGPT's reward model, Ouyang et al., 2022): the
final hidden state at the last real token of prompt + completion (the completion's EOS) through a linear layer,

    r_phi(x, y) = w^T h_phi(x, y)_last

with TinyGPT or any Hugging Face model (``model=hf``: its LoRA adapters and the head train). The head starts at zero,
so every reward starts at 0; the Bradley-Terry loss (:mod:`pgcli.ops.preference`) only sees reward differences, so
the head has no bias. ``algo.pairs=policy`` pairs take their wrong completions from the init policy (the frozen
``reference`` an ``init=<SFT run>`` gives), sampled by :class:`PolicySampler`. Held-out pairs give
``eval/pairwise_accuracy``, the share of pairs with r(x, y_c) > r(x, y_r) (a tie counts as wrong), and
``eval/reward_margin``, the mean r(x, y_c) - r(x, y_r).

The saved model directory holds ``policy.pt`` (the backbone's weights as a fresh model loads them: LoRA adapters
merged), ``reward_head.pt`` (the head) and, written by the run, ``agent.json``; :func:`load_reward_model` reads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from pgcli.config import EvalConfig, RMConfig, TextEnvConfig, TrainConfig
from pgcli.contracts import Agent, EvalResult
from pgcli.lm.load import TextModelConfig, make_text_policy
from pgcli.lm.model import CausalLM
from pgcli.lm.pairs import Pair, PairGenerator, fallback_frac
from pgcli.lm.tasks import (
    Problem,
    Task,
    TextTask,
    Vocab,
    decode_completions,
    encode_completions,
    encode_prompts,
    generate_for_task,
)

REWARD_HEAD_FILE = "reward_head.pt"
"""The scalar head's ``state_dict`` beside the backbone's ``policy.pt`` (``weights.pt`` holds the whole reward model:
a LoRA backbone's adapters apart from the base, and the head, for resuming)."""


# --------------------------------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------------------------------


class RewardModel(nn.Module):
    """A :class:`CausalLM` backbone with a linear scalar head on its last real token (module docstring)."""

    def __init__(self, backbone: CausalLM) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(backbone.hidden_size, 1, bias=False)
        nn.init.zeros_(self.head.weight)

    def forward(self, tokens: Tensor, mask: Tensor) -> Tensor:
        """Rewards [B] of rows ``tokens`` [B, T] with real-token ``mask`` [B, T] (each row's last real token read)."""
        hidden = self.backbone.hidden(tokens, mask)  # [B, T, D]
        t = mask.shape[1]
        last = t - 1 - mask.flip(1).long().argmax(1)  # [B]
        h = hidden[torch.arange(len(tokens), device=tokens.device), last]  # [B, D]
        return self.head(h.to(self.head.weight.dtype)).squeeze(-1)

    def score(self, prompts: Tensor, prompt_mask: Tensor, completions: Tensor, completion_mask: Tensor) -> Tensor:
        """Rewards [B] of left-padded prompts [B, P] followed by right-padded completions [B, C] (EOS included)."""
        return self(torch.cat([prompts, completions], 1), torch.cat([prompt_mask, completion_mask], 1))


def encode_texts(
    vocab: Vocab, prompts: Sequence[str], completions: Sequence[str], device: torch.device
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Prompts (left-padded, BOS first) and completions (text + EOS, right-padded to the longest): the four tensors of
    :meth:`RewardModel.score`."""
    tokens, mask = encode_prompts(vocab, [Problem(prompt, "") for prompt in prompts], device)  # [B, P]
    width = max(len(vocab.encode(text)) + 1 for text in completions)
    completion, completion_mask = encode_completions(vocab, completions, width, device)  # [B, C]
    return tokens, mask, completion, completion_mask


@torch.no_grad()
def score_texts(
    model: RewardModel,
    vocab: Vocab,
    prompts: Sequence[str],
    completions: Sequence[str],
    device: torch.device,
    *,
    batch_size: int = 512,
) -> np.ndarray:
    """Rewards [B] (float64) of ``completions[i]`` given ``prompts[i]``, ``batch_size`` rows per forward pass; the
    model's train/eval mode is restored afterwards."""
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts and {len(completions)} completions: pass one completion per prompt")
    was_training = model.training
    model.eval()
    out: list[np.ndarray] = []
    try:
        for start in range(0, len(prompts), batch_size):
            rows = slice(start, start + batch_size)
            rewards = model.score(*encode_texts(vocab, prompts[rows], completions[rows], device))
            out.append(rewards.double().cpu().numpy())
    finally:
        model.train(was_training)
    return np.concatenate(out) if out else np.zeros(0)


def load_reward_model(task: TextTask, model: TextModelConfig, device: torch.device, model_dir: Path) -> RewardModel:
    """The reward model saved in ``model_dir`` (``policy.pt`` and ``reward_head.pt``) for ``task`` and ``model`` (the
    saved run's config), in eval mode on ``device``."""
    reward_model = RewardModel(make_text_policy(task, model, device, model_dir))
    head = torch.load(model_dir / REWARD_HEAD_FILE, map_location=device, weights_only=True)
    reward_model.head.load_state_dict(head)
    return reward_model.to(device).eval()


# --------------------------------------------------------------------------------------------------------------------
# The init policy's samples (algo.pairs=policy)
# --------------------------------------------------------------------------------------------------------------------


class PolicySampler:
    """``k`` completions per problem sampled from ``policy`` (the frozen init model) at ``temperature`` and ``top_p``
    (:class:`pgcli.lm.pairs.PolicySamples`), ``batch_size`` rows per generation. The sampling RNG is a torch generator
    seeded from the pair RNG at each call, so the pairs are reproducible and a resumed run draws what it would have."""

    def __init__(
        self,
        task: Task,
        policy: CausalLM,
        k: int,
        *,
        temperature: float,
        top_p: float,
        device: torch.device,
        batch_size: int = 1024,
    ) -> None:
        self.task, self.policy, self.k, self.device, self.batch_size = task, policy, k, device, batch_size
        self.temperature, self.top_p = temperature, top_p

    @torch.no_grad()
    def __call__(self, problems: Sequence[Problem], rng: np.random.Generator) -> list[list[str]]:
        generator = torch.Generator(device=self.device).manual_seed(int(rng.integers(2**63 - 1)))
        repeated = [p for p in problems for _ in range(self.k)]
        vocab = self.task.vocab
        texts: list[str] = []
        for start in range(0, len(repeated), self.batch_size):
            chunk = repeated[start : start + self.batch_size]
            _, _, gen = generate_for_task(
                self.task,
                self.policy,
                chunk,
                self.device,
                temperature=self.temperature,
                top_p=self.top_p,
                generator=generator,
            )
            texts += decode_completions(vocab, gen.tokens)
        return [texts[i : i + self.k] for i in range(0, len(texts), self.k)]


def pair_generator(
    cfg: RMConfig, task: Task, reference: CausalLM | None, model: TextModelConfig, device: torch.device
) -> PairGenerator:
    """The pairs of a reward-model run; ``policy`` pairs sample ``reference``, the frozen ``init`` model (the rule
    ``algo.pairs=policy`` needs ``init=`` is :class:`pgcli.config.TrainConfig`'s)."""
    samples = None
    if cfg.pairs == "policy":
        if reference is None:
            raise ValueError("algo.pairs=policy samples the init model: pass it as the reference")
        samples = PolicySampler(
            task, reference, cfg.policy_samples, temperature=model.temperature, top_p=model.top_p, device=device
        )
    return PairGenerator(task, cfg.pairs, cfg.label_noise, samples)


# --------------------------------------------------------------------------------------------------------------------
# Held-out evaluation
# --------------------------------------------------------------------------------------------------------------------


class PairEvaluator:
    """The monitor's evaluator of a reward-model run: pairwise accuracy on the held-out pairs.

    It scores the reward model of the trainer the monitor passes (the text evaluator's interface: ``__call__``,
    ``record``, ``close``). ``eval/return_mean`` is the pairwise accuracy (each pair's "return" is 1 when ranked
    right), so the best model (``eval.save_best``) is the one that ranks the most held-out pairs right. ``policy``
    pairs add ``eval/policy_pair_fallback_frac``, the share of held-out pairs whose wrong completion is the checker's.
    """

    concurrent = None
    """Evaluated in this process only (``pgcli.training.evaluation.EvaluatorLike``)."""

    def __init__(
        self, task: Task, pairs: PairGenerator, cfg: EvalConfig, *, seed: int, n_table_rows: int, device: torch.device
    ) -> None:
        self.task, self.cfg, self.n_table_rows, self.device = task, cfg, n_table_rows, device
        self.pairs, self.policy_pairs = pairs.eval_pairs(seed), pairs.kind == "policy"

    def __call__(self, agent: Agent) -> EvalResult:
        reward_model = getattr(agent, "reward_model", None)  # a RewardModelTrainer's (pgcli.algo.reward_model)
        if not isinstance(reward_model, RewardModel):
            raise TypeError(f"a reward-model evaluation scores a RewardModelTrainer (got {type(agent).__name__})")
        result = evaluate_pairs(reward_model, self.task.vocab, self.pairs, self.device, self.n_table_rows)
        if self.policy_pairs:
            result.extra["eval/policy_pair_fallback_frac"] = fallback_frac(self.pairs)
        return result

    def record(self, agent: Agent, video: Path) -> tuple[EvalResult, list[Path]]:
        """Text tasks have no video: an evaluation, no files."""
        return self(agent), []

    def close(self) -> None:
        """Nothing to release."""


def evaluate_pairs(
    model: RewardModel, vocab: Vocab, pairs: list[Pair], device: torch.device, n_table_rows: int = 0
) -> EvalResult:
    """``eval/pairwise_accuracy``, ``eval/reward_margin`` and ``eval/loss`` (the Bradley-Terry loss) of ``model`` on
    ``pairs``, with a samples table of the first ``n_table_rows`` pairs."""
    prompts = [p.problem.prompt for p in pairs]
    r_chosen = score_texts(model, vocab, prompts, [p.chosen for p in pairs], device)  # [N]
    r_rejected = score_texts(model, vocab, prompts, [p.rejected for p in pairs], device)  # [N]
    rows = [
        {"prompt": p.problem.prompt, "chosen": p.chosen, "rejected": p.rejected, "from_policy": p.from_policy}
        for p in pairs[:n_table_rows]
    ]
    lengths = np.array([len(vocab.encode(p.chosen)) + 1 for p in pairs])  # the chosen completions' tokens, EOS too
    return pair_metrics(r_chosen, r_rejected, lengths, rows)


def pair_metrics(
    r_chosen: np.ndarray, r_rejected: np.ndarray, lengths: np.ndarray, rows: list[dict[str, Any]]
) -> EvalResult:
    """The held-out evaluation of rewards ``r_chosen`` [N] and ``r_rejected`` [N] of N pairs (``lengths`` [N]: the
    chosen sides' tokens): ``eval/pairwise_accuracy`` (a tie counts as wrong), ``eval/reward_margin`` and
    ``eval/loss``, with ``rows`` (the first pairs' table rows) completed by their rewards."""
    ranked = (r_chosen > r_rejected).astype(np.float64)
    margin = r_chosen - r_rejected
    table = [
        {**row, "reward_chosen": float(rc), "reward_rejected": float(rr), "ranked_right": bool(rc > rr)}
        for row, rc, rr in zip(rows, r_chosen, r_rejected, strict=False)
    ]
    extra = {
        "eval/pairwise_accuracy": float(ranked.mean()),
        "eval/reward_margin": float(margin.mean()),
        "eval/loss": float(np.logaddexp(0.0, -margin).mean()),  # -log sigmoid(m) = log(1 + e^-m)
    }
    return EvalResult(ranked, lengths, extra=extra, samples=table or None)


def reward_model_evaluator(
    cfg: TrainConfig, task: Task, reference: CausalLM | None, device: torch.device
) -> PairEvaluator:
    """The held-out evaluator of the reward-model run ``cfg`` (``algo=rm`` on a generated task): its pairs drawn as
    the run draws them (``policy`` pairs sample ``reference``, the init model), the same for training and
    ``pgcli eval``."""
    assert isinstance(cfg.algo, RMConfig) and isinstance(cfg.env, TextEnvConfig)  # a reward-model run's config
    assert isinstance(cfg.model, TextModelConfig)
    pairs = pair_generator(cfg.algo, task, reference, cfg.model, device)
    return PairEvaluator(
        task, pairs, cfg.eval, seed=cfg.env.eval_seed, n_table_rows=cfg.env.eval_samples, device=device
    )
