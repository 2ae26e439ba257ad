"""The MLflow Model of a pgcli run: ``mlflow.pyfunc.load_model("runs:/<run id>/model").predict(...)``.

Every run logs its final agent as ``model`` (and its best one as ``best_model``): an MLflow Model directory whose
``MLmodel`` names this module as the pyfunc ``loader_module``, beside the agent's own files (``model.pt`` or SB3's
``model.zip``, ``normalizer.npz``, ``policy.pt``, ``agent.json``; see :mod:`pgcli.agent`). MLflow calls
:func:`_load_pyfunc` with that directory, and ``agent.json`` says which model it is:

- a gymnasium agent (:class:`AgentPyfunc`): ``predict`` maps raw observations (a numpy array, a list, or a pandas
  DataFrame with one column per observation dimension; an image env's uint8 frames, channels first) to the actions
  the env takes, normalisation (or the frames' 1/255) inside, deterministic;
- a text policy (:class:`TextPyfunc`, ``env=addition|sort|countdown|dataset``): ``predict`` maps prompts as the task
  writes them (``"12+34="``; a string, a list of strings, or a DataFrame with a ``prompt`` column; a dataset run's
  also a list of ``{role, content}`` messages, rendered as in training) to greedy completions;
- a reward model (:class:`RewardModelPyfunc`, ``pgcli rm``): ``predict`` maps (prompt, completion) pairs (a DataFrame
  with ``prompt`` and ``completion`` columns, or a list of pairs) to their rewards.

This module never imports MLflow (only the ``pgcli.tracking`` package does): a loader module needs no MLflow
class, and the model directory holds no pickled Python object of ours -- the weights load with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from pgcli.agent import RawPolicy

if TYPE_CHECKING:
    from pgcli.lm.tasks import Puzzle


class AgentPyfunc:
    """What ``mlflow.pyfunc.load_model`` wraps: ``predict(model_input, params=None)``."""

    def __init__(self, model_dir: Path) -> None:
        self.policy = RawPolicy(model_dir)

    def predict(self, model_input: Any, params: dict[str, Any] | None = None) -> np.ndarray:
        """Actions for a batch of raw observations: [B] int64 (discrete) or [B, A] float32 (continuous).

        An empty batch gives an empty array of actions; an observation with a NaN or an infinity is refused with a
        ValueError naming its rows (a policy maps it to NaN or to an arbitrary action, which nothing downstream
        would notice). An image env's model takes uint8 frames [B, C, H, W] or one [C, H, W] (a DataFrame: one
        flattened frame per row) and refuses other dtypes and layouts with a ValueError naming the expected ones.
        """
        import pandas as pd  # installed with MLflow, the only caller

        shape = self.policy.obs_shape
        if isinstance(model_input, pd.DataFrame):  # one row per observation, one column per dimension
            model_input = model_input.to_numpy()
            if self.policy.takes_frames and model_input.shape[1:] == (int(np.prod(shape)),):  # flattened frames
                model_input = model_input.reshape(len(model_input), *shape)
        # frames keep their dtype: RawPolicy takes uint8 (integers) and refuses floats
        obs = np.asarray(model_input) if self.policy.takes_frames else np.asarray(model_input, dtype=np.float64)
        if obs.ndim >= 1 and len(obs) == 0:  # the shapes and dtypes RawPolicy returns for a batch
            space = self.policy.env_space
            if isinstance(space, gym.spaces.Discrete):
                return np.empty(0, dtype=np.int64)
            return np.empty((0, *(space.shape or ())), dtype=space.dtype)
        if not self.policy.takes_frames:
            check_finite(obs, single=obs.shape == shape)
        return self.policy(obs)


def check_finite(obs: np.ndarray, *, single: bool) -> None:
    """Raise a one-line ValueError naming the observations (rows of a batch) that hold a NaN or an infinity."""
    if obs.ndim == 0 or np.isfinite(obs).all():
        return
    if single:
        raise ValueError("observations must be finite: the observation holds NaN or inf")
    rows = np.flatnonzero(~np.isfinite(obs.reshape(len(obs), -1)).all(axis=1))
    shown = ", ".join(str(r) for r in rows[:10]) + (f", ... ({len(rows)} rows)" if len(rows) > 10 else "")
    raise ValueError(
        f"observations must be finite: row{'s' if len(rows) > 1 else ''} {shown} "
        f"hold{'' if len(rows) > 1 else 's'} NaN or inf"
    )


class TextPyfunc:
    """A text policy's MLflow Model: prompts in, greedy completions out (what ``eval/accuracy`` scores)."""

    def __init__(self, model_dir: Path) -> None:
        import torch

        from pgcli.config.saved_agent import agent_config, read_agent_spec
        from pgcli.lm.load import make_text_policy, make_text_task

        spec = read_agent_spec(model_dir)
        cfg = agent_config(spec)
        # a text spec holds a text env and model; a dataset run's task renders prompts without its rows
        self.task = make_text_task(cfg.env, cfg.model, saved=spec, rows=False)
        self.policy = make_text_policy(self.task, cfg.model, torch.device("cpu"), model_dir)
        self.policy.eval()

    def predict(self, model_input: Any, params: dict[str, Any] | None = None) -> list[str]:
        """Greedy completions (EOS removed) of prompts written as the task writes them, e.g. ``"12+34="``; a dataset
        run's prompts as its rows hold them (a string, or a list of {role, content} messages), rendered as in
        training (``env.system_prompt``, the chat template)."""
        import pandas as pd

        from pgcli.lm.dataset_task import DatasetTask
        from pgcli.lm.tasks import Problem, decode_completions, generate_for_task

        if isinstance(model_input, pd.DataFrame):
            model_input = model_input["prompt"] if "prompt" in model_input else model_input.iloc[:, 0]
        dataset = isinstance(self.task, DatasetTask)
        if isinstance(model_input, str) or (dataset and _is_messages(model_input)):
            model_input = [model_input]
        prompts = [p if dataset and not isinstance(p, str) else str(p) for p in model_input]
        if not prompts:
            return []
        if isinstance(self.task, DatasetTask):
            try:
                prompts = [self.task.render(p) for p in prompts]
            except ValueError as exc:
                raise ValueError(f"a prompt is a string or a list of {{role, content}} messages (got {exc})") from None
        elif getattr(self.task, "puzzle", None) is not None:  # a generated task: prompts as it writes them
            for note in prompt_notes(self.task.puzzle, self.task.name, prompts):
                warnings.warn(note, UserWarning, stacklevel=2)
        vocab = self.task.vocab
        _, _, gen = generate_for_task(
            self.task, self.policy, [Problem(prompt=p, answer="") for p in prompts], temperature=0.0
        )
        return decode_completions(vocab, gen.tokens)


def prompt_notes(puzzle: Puzzle, task: str, prompts: Sequence[str]) -> list[str]:
    """The warnings for prompts of a generated task (``env=addition|sort|countdown``) that its model never saw: one
    longer than the task's prompts (a 4-digit sum asked of a 2-digit model). A prompt with a character the task never
    writes is refused (ValueError), whatever the model's tokenizer reads: TinyGPT's vocabulary is these characters."""
    notes = []
    for prompt in prompts:
        outside = sorted(set(prompt) - set(puzzle.chars))
        if outside:
            raise ValueError(
                f"prompt {prompt!r}: character {outside[0]!r} is not in the vocabulary {puzzle.chars!r} of env={task}"
            )
        if len(prompt) > puzzle.max_prompt_chars:
            notes.append(
                f"prompt {prompt!r} is longer than env={task}'s ({puzzle.max_prompt_chars} characters at most): the "
                "model was trained on shorter problems, and its completion may be wrong"
            )
    return notes


def _is_messages(value: Any) -> bool:
    """One prompt as a message list (a list of mappings), not a batch of prompts."""
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) for m in value)


class RewardModelPyfunc:
    """A reward model's MLflow Model (``pgcli rm``): (prompt, completion) pairs in, rewards out."""

    def __init__(self, model_dir: Path) -> None:
        import torch

        from pgcli.config.saved_agent import agent_config, read_agent_spec
        from pgcli.lm.load import make_text_task
        from pgcli.lm.reward_model import load_reward_model

        spec = read_agent_spec(model_dir)
        cfg = agent_config(spec)
        self.task = make_text_task(cfg.env, cfg.model, saved=spec, rows=False)  # a text env and model
        self.device = torch.device("cpu")
        self.model = load_reward_model(self.task, cfg.model, self.device, model_dir)

    def predict(self, model_input: Any, params: dict[str, Any] | None = None) -> np.ndarray:
        """Rewards [B] (float64) of completions (as the task writes them, no EOS) given their prompts: a DataFrame
        with ``prompt`` and ``completion`` columns, or a list of (prompt, completion) pairs."""
        import pandas as pd

        from pgcli.lm.reward_model import score_texts

        if isinstance(model_input, pd.DataFrame):
            missing = {"prompt", "completion"} - set(model_input.columns)
            if missing:
                raise ValueError(
                    f"a reward model scores a DataFrame with columns prompt and completion (missing "
                    f"{', '.join(sorted(missing))})"
                )
            pairs = list(zip(model_input["prompt"], model_input["completion"], strict=True))
        else:
            pairs = [tuple(row) for row in model_input]
            if any(len(row) != 2 for row in pairs):
                raise ValueError("a reward model scores (prompt, completion) pairs")
        prompts, completions = [str(p) for p, _ in pairs], [str(c) for _, c in pairs]
        return score_texts(self.model, self.task.vocab, prompts, completions, self.device)


def _load_pyfunc(data_path: str) -> AgentPyfunc | TextPyfunc | RewardModelPyfunc:
    """MLflow's loader-module entry point: ``data_path`` is the model directory."""
    from pgcli.config.saved_agent import read_agent_spec

    model_dir = Path(data_path)
    spec = read_agent_spec(model_dir)
    if spec.get("backend") != "text":
        return AgentPyfunc(model_dir)
    return RewardModelPyfunc(model_dir) if spec.get("algo") == "rm" else TextPyfunc(model_dir)
