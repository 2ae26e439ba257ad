"""TinyGPT (docs/lm.md, "Model (`model=tiny_gpt`)"): the key/value cache changes nothing, left padding changes
nothing, log-probs match."""

from __future__ import annotations

import pytest
import torch

from pgcli.lm.model import TinyGPT, TinyGPTSizes, _sample, completion_logprobs, generate, load_policy, save_policy

V, EOS, PAD = 12, 2, 0


def tiny(seed: int = 0, max_len: int = 24) -> TinyGPT:
    torch.manual_seed(seed)
    model = TinyGPT(
        TinyGPTSizes(vocab_size=V, max_len=max_len, n_layers=2, n_heads=2, d_model=16, d_ff=32, init_std=0.5)
    )
    return model.eval()


def left_padded() -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.tensor([[0, 0, 1, 5, 6, 7], [1, 4, 3, 9, 5, 8], [0, 0, 0, 1, 10, 11]])
    return tokens, tokens != 0


def generate_without_cache(model, prompt, mask, *, max_new_tokens, temperature, top_p, generator):
    """The reference: recompute the whole sequence every step (no cache), same sampling calls."""
    tokens, masks = prompt, mask
    done = torch.zeros(prompt.shape[0], dtype=torch.bool)
    out, out_mask = [], []
    for _ in range(max_new_tokens):
        logits = model(tokens, masks)[:, -1]
        nxt = _sample(logits, temperature, top_p, generator).masked_fill(done, PAD)
        out.append(nxt)
        out_mask.append(~done)
        tokens = torch.cat([tokens, nxt[:, None]], 1)
        masks = torch.cat([masks, ~done[:, None]], 1)
        done = done | (nxt == EOS)
        if bool(done.all()):
            break
    return torch.stack(out, 1), torch.stack(out_mask, 1)


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9), (0.0, 1.0)])
def test_kv_cache_generation_gives_the_tokens_of_full_recomputation(temperature, top_p):
    model = tiny()
    prompt, mask = left_padded()
    got = generate(
        model,
        prompt,
        mask,
        max_new_tokens=10,
        eos_id=EOS,
        temperature=temperature,
        top_p=top_p,
        generator=torch.Generator().manual_seed(3),
    )
    ref_tokens, ref_mask = generate_without_cache(
        model,
        prompt,
        mask,
        max_new_tokens=10,
        temperature=temperature,
        top_p=top_p,
        generator=torch.Generator().manual_seed(3),
    )
    assert torch.equal(got.tokens, ref_tokens)
    assert torch.equal(got.mask, ref_mask)
    assert got.tokens.shape[1] >= 3  # something was generated beyond a token or two


def test_generation_layout_pad_after_eos():
    model = tiny(seed=1)
    prompt, mask = left_padded()
    gen = generate(model, prompt, mask, max_new_tokens=12, eos_id=EOS, generator=torch.Generator().manual_seed(0))
    for row, row_mask in zip(gen.tokens.tolist(), gen.mask.tolist(), strict=True):
        n = sum(row_mask)
        assert row_mask == [True] * n + [False] * (len(row) - n)  # a prefix
        if EOS in row:
            assert row.index(EOS) == n - 1 and all(t == PAD for t in row[n:])
        else:
            assert n == len(row) == 12


def test_left_padding_does_not_change_a_rows_logits():
    model = tiny()
    row = torch.tensor([[1, 5, 6, 7, 3]])
    alone = model(row, torch.ones_like(row, dtype=torch.bool))[0]  # [5, V]
    for pad in (1, 4):
        padded = torch.cat([torch.zeros(1, pad, dtype=torch.long), row], 1)
        logits = model(padded, padded != 0)[0, pad:]
        assert torch.allclose(logits, alone, atol=1e-5)
    # and in a batch beside a longer row
    batch = torch.tensor([[0, 0, 1, 5, 6, 7, 3], [1, 4, 4, 4, 4, 4, 4]])
    assert torch.allclose(model(batch, batch != 0)[0, 2:], alone, atol=1e-5)


def test_positions_come_from_the_mask_not_the_column():
    """Shifting a row right (more padding) gives the same logits; shifting without masking the pads does not."""
    model = tiny()
    row = torch.tensor([[0, 0, 1, 5, 6]])
    unmasked = model(row, torch.ones_like(row, dtype=torch.bool))[0, 2:]
    masked = model(row, row != 0)[0, 2:]
    assert not torch.allclose(unmasked, masked, atol=1e-3)


def test_completion_logprobs_match_step_by_step_softmax():
    model = tiny()
    prompt, mask = left_padded()
    gen = generate(
        model, prompt, mask, max_new_tokens=6, eos_id=EOS, temperature=0.8, generator=torch.Generator().manual_seed(1)
    )
    logp, ent = completion_logprobs(model, prompt, mask, gen.tokens, gen.mask, temperature=0.8)
    assert logp.shape == ent.shape == gen.tokens.shape
    for b in range(prompt.shape[0]):
        for t in range(gen.tokens.shape[1]):
            if not gen.mask[b, t]:
                continue
            seq = torch.cat([prompt[b : b + 1], gen.tokens[b : b + 1, :t]], 1)
            smask = torch.cat([mask[b : b + 1], gen.mask[b : b + 1, :t]], 1)
            dist = torch.log_softmax(model(seq, smask)[0, -1] / 0.8, -1)
            assert logp[b, t].item() == pytest.approx(dist[gen.tokens[b, t]].item(), abs=1e-5)
            assert ent[b, t].item() == pytest.approx(-(dist.exp() * dist).sum().item(), abs=1e-5)
    assert torch.isfinite(logp).all() and torch.isfinite(ent).all()


def test_completion_logprobs_are_differentiable():
    model = tiny()
    prompt, mask = left_padded()
    completion = torch.tensor([[3, 2, 0], [4, 5, 2], [6, 2, 0]])
    cmask = torch.tensor([[True, True, False], [True, True, True], [True, True, False]])
    logp, _ = completion_logprobs(model, prompt, mask, completion, cmask)
    (logp * cmask).sum().backward()
    assert model.tok_emb.weight.grad is not None and model.tok_emb.weight.grad.abs().sum() > 0


def test_top_p_keeps_only_the_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    g = torch.Generator().manual_seed(0)
    drawn = {int(_sample(logits, 1.0, 0.7, g)) for _ in range(300)}
    assert drawn == {0, 1}  # 0.5 < 0.7 <= 0.5 + 0.3
    assert {int(_sample(logits, 1.0, 0.1, g)) for _ in range(50)} == {0}
    assert int(_sample(logits, 0.0, 1.0, g)) == 0


def test_sampling_is_seeded():
    model = tiny()
    prompt, mask = left_padded()
    a = generate(model, prompt, mask, max_new_tokens=8, eos_id=EOS, generator=torch.Generator().manual_seed(5))
    b = generate(model, prompt, mask, max_new_tokens=8, eos_id=EOS, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a.tokens, b.tokens)


def test_too_long_a_sequence_is_an_error():
    model = tiny(max_len=8)
    tokens = torch.ones(1, 9, dtype=torch.long)
    with pytest.raises(ValueError, match="max_len 8"):
        model(tokens, tokens != 0)


def test_save_and_load_policy(tmp_path):
    a, b = tiny(seed=0), tiny(seed=1)
    save_policy(a, tmp_path)
    load_policy(b, tmp_path)
    prompt, mask = left_padded()
    assert torch.equal(a(prompt, mask), b(prompt, mask))


def shared_prompt_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """3 distinct left-padded prompts, 5 completions (rows) of them, one with a single real token."""
    prompt, mask = left_padded()
    index = torch.tensor([2, 0, 0, 1, 2])
    completion = torch.tensor([[3, 2, 0, 0], [4, 5, 6, 2], [2, 0, 0, 0], [6, 7, 2, 0], [5, 5, 5, 5]])
    return prompt, mask, index, completion, completion != 0


def test_each_prompt_run_once_gives_the_whole_sequence_pass():
    """TinyGPT's completion_hidden (each distinct prompt once, its keys gathered per row) against CausalLM's default
    (every row's prompt and completion in one sequence): the same log-probs, entropies and gradients."""
    prompt, mask, index, completion, cmask = shared_prompt_batch()
    results = []
    for shared in (True, False):
        model = tiny().train()
        if shared:
            logp, ent = completion_logprobs(model, prompt, mask, completion, cmask, prompt_index=index, temperature=0.7)
        else:
            logp, ent = completion_logprobs(model, prompt[index], mask[index], completion, cmask, temperature=0.7)
        ((logp + 0.1 * ent) * cmask).sum().backward()
        results.append((logp, ent, [p.grad.clone() for p in model.parameters()]))
    (logp, ent, grads), (full_logp, full_ent, full_grads) = results
    assert torch.allclose(logp[cmask], full_logp[cmask], atol=1e-5)
    assert torch.allclose(ent[cmask], full_ent[cmask], atol=1e-5)
    # gradients of about 10 here (init_std 0.5): float32 summation order moves them by about 1e-5
    assert all(torch.allclose(g, h, rtol=1e-4, atol=1e-4) for g, h in zip(grads, full_grads, strict=True))
    assert logp[cmask].std() > 0.1  # not a degenerate model


def test_each_prompt_run_once_matches_the_default_of_any_causal_lm():
    """CausalLM.completion_hidden, the fallback other models (Hugging Face) take, on the same shared batch."""
    prompt, mask, index, completion, cmask = shared_prompt_batch()
    model = tiny()
    with torch.no_grad():
        shared = model.completion_hidden(prompt, mask, index, completion, cmask)
        default = super(TinyGPT, model).completion_hidden(prompt, mask, index, completion, cmask)
    assert shared.shape == default.shape == (5, 4, 16)
    assert torch.allclose(shared, default, atol=1e-5)


def test_one_token_completions_read_only_the_prompt():
    prompt, mask = left_padded()
    completion = torch.tensor([[2], [3], [2]])
    model = tiny()
    logp, _ = completion_logprobs(model, prompt, mask, completion, completion != 0, prompt_index=torch.arange(3))
    full, _ = completion_logprobs(model, prompt, mask, completion, completion != 0)
    assert torch.allclose(logp, full, atol=1e-5)


@pytest.mark.parametrize(("temperature", "top_p"), [(0.8, 1.0), (1.3, 0.7), (0.0, 1.0)])
def test_generation_logprobs_are_those_of_a_forward_pass(temperature, top_p):
    """What trainers take as pi_old without a pass of their own (CausalLM.sampler_logprobs): the tempered softmax of
    the whole distribution (top-p and greedy aside, as completion_logprobs), 0.0 on padding."""
    model = tiny()
    prompt, mask = left_padded()
    gen = generate(
        model,
        prompt,
        mask,
        max_new_tokens=6,
        eos_id=EOS,
        temperature=temperature,
        top_p=top_p,
        generator=torch.Generator().manual_seed(2),
    )
    logp, _ = completion_logprobs(model, prompt, mask, gen.tokens, gen.mask, temperature=temperature)
    assert model.sampler_logprobs and gen.logprobs.dtype == torch.float32
    assert torch.allclose(gen.logprobs[gen.mask], logp[gen.mask], atol=1e-5)
    assert (gen.logprobs[~gen.mask] == 0).all() and gen.logprobs[gen.mask].std() > 0.1
