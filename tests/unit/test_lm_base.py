"""The text-RL trainers' base (pgcli.algo.lm_base): the one place that builds the KL reference, the trainers taking it
as given, and the checkpoint's state dicts by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_lm_trainers import CONFIGS, CPU, Sampling, make_policy, make_task

from pgcli.algo.checkpoint import MODEL_FILE
from pgcli.algo.lm_base import kl_reference
from pgcli.algo.lm_grpo import LMGRPO
from pgcli.algo.lm_ppo import LMPPO
from pgcli.config import RMConfig, SFTConfig


@pytest.mark.parametrize("algo", ["grpo", "rloo", "reinforce_pp", "ppo_lm"])
def test_a_kl_term_without_init_gets_a_frozen_copy_of_the_starting_policy(algo: str):
    policy = make_policy(make_task())
    reference = kl_reference(CONFIGS[algo](beta=0.04), policy, None)
    assert reference is not None and reference is not policy
    assert not reference.training and not any(p.requires_grad for p in reference.parameters())
    assert all(p.requires_grad for p in policy.parameters())  # the policy itself is untouched
    for (name, ours), (_, theirs) in zip(reference.state_dict().items(), policy.state_dict().items(), strict=True):
        assert torch.equal(ours, theirs), name


def test_a_kl_term_with_init_gets_the_init_reference_and_no_kl_term_gets_none():
    task = make_task()
    policy, init = make_policy(task), make_policy(task)
    assert kl_reference(CONFIGS["grpo"](beta=0.04), policy, init) is init
    assert kl_reference(CONFIGS["grpo"](beta=0.0), policy, init) is None
    assert kl_reference(CONFIGS["ppo_lm"](beta=0.0), policy, None) is None


def test_sft_and_the_reward_model_get_the_init_model_as_it_is():
    task = make_task()
    policy, init = make_policy(task), make_policy(task)
    for cfg in (SFTConfig(), RMConfig()):
        assert kl_reference(cfg, policy, init) is init
        assert kl_reference(cfg, policy, None) is None


@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_a_trainer_refuses_a_reference_that_does_not_fit_its_kl_term(beta: float):
    task = make_task()
    policy = make_policy(task)
    wrong = None if beta > 0 else make_policy(task)
    with pytest.raises(ValueError, match=f"algo.beta={beta} takes"):
        LMGRPO(
            CONFIGS["grpo"](beta=beta), task=task, policy=policy, reference=wrong, model=Sampling(), seed=0, device=CPU
        )


@pytest.mark.parametrize(
    ("algo", "keys"),
    [
        ("grpo", ["policy", "optimizer", "reference"]),
        ("ppo_lm", ["policy", "value", "optimizer", "vf_optimizer", "reference"]),
    ],
)
def test_the_checkpoint_holds_each_trainers_state_dicts_by_name(algo: str, keys: list[str], tmp_path: Path):
    task = make_task()
    policy = make_policy(task)
    cfg = CONFIGS[algo]()
    trainer_class = LMPPO if algo == "ppo_lm" else LMGRPO
    trainer = trainer_class(
        cfg, task=task, policy=policy, reference=kl_reference(cfg, policy, None), model=Sampling(), seed=0, device=CPU
    )
    trainer.save(tmp_path)
    assert list(torch.load(tmp_path / MODEL_FILE, weights_only=True)) == keys
