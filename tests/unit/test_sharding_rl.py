"""Sharded parameters for the GRPO family (``hardware.shard=params``; docs/distributed.md, "Models that do not fit
one device"): every rank of a sharded model takes part in each of its forward passes, so

- a sharded model's generation takes as many decoding steps on every rank as on the rank whose sequences end last:
  rank 0's rows all end at the first token and rank 1's never do, and both ranks return ``max_new_tokens`` columns
  (rank 1's the tokens one unsharded process samples); without the lockstep rank 0 would leave while rank 1 waits
  for it in the next step's gathers, and the run fails at the collectives' timeout (``TIMEOUT_S``) instead of
  finishing;
- one GRPO update (beta > 0, micro-batches of 2, log-probabilities a column at a time) of the tiny random
  ``model=hf`` on a fixed batch, sharded over 2 gloo ranks that each train half of it, moves the parameters as one
  unsharded process does on the whole batch, with LoRA (the reference: the shards with the adapters off) and without
  (the reference: a frozen copy of the starting policy, sharded alike by the run's builder,
  :func:`pgcli.training.sharded.shard_text_models`). Rank 0's completions are all short and rank 1's long, so the
  ranks' micro-batches differ in width; the reduced metrics are the one process's, and the reference gathered on
  rank 0 is the starting policy.

Tolerance: atol 1e-6, rtol 1e-5 on every parameter and metric (float32 summation order). The optimiser is SGD (as in
test_distributed.py: Adam's first step is about lr * sign(g)).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from pgcli.algo.lm_base import kl_reference
from pgcli.algo.lm_grpo import LMGRPO
from pgcli.algo.lm_rollout import CompletionBatch
from pgcli.config import AdditionEnvConfig, GRPOConfig, HFModelConfig
from pgcli.config.compose import compose_train_config
from pgcli.errors import ConfigError
from pgcli.hardware import distributed, sharding
from pgcli.lm.hf import AdapterOff, load_hf_policy
from pgcli.lm.load import make_text_task
from pgcli.lm.model import generate
from pgcli.lm.tasks import encode_prompts
from pgcli.training.sharded import shard_text_models
from pgcli.training.text_parts import TextParts

ATOL, RTOL = 1e-6, 1e-5
WORLD = 2
CPU = torch.device("cpu")
TIMEOUT_S = 60
"""The collectives' timeout: a rank left waiting for another fails the test by then."""
NEW_TOKENS = 5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def model_config(path: Path, lora: int) -> HFModelConfig:
    cfg = HFModelConfig(path=str(path), logprob_chunk=2, micro_batch=2)  # several passes per minibatch and row
    cfg.lora.r = lora
    return cfg


def grpo(path: Path, lora: int, *, shard: bool) -> LMGRPO:
    """GRPO (beta 0.04, one minibatch of the whole batch) on the tiny model, sharded as the run's builder does."""
    model = model_config(path, lora)
    task = make_text_task(AdditionEnvConfig(), model)
    torch.manual_seed(0)  # the same weights and LoRA adapters on every rank
    policy = load_hf_policy(model, CPU)
    init_reference = AdapterOff(policy) if lora else None
    cfg = GRPOConfig(group_size=4, n_groups=4, batch_size=16, beta=0.04)
    reference = kl_reference(cfg, policy, init_reference)
    parts = TextParts(task, task, None, policy, init_reference, {}, False)
    gathered = shard_text_models(cfg, parts, reference, CPU) if shard else None
    trainer = LMGRPO(cfg, task=task, policy=policy, reference=reference, model=model, seed=0, device=CPU)
    trainer.optimizer = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=0.5)
    if gathered is not None:
        trainer.gathered = gathered(trainer.optimizer)
    return trainer


def fixed_batch(trainer: LMGRPO) -> CompletionBatch:
    """16 completions (4 prompts x 4) of random tokens: rows 0-7 (rank 0's) end after 1 or 2 tokens, rows 8-15
    (rank 1's) after 4 to 6; rewards that vary within each group."""
    g = torch.Generator().manual_seed(0)
    problems = trainer.task.sample(trainer.prompt_rng, 4)
    repeated = [p for p in problems for _ in range(4)]
    prompt_tokens, prompt_mask = encode_prompts(trainer.task.vocab, repeated, CPU)
    lengths = torch.tensor([1, 2, 1, 2, 2, 1, 1, 2, 4, 6, 5, 6, 6, 4, 5, 6])
    mask = torch.arange(6)[None, :] < lengths[:, None]
    tokens = torch.randint(3, 100, (16, 6), generator=g).masked_fill(~mask, trainer.task.vocab.pad_id)
    group_ids = torch.arange(4).repeat_interleave(4)
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0] * 4)
    return CompletionBatch(
        prompt_tokens=prompt_tokens,
        prompt_mask=prompt_mask,
        tokens=tokens,
        mask=mask.float(),
        rewards=rewards,
        correct=rewards > 0.5,
        group_ids=group_ids,
        sample_seconds=0.0,
        reward_parts={},  # a plain dict: saved to a file
        prompt_ids=group_ids,
    )


def rank_share(batch: CompletionBatch, rank: int) -> CompletionBatch:
    """Rank ``rank``'s 2 groups of ``batch``, group and prompt ids from 0 (its columns: all 6, as a lockstep
    generation gives every rank)."""
    rows = torch.arange(rank * 8, (rank + 1) * 8)
    fields = {
        name: value[rows] if isinstance(value, torch.Tensor) and value.shape[:1] == (16,) else value
        for name, value in batch._asdict().items()
    }
    fields["group_ids"] = batch.group_ids[rows] - 2 * rank
    fields["prompt_ids"] = batch.group_ids[rows] - 2 * rank
    return CompletionBatch(**fields)


def generation(trainer: LMGRPO, rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sampled completions of 3 prompts (the sampling generator seeded with 1): on rank 0 every token is a stop token
    (its rows end at the first), on rank 1 none is (its rows run ``NEW_TOKENS``); the tokens, their mask and the
    generator's state after."""
    problems = trainer.task.sample(np.random.default_rng(1), 3)
    prompt_tokens, prompt_mask = encode_prompts(trainer.task.vocab, problems, CPU)
    stops = list(range(trainer.task.vocab.size)) if rank == 0 else [-1]
    generator = torch.Generator().manual_seed(1)
    out = generate(
        trainer.policy, prompt_tokens, prompt_mask, max_new_tokens=NEW_TOKENS, eos_id=stops, generator=generator
    )
    return out.tokens, out.mask, generator.get_state()


def _rank_main(rank: int, port: int, model: Path, lora: int, data: Path, out: Path) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD))
    torch.set_num_threads(1)
    distributed.init(CPU, timeout_s=TIMEOUT_S)
    try:
        trainer = grpo(model, lora, shard=True)
        tokens, mask, sampler = generation(trainer, rank)
        stats = trainer._update(rank_share(torch.load(data, weights_only=False), rank))
        reduced = distributed.mean_stats(stats)
        assert trainer.gathered is not None
        trainer.gathered.gather()
        result = {
            "tokens": tokens,
            "mask": mask,
            "sampler": sampler,
            "stats": reduced,
            "sharded": all(sharding.is_shard(p) for p in trainer.policy.parameters()),
            "twin": None if trainer.gathered.twin is None else trainer.gathered.twin.state_dict(),
            "reference": trainer.gathered.states.get("reference"),
        }
        torch.save(result, out / f"rank{rank}.pt")
    finally:
        distributed.teardown()


def run_on_two_ranks(model: Path, lora: int, data: Path, out: Path) -> list[dict]:
    mp.spawn(_rank_main, args=(free_port(), model, lora, data, out), nprocs=WORLD, join=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


@pytest.mark.parametrize("lora", [0, 4])
def test_a_sharded_grpo_update_over_two_ranks_is_the_one_process_update(lora: int, tiny_hf_model: Path, tmp_path):
    one = grpo(tiny_hf_model, lora, shard=False)
    start = {k: v.clone() for k, v in one.policy.state_dict().items()}
    batch = fixed_batch(one)
    torch.save(batch, tmp_path / "batch.pt")
    expected_tokens, _, _ = generation(one, 1)
    ended_first, _, after_one_draw = generation(one, 0)
    assert ended_first.shape[1] == 1  # one process stops once its rows have ended
    stats = one._update(batch)
    expected = one.policy.state_dict()
    assert any(not torch.equal(expected[k], start[k]) for k in start)  # the update moved the policy
    assert stats["train/kl_ref"] == stats["train/kl_ref"]  # a reference pass ran (nan without one)

    ranks = run_on_two_ranks(tiny_hf_model, lora, tmp_path / "batch.pt", tmp_path)

    assert all(r["sharded"] for r in ranks)
    for r in ranks:  # every rank took NEW_TOKENS decoding steps
        assert r["tokens"].shape == (3, NEW_TOKENS)
    assert ranks[0]["mask"][:, 0].all() and not ranks[0]["mask"][:, 1:].any()  # ended at the first token
    assert torch.equal(ranks[0]["tokens"][:, :1], ended_first)
    assert torch.equal(ranks[0]["sampler"], after_one_draw)  # it waited without drawing: the one-process sampler
    assert torch.equal(ranks[1]["tokens"], expected_tokens)
    got = ranks[0]["twin"]
    assert ranks[1]["twin"] is None and set(got) == set(expected)
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value, atol=ATOL, rtol=RTOL, msg=key)
    for r in ranks:
        assert set(r["stats"]) == set(stats)
        for key, value in stats.items():
            assert r["stats"][key] == pytest.approx(value, rel=RTOL, abs=ATOL, nan_ok=True), key
    if lora:  # the reference is the shards with their adapters off: nothing of its own to gather
        assert ranks[0]["reference"] is None
    else:  # the frozen copy of the starting policy, sharded and gathered back whole
        assert set(ranks[0]["reference"]) == set(start)
        for key, value in start.items():
            assert torch.equal(ranks[0]["reference"][key], value), key


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algo=ppo_lm", "env=addition"], "algo=ppo_lm does not train sharded yet"),
        (["algo=rm", "env=addition"], "algo=rm does not train sharded yet"),
        (["algo=grpo", "env=countdown_tool", "algo.batch_size=8"], "a multi-turn task"),
    ],
)
def test_what_does_not_shard_yet_is_one_line(overrides: list[str], message: str, tiny_hf_model: Path):
    shard = ["model=hf", f"model.path={tiny_hf_model}", "hardware.processes=2", "hardware.shard=params"]
    with pytest.raises(ConfigError, match=message) as err:
        compose_train_config([*overrides, *shard])
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("algo", ["grpo", "rloo", "reinforce", "gspo", "reinforce_pp"])
def test_the_grpo_family_composes_sharded(algo: str, tiny_hf_model: Path):
    shard = ["model=hf", f"model.path={tiny_hf_model}", "hardware.processes=2", "hardware.shard=params"]
    cfg = compose_train_config([f"algo={algo}", "env=addition", *shard])
    assert cfg.hardware.shard == "params"
