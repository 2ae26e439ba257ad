"""Hugging Face causal LMs as text policies (docs/lm.md, "Hugging Face models"), on a random Llama written offline:
the key/value cache and left padding change nothing, chunked log-probs equal the plain ones, the tokenizer stops at
EOS or a newline, the adapter-off reference is the base model, and policy.pt holds the merged weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pgcli.config import HFModelConfig, LoRAConfig
from pgcli.errors import ConfigError
from pgcli.lm.hf import AdapterOff, HFCausalLM, check_hf_model, load_hf_policy, load_tokenizer, resolve_model_dir
from pgcli.lm.model import _sample, completion_logprobs, generate


def hf_config(path: Path, **kw) -> HFModelConfig:
    lora = kw.pop("lora", LoRAConfig(r=4, alpha=8.0))
    return HFModelConfig(path=str(path), lora=lora, **kw)


def policy(path: Path, *, r: int = 4, seed: int = 0, **kw) -> HFCausalLM:
    model = load_hf_policy(hf_config(path, lora=LoRAConfig(r=r, alpha=8.0), **kw), torch.device("cpu"))
    if r:  # LoRA's B starts at zero: give the adapters something to say
        torch.manual_seed(seed)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.data.normal_(0, 0.5)
    return model.eval()


def prompts(path: Path) -> tuple[torch.Tensor, torch.Tensor, object]:
    vocab = load_tokenizer(hf_config(path))
    rows = [vocab.encode_prompt(p) for p in ("12+34=", "5+6=", "1234+5678=")]
    width = max(map(len, rows))
    tokens = torch.full((3, width), vocab.pad_id)
    mask = torch.zeros((3, width), dtype=torch.bool)
    for i, row in enumerate(rows):
        tokens[i, width - len(row) :] = torch.tensor(row)
        mask[i, width - len(row) :] = True
    return tokens, mask, vocab


def test_kv_cache_generation_gives_the_tokens_of_full_recomputation(tiny_hf_model: Path):
    model = policy(tiny_hf_model)
    tokens, mask, vocab = prompts(tiny_hf_model)
    got = generate(
        model,
        tokens,
        mask,
        max_new_tokens=8,
        eos_id=vocab.stop_ids,
        temperature=1.0,
        generator=torch.Generator().manual_seed(3),
        pad_id=vocab.pad_id,
    )
    # the reference: the whole sequence recomputed at every step, the same sampling calls
    gen = torch.Generator().manual_seed(3)
    seq, seq_mask = tokens, mask
    done = torch.zeros(3, dtype=torch.bool)
    stops = torch.tensor(vocab.stop_ids)
    for step in range(got.tokens.shape[1]):
        nxt = _sample(model(seq, seq_mask)[:, -1], 1.0, 1.0, gen).masked_fill(done, vocab.pad_id)
        assert torch.equal(nxt, got.tokens[:, step])
        assert torch.equal(~done, got.mask[:, step])
        seq, seq_mask = torch.cat([seq, nxt[:, None]], 1), torch.cat([seq_mask, ~done[:, None]], 1)
        done = done | torch.isin(nxt, stops)
    assert got.tokens.shape[1] >= 2


def test_left_padding_does_not_change_a_rows_logits(tiny_hf_model: Path):
    model = policy(tiny_hf_model)
    tokens, mask, _ = prompts(tiny_hf_model)
    with torch.no_grad():
        padded = model(tokens, mask)
        for i in range(3):
            alone = model(tokens[i : i + 1, mask[i]], mask[i : i + 1, mask[i]])
            torch.testing.assert_close(padded[i, mask[i]], alone[0], atol=1e-5, rtol=1e-5)
    assert torch.isfinite(padded).all()  # pad positions too: no NaN leaks through masked keys


@pytest.mark.parametrize("chunk", [1, 3, 64])
def test_chunked_logprobs_equal_the_plain_ones_with_their_gradients(tiny_hf_model: Path, chunk: int):
    model = policy(tiny_hf_model)
    tokens, mask, vocab = prompts(tiny_hf_model)
    gen = generate(
        model,
        tokens,
        mask,
        max_new_tokens=6,
        eos_id=vocab.stop_ids,
        generator=torch.Generator().manual_seed(0),
        pad_id=vocab.pad_id,
    )
    results = []
    for size in (None, chunk):
        model.logprob_chunk = size
        model.zero_grad()
        logp, ent = completion_logprobs(model, tokens, mask, gen.tokens, gen.mask, temperature=0.7)
        (logp * gen.mask).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((logp.detach(), ent.detach(), grads))
    (lp_a, ent_a, g_a), (lp_b, ent_b, g_b) = results
    torch.testing.assert_close(lp_b, lp_a, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ent_b, ent_a, atol=1e-6, rtol=1e-5)
    assert g_a and g_a.keys() == g_b.keys() and all("lora_" in n for n in g_a)  # only the adapters train
    for name in g_a:
        torch.testing.assert_close(g_b[name], g_a[name], atol=1e-5, rtol=1e-4)  # float32 sums in another order


def test_the_reference_of_a_lora_run_is_the_base_model_and_stays_out_of_the_policy(tiny_hf_model: Path):
    model = policy(tiny_hf_model)
    base = load_hf_policy(hf_config(tiny_hf_model, lora=LoRAConfig(r=0)), torch.device("cpu")).eval()
    reference = AdapterOff(model).eval().requires_grad_(False)
    tokens, mask, _ = prompts(tiny_hf_model)
    with torch.no_grad():
        torch.testing.assert_close(reference(tokens, mask), base(tokens, mask))
        assert not torch.allclose(model(tokens, mask), base(tokens, mask))  # the adapters are back on after
    assert list(reference.parameters()) == []
    assert any(p.requires_grad for p in model.parameters())  # freezing the reference left the adapters trainable


def test_policy_pt_holds_the_merged_weights_a_fresh_base_loads(tiny_hf_model: Path):
    model = policy(tiny_hf_model)
    state = model.policy_state()
    assert not any("lora_" in k for k in state)
    fresh = load_hf_policy(hf_config(tiny_hf_model, lora=LoRAConfig(r=4, alpha=8.0)), torch.device("cpu"), state)
    tokens, mask, _ = prompts(tiny_hf_model)
    with torch.no_grad():
        torch.testing.assert_close(fresh.eval()(tokens, mask), model(tokens, mask), atol=1e-5, rtol=1e-5)


def test_the_tokenizer_ends_a_completion_at_eos_or_a_newline(tiny_hf_model: Path):
    vocab = load_tokenizer(hf_config(tiny_hf_model))
    assert vocab.stop_ids[0] == vocab.eos_id and len(vocab.stop_ids) > 1  # the newline tokens stop too
    assert vocab.decode([*vocab.encode("1290"), vocab.eos_id, *vocab.encode("77")]) == "1290"
    assert vocab.decode(vocab.encode("1290\n55")) == "1290"
    assert vocab.encode_prompt("12+3=")[0] == vocab.bos_id
    chat = load_tokenizer(hf_config(tiny_hf_model, chat_template=True))
    assert vocab.tokenizer.decode(chat.encode_prompt("12+3=")) == "<s>user: 12+3=\n<s>assistant: "


def test_bad_model_paths_and_lora_targets_are_one_line(tiny_hf_model: Path, tmp_path: Path):
    with pytest.raises(ConfigError, match=r"^model.path=\./nowhere: no such directory$"):
        resolve_model_dir("./nowhere")
    with pytest.raises(ConfigError, match=r"has no config.json"):
        resolve_model_dir(str(tmp_path))
    with pytest.raises(ConfigError, match=r"not in the local Hugging Face cache and cannot be fetched"):
        resolve_model_dir("pgcli-test/no-such-model")
    bad = hf_config(tiny_hf_model, lora=LoRAConfig(r=4, target_modules=["qkv_nope"]))
    with pytest.raises(ConfigError, match=r"^model.lora.target_modules=\['qkv_nope'\]: .*q_proj") as err:
        check_hf_model(bad)
    assert "\n" not in str(err.value)
    check_hf_model(hf_config(tiny_hf_model))  # the good one passes


def test_model_hf_composes_for_a_text_task_and_needs_a_path(tiny_hf_model: Path):
    from pgcli.training.checks import train_config

    cfg = train_config(["env=addition", "algo=sft", "model=hf", f"model.path={tiny_hf_model}"])
    assert isinstance(cfg.model, HFModelConfig) and cfg.model.lora.r == 16
    with pytest.raises(ConfigError, match=r"^model.path is required: set model.path=...$"):
        train_config(["env=addition", "algo=sft", "model=hf"])
    with pytest.raises(ConfigError, match=r"^model must be an MLP option .* model=hf is for text tasks"):
        train_config(["env=cartpole", "model=hf", f"model.path={tiny_hf_model}"])


def test_hardware_auto_puts_text_runs_on_a_visible_gpu_and_keeps_control_on_the_cpu(monkeypatch: pytest.MonkeyPatch):
    from pgcli.config import HardwareConfig
    from pgcli.hardware.placement import select_device

    auto = HardwareConfig(device="auto")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert (select_device(auto, "text").type, select_device(auto, "control").type) == ("cuda", "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert select_device(auto, "text").type == "cpu"


def test_bf16_autocast_over_float32_weights_scores_close_and_trains_float32_adapters(tiny_hf_model: Path):
    # what a GPU run gets by default (pgcli.lm.hf.mixed_precision); CPU autocast runs the same code path here
    model = policy(tiny_hf_model)
    tokens, mask, vocab = prompts(tiny_hf_model)
    gen = generate(
        model,
        tokens,
        mask,
        max_new_tokens=6,
        eos_id=vocab.stop_ids,
        generator=torch.Generator().manual_seed(0),
        pad_id=vocab.pad_id,
    )
    plain, _ = completion_logprobs(model, tokens, mask, gen.tokens, gen.mask)
    model.autocast = torch.bfloat16
    mixed, _ = completion_logprobs(model, tokens, mask, gen.tokens, gen.mask)
    assert model.hidden(tokens, mask).dtype == torch.float32  # a float32 value head reads it
    torch.testing.assert_close(mixed.detach(), plain.detach(), atol=0.1, rtol=0.05)  # bfloat16's 8 mantissa bits
    (mixed * gen.mask).sum().backward()
    lora = [p for n, p in model.named_parameters() if "lora_" in n]
    assert all(p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32 for p in lora)


def test_mixed_precision_is_for_float32_weights_on_a_gpu(tiny_hf_model: Path, monkeypatch: pytest.MonkeyPatch):
    from pgcli.lm.hf import mixed_precision

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert mixed_precision(hf_config(tiny_hf_model), cuda) == torch.bfloat16
    assert mixed_precision(hf_config(tiny_hf_model, dtype="bfloat16"), cuda) is None
    assert mixed_precision(hf_config(tiny_hf_model), cpu) is None
