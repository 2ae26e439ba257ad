"""The SFT trainer: the loss it minimises, its warm-up, exact continuation from a checkpoint, and micro-batches
giving the batch's step."""

from __future__ import annotations

import pytest
import torch

from pgcli.algo.sft import SFT
from pgcli.config import LMModelConfig, SFTConfig
from pgcli.lm.model import TinyGPT, TinyGPTSizes, completion_logprobs
from pgcli.lm.tasks import Sort, Task, encode_completions, encode_prompts


def make_sft(seed: int = 0, *, micro_batch: int = 0, **cfg) -> SFT:
    task = Task("sort", Sort(3), n_eval=10, eval_seed=0)
    torch.manual_seed(0)
    policy = TinyGPT(TinyGPTSizes(vocab_size=task.vocab.size, max_len=12, n_layers=1, n_heads=2, d_model=16, d_ff=32))
    return SFT(
        SFTConfig(**{"batch_size": 16, "warmup_steps": 32, **cfg}),
        task=task,
        policy=policy,
        reference=None,
        model=LMModelConfig(micro_batch=micro_batch),
        seed=seed,
        device=torch.device("cpu"),
    )


def test_the_loss_is_the_mean_nll_of_the_demonstration_tokens():
    sft = make_sft()
    sft.cfg.learning_rate = 1e-12  # the step barely moves the weights: the reported loss is the one computed here
    state = sft.rng.bit_generator.state
    problems = sft.task.sample(sft.rng, 16)
    sft.rng.bit_generator.state = state
    prompts, pmask = encode_prompts(sft.task.vocab, problems)
    comp, cmask = encode_completions(sft.task.vocab, [p.answer for p in problems], sft.task.max_completion_len)
    with torch.no_grad():
        logp, _ = completion_logprobs(sft.policy, prompts, pmask, comp, cmask)
    expected = -logp[cmask].mean()
    assert cmask.sum() == 16 * 4  # 3 digits + EOS each
    assert sft._step()["train/loss"] == pytest.approx(float(expected), rel=1e-5)


def test_learning_rate_warms_up_linearly():
    sft = make_sft(learning_rate=1e-3, warmup_steps=64)
    assert sft.learning_rate() == pytest.approx(1e-3 * 16 / 64)
    sft.steps = 48
    assert sft.learning_rate() == pytest.approx(1e-3)
    assert make_sft(warmup_steps=0).learning_rate() == pytest.approx(1e-3)


def test_steps_lower_the_loss_on_a_fixed_batch():
    sft = make_sft(learning_rate=3e-3, warmup_steps=0)
    state = sft.rng.bit_generator.state
    first = sft._step()["train/loss"]
    for _ in range(30):
        sft.rng.bit_generator.state = state  # the same 16 demonstrations every time
        last = sft._step()["train/loss"]
    assert last < 0.7 * first


def test_checkpoint_continues_exactly(tmp_path):
    a = make_sft(seed=3)
    for _ in range(3):
        a._step()
        a.steps += 16
    a.save(tmp_path / "ckpt")
    b = make_sft(seed=99)
    b.load(tmp_path / "ckpt")
    assert b.steps == 48
    for _ in range(2):
        assert a._step()["train/loss"] == b._step()["train/loss"]
    for x, y in zip(a.policy.parameters(), b.policy.parameters(), strict=True):
        assert torch.equal(x, y)


def test_micro_batches_give_the_batch_step_and_stats():
    # micro_batch=3 does not divide batch_size=16 (passes of 3, 3, 3, 3, 3, 1 demonstrations): the same step and stats
    # as the whole batch at once, up to float32 summation order (docs/lm.md, "Memory")
    whole, chunked = make_sft(micro_batch=0), make_sft(micro_batch=3)
    rows_per_pass: list[int] = []
    chunked.policy.tok_emb.register_forward_hook(lambda module, args, out: rows_per_pass.append(out.shape[0]))
    for sft in (whole, chunked):
        # SGD, not AdamW: Adam's first step is about lr * sign(g), and attention's key-bias gradient is float noise
        # around an exact 0 whose sign the summation order decides
        sft.optimizer = torch.optim.SGD(sft.policy.parameters(), lr=0.5)
    for _ in range(2):
        expected, got = whole._step(), chunked._step()
        assert got.keys() == expected.keys()
        for key, value in expected.items():
            assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    assert rows_per_pass == [3, 3, 3, 3, 3, 1] * 2
    for a, b in zip(whole.policy.parameters(), chunked.policy.parameters(), strict=True):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)
