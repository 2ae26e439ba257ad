"""Sharded parameters (``hardware.shard=params``, pgcli.hardware.sharding; docs/distributed.md, "Models that do not
fit one device"): two SFT steps of the tiny random ``model=hf`` on a fixed batch, sharded with FSDP2 over 2 gloo ranks
that each train half of it, move the parameters as one unsharded process does on the whole batch; each rank holds
about half of the parameter elements; a LoRA policy's frozen base shards too and its optimiser holds state for the
adapters alone; the whole state gathered on rank 0 (weights and optimiser, in ``optimizer.state_dict()``'s layout)
is the one process's, and loads back into the shards; the config's rules for hardware.shard.

Tolerance: atol 1e-6, rtol 1e-5 on every parameter (float32 summation order: the ranks sum their shares of the
batch's loss in another order than one pass). The optimiser of the equality test is SGD (as in test_distributed.py:
Adam's first step is about lr * sign(g), whose sign float noise around 0 would flip).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from pgcli.algo.sft import SFT
from pgcli.config import HFModelConfig, SFTConfig
from pgcli.config.compose import compose_train_config
from pgcli.errors import ConfigError
from pgcli.hardware import distributed, sharding
from pgcli.lm.hf import AdapterOff, load_hf_policy, shard_hf_policy

ATOL, RTOL = 1e-6, 1e-5
WORLD = 2
CPU = torch.device("cpu")
SHARD = ["hardware.shard=params"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fixed_batches() -> list[tuple[torch.Tensor, ...]]:
    """Two batches of 8 rows: prompts [8, 5] and completions [8, 4] of random token ids, the rows' trained tokens
    differing in number (a mean of the ranks' own token means would not be the batch's)."""
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(2):
        prompts = torch.randint(3, 120, (8, 5), generator=g)
        completion = torch.randint(3, 120, (8, 4), generator=g)
        lengths = torch.tensor([4, 1, 3, 2, 4, 4, 2, 1])
        trained = torch.arange(4)[None, :] < lengths[:, None]
        out.append((prompts, torch.ones_like(prompts, dtype=torch.bool), completion, trained, trained))
    return out


def sft(model: Path, *, lora: int, shard: bool, sgd: bool = True) -> SFT:
    cfg = HFModelConfig(path=str(model))
    cfg.lora.r = lora
    torch.manual_seed(0)  # the same LoRA adapters on every rank
    policy = load_hf_policy(cfg, CPU)
    if shard:
        shard_hf_policy(policy, CPU)
    trainer = SFT(
        SFTConfig(batch_size=8, warmup_steps=0),
        task=None,  # type: ignore[arg-type]  # the batches are fixed
        policy=policy,
        reference=None,
        model=cfg,
        seed=0,
        device=CPU,
    )
    if sgd:
        trainer.optimizer = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=0.5)
    return trainer


def train(trainer: SFT, batches: list[tuple[torch.Tensor, ...]], rank: int, world: int) -> None:
    rows = 8 // world
    for whole in batches:
        share = tuple(t[rank * rows : (rank + 1) * rows] for t in whole)
        trainer._batch = lambda share=share: share  # type: ignore[method-assign,misc]
        trainer._step()


def _rank_main(rank: int, port: int, model: Path, lora: int, out: Path) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD))
    torch.set_num_threads(1)
    distributed.init(CPU, timeout_s=120)
    try:
        trainer = sft(model, lora=lora, shard=True)
        policy = trainer.policy
        params = list(policy.parameters())
        local = sum(p.to_local().numel() for p in params)
        sharded = all(sharding.is_shard(p) for p in params)
        train(trainer, fixed_batches(), rank, WORLD)
        state = sharding.full_state(policy)
        # the trainer's own AdamW: its state, gathered in optimizer.state_dict()'s layout
        adam = sft(model, lora=lora, shard=True, sgd=False)
        train(adam, fixed_batches()[:1], rank, WORLD)
        adam_local = [k for k, v in adam.optimizer.state.items() if v]
        adam_trained = [p.requires_grad for p in adam_local]
        adam_state = sharding.full_optimizer_state(adam.policy, adam.optimizer)
        # the gathered state loads back into fresh shards
        fresh = sft(model, lora=lora, shard=True, sgd=False)
        sharding.load_full_state(
            fresh.policy, state if rank == 0 else None, fresh.optimizer, adam_state if rank == 0 else None
        )
        reloaded = sharding.full_state(fresh.policy)
        reference = None
        if lora:  # the KL reference of a LoRA run: the sharded policy with its adapters off
            tokens, mask = fixed_batches()[0][0][:2], fixed_batches()[0][1][:2]
            with torch.no_grad():
                reference = AdapterOff(policy).hidden(tokens, mask)
        torch.save(
            {
                "state": state,
                "reloaded": reloaded,
                "local": local,
                "total": sum(p.numel() for p in params),
                "sharded": sharded,
                "adam_trained": adam_trained,
                "adam_state": adam_state,
                "reference": reference,
            },
            out / f"rank{rank}.pt",
        )
    finally:
        distributed.teardown()


def run_on_two_ranks(model: Path, lora: int, out: Path) -> list[dict]:
    mp.spawn(_rank_main, args=(free_port(), model, lora, out), nprocs=WORLD, join=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


@pytest.mark.parametrize("lora", [0, 4])
def test_sharded_sft_steps_over_two_ranks_are_the_one_process_steps(lora: int, tiny_hf_model: Path, tmp_path: Path):
    one = sft(tiny_hf_model, lora=lora, shard=False)
    start = {k: v.clone() for k, v in one.policy.state_dict().items()}
    train(one, fixed_batches(), 0, 1)
    expected = one.policy.state_dict()
    assert any(not torch.equal(expected[k], start[k]) for k in start)  # the steps moved the policy
    ranks = run_on_two_ranks(tiny_hf_model, lora, tmp_path)
    got = ranks[0]["state"]
    assert set(got) == set(expected)
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value, atol=ATOL, rtol=RTOL, msg=key)
    assert ranks[1]["state"] == {}  # the whole state is rank 0's alone
    for key, value in got.items():
        assert torch.equal(ranks[0]["reloaded"][key], value), key
    total = ranks[0]["total"]
    assert sum(r["local"] for r in ranks) == total
    for r in ranks:
        assert r["sharded"]  # every parameter, a LoRA run's frozen base included, is a shard
        assert abs(r["local"] / total - 0.5) < 0.05  # about half of the elements on each rank
        assert r["adam_trained"] and all(r["adam_trained"])  # optimiser state only for the trained shards
    one_adam = sft(tiny_hf_model, lora=lora, shard=False, sgd=False)
    train(one_adam, fixed_batches()[:1], 0, 1)
    layout = one_adam.optimizer.state_dict()
    gathered = ranks[0]["adam_state"]
    assert gathered["param_groups"][0]["params"] == layout["param_groups"][0]["params"]
    assert set(gathered["state"]) == set(layout["state"])
    for i, state in layout["state"].items():
        torch.testing.assert_close(gathered["state"][i]["exp_avg"], state["exp_avg"], atol=ATOL, rtol=RTOL)
    if lora:
        base = sft(tiny_hf_model, lora=0, shard=False).policy
        tokens, mask = fixed_batches()[0][0][:2], fixed_batches()[0][1][:2]
        with torch.no_grad():
            torch.testing.assert_close(ranks[0]["reference"], base.hidden(tokens, mask), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["hardware.shard=params"], "add hardware.processes=N"),
        (["hardware.shard=params", "hardware.processes=2"], "shards model=hf; model=tiny_gpt"),
        (["hardware.shard=everything", "hardware.processes=2"], "hardware.shard"),
    ],
)
def test_hardware_shard_rules_are_one_line(overrides: list[str], message: str):
    with pytest.raises(ConfigError, match=message):
        compose_train_config(["algo=sft", "env=addition", *overrides])


def test_hardware_shard_trains_sft_and_the_grpo_family_only(tiny_hf_model: Path):
    with pytest.raises(ConfigError, match="algo=ppo_lm does not train sharded yet"):
        compose_train_config(
            ["algo=ppo_lm", "env=addition", "model=hf", f"model.path={tiny_hf_model}", "hardware.processes=2", *SHARD]
        )
