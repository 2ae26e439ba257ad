"""A reward model of a text task trained on preference pairs (``pgcli rm``, ``algo=rm``; docs/lm.md, "Reward models:
`pgcli rm`").

The model is the policy's architecture with a scalar head (InstructGPT's reward model, Ouyang et al., 2022): the
final hidden state at the last real token of prompt + completion (the completion's EOS) through a linear layer,

    r_phi(x, y) = w^T h_phi(x, y)_last

with TinyGPT or any Hugging Face model (``model=hf``: its LoRA adapters and the head train). Trained on pairs
(x, y_c, y_r), y_c preferred (:mod:`pgcli.lm.pairs`), with the Bradley-Terry loss

    L(phi) = - mean_pairs log sigmoid(r_phi(x, y_c) - r_phi(x, y_r))

with AdamW, a linear learning-rate warm-up over ``warmup_steps`` pairs and a global gradient-norm clip; a "step" is
one pair. The head starts at zero, so every reward starts at 0 and the loss at log 2. The loss only sees reward
differences, so the head has no bias. ``algo.pairs=policy`` pairs take their wrong completions from the init policy
(the frozen ``reference`` an ``init=<SFT run>`` gives), sampled by :class:`PolicySampler`. Held-out pairs give
``eval/pairwise_accuracy``, the share of pairs with r(x, y_c) > r(x, y_r) (a tie counts as wrong), and
``eval/reward_margin``, the mean r(x, y_c) - r(x, y_r).

The saved model directory holds ``policy.pt`` (the backbone's weights as a fresh model loads them: LoRA adapters
merged), ``reward_head.pt`` (the head) and, written by the run, ``agent.json``; :func:`load_reward_model` reads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pgcli.config import EvalConfig, RMConfig
from pgcli.contracts import Agent, EvalResult
from pgcli.lm.load import TextModelConfig, make_text_policy
from pgcli.lm.model import CausalLM, generate, save_policy
from pgcli.lm.pairs import Pair, PairGenerator, fallback_frac
from pgcli.lm.supervised import SupervisedTrainer
from pgcli.lm.tasks import Problem, Task, Vocab, decode_completions, encode_completions, encode_prompts
from pgcli.ops.lm import micro_batches

REWARD_HEAD_FILE = "reward_head.pt"
"""The scalar head's ``state_dict`` beside the backbone's ``policy.pt`` (``weights.pt`` holds the whole reward model:
a LoRA backbone's adapters apart from the base, and the head, for resuming)."""


# --------------------------------------------------------------------------------------------------------------------
# The loss and its metrics (pure)
# --------------------------------------------------------------------------------------------------------------------


def _check_pair_shapes(r_chosen: Tensor, r_rejected: Tensor) -> None:
    if r_chosen.ndim != 1 or r_chosen.shape != r_rejected.shape:
        raise ValueError(f"rewards must be two [N] tensors (got {tuple(r_chosen.shape)} and {tuple(r_rejected.shape)})")


def bradley_terry_loss(r_chosen: Tensor, r_rejected: Tensor) -> Tensor:
    """``-mean log sigmoid(r_chosen - r_rejected)`` over N pairs: the negative log-likelihood of the labels under the
    Bradley-Terry model P(y_c > y_r) = sigmoid(r_c - r_r). Inputs [N]; returns a scalar."""
    _check_pair_shapes(r_chosen, r_rejected)
    return -F.logsigmoid(r_chosen - r_rejected).mean()


def pairwise_accuracy(r_chosen: Tensor, r_rejected: Tensor) -> Tensor:
    """Share of the N pairs whose chosen completion gets the strictly higher reward (a tie counts as wrong)."""
    _check_pair_shapes(r_chosen, r_rejected)
    return (r_chosen > r_rejected).float().mean()


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


def load_reward_model(task: Task, model: TextModelConfig, device: torch.device, model_dir: Path) -> RewardModel:
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
            tokens, mask = encode_prompts(vocab, repeated[start : start + self.batch_size], self.device)  # [B, P]
            gen = generate(self.policy, tokens, mask, max_new_tokens=self.task.max_completion_len,
                           eos_id=vocab.stop_ids, temperature=self.temperature, top_p=self.top_p, generator=generator,
                           pad_id=vocab.pad_id)  # fmt: skip
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
        samples = PolicySampler(task, reference, cfg.policy_samples, temperature=model.temperature,
                                top_p=model.top_p, device=device)  # fmt: skip
    return PairGenerator(task, cfg.pairs, cfg.label_noise, samples)


# --------------------------------------------------------------------------------------------------------------------
# The trainer
# --------------------------------------------------------------------------------------------------------------------


class RewardModelTrainer(SupervisedTrainer[RMConfig]):
    """Bradley-Terry training of a :class:`RewardModel` on generated pairs (module docstring); the text-trainer
    signature of ``pgcli.lm``. ``policy`` is the backbone (fresh, or ``init=<SFT run>``); ``reference``, the frozen
    init model, is sampled for ``algo.pairs=policy`` only (no KL term: the reward model does not generate)."""

    rng_key = "pair_rng"
    run_kind = "a reward-model run"

    def __init__(
        self,
        cfg: RMConfig,
        *,
        task: Task,
        policy: CausalLM,
        reference: CausalLM | None,
        model: TextModelConfig,
        seed: int,
        device: torch.device,
    ) -> None:
        self.reward_model = RewardModel(policy).to(device).train()
        params = [p for p in self.reward_model.parameters() if p.requires_grad]  # LoRA: the adapters and the head
        super().__init__(cfg, self.reward_model, params, seed=seed, device=device)
        self.task, self.micro_batch = task, model.micro_batch
        self.pairs = pair_generator(cfg, task, reference, model, device)

    def _step(self) -> dict[str, float]:
        return self._train_on(self.pairs.sample(self.rng, self.cfg.batch_size))

    def _train_on(self, pairs: list[Pair]) -> dict[str, float]:
        """One gradient step on ``pairs``, ``model.micro_batch`` pairs per forward/backward pass (0: all at once);
        each pass's loss is its share of the batch mean."""
        n = len(pairs)
        texts = [p.chosen for p in pairs] + [p.rejected for p in pairs]
        prompts, prompt_mask, completions, completion_mask = encode_texts(
            self.task.vocab, [p.problem.prompt for p in pairs] * 2, texts, self.device
        )  # [2N, P], [2N, C]: the chosen rows, then the rejected rows
        lr = self._start_step()
        margins: list[Tensor] = []  # [N'] per pass
        for rows in micro_batches(torch.arange(n, device=self.device), self.micro_batch):
            both = torch.cat([rows, rows + n])  # [2N']
            rewards = self.reward_model.score(prompts[both], prompt_mask[both], completions[both],
                                              completion_mask[both])  # fmt: skip  # [2N']
            r_chosen, r_rejected = rewards.split(len(rows))
            loss = bradley_terry_loss(r_chosen, r_rejected) * (len(rows) / n)
            loss.backward()
            margins.append((r_chosen - r_rejected).detach())
        grad_norm = torch.nn.utils.clip_grad_norm_(self.reward_model.parameters(), self.cfg.max_grad_norm)
        self.optimizer.step()
        margin = torch.cat(margins)  # [N]
        stats = {
            "train/loss": float(-F.logsigmoid(margin).mean()),
            "train/pairwise_accuracy": float((margin > 0).float().mean()),
            "train/reward_margin": float(margin.mean()),
            "train/grad_norm": float(grad_norm),
            "train/learning_rate": lr,
        }
        if self.cfg.pairs == "policy":
            stats["train/policy_pair_fallback_frac"] = fallback_frac(pairs)
        return stats

    def _save_model(self, directory: Path) -> None:
        """``policy.pt`` (the backbone) and ``reward_head.pt``: what :func:`load_reward_model` reads."""
        save_policy(self.reward_model.backbone, directory)
        torch.save(self.reward_model.head.state_dict(), directory / REWARD_HEAD_FILE)


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
        if not isinstance(agent, RewardModelTrainer):
            raise TypeError(f"a reward-model evaluation scores a RewardModelTrainer (got {type(agent).__name__})")
        result = evaluate_pairs(agent.reward_model, self.task.vocab, self.pairs, self.device, self.n_table_rows)
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
    ranked = (r_chosen > r_rejected).astype(np.float64)
    margin = r_chosen - r_rejected
    rows = [
        {"prompt": p.problem.prompt, "chosen": p.chosen, "rejected": p.rejected, "reward_chosen": float(rc),
         "reward_rejected": float(rr), "ranked_right": bool(rc > rr), "from_policy": p.from_policy}
        for p, rc, rr in zip(pairs[:n_table_rows], r_chosen, r_rejected, strict=False)
    ]  # fmt: skip
    extra = {
        "eval/pairwise_accuracy": float(ranked.mean()),
        "eval/reward_margin": float(margin.mean()),
        "eval/loss": float(np.logaddexp(0.0, -margin).mean()),  # -log sigmoid(m) = log(1 + e^-m)
    }
    lengths = np.array([len(vocab.encode(p.chosen)) + 1 for p in pairs])  # the chosen completions' tokens, EOS too
    return EvalResult(ranked, lengths, extra=extra, samples=rows if n_table_rows else None)
