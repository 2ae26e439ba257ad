"""A text run's policy as a Hugging Face model directory (``pgcli export``; docs/lm.md, "Exporting a text run").

- TinyGPT becomes a GPT-2 (``GPT2LMHeadModel``): the same pre-LN blocks, learned positions, a head tied to the token
  embedding and exact GELU, so the exported model computes the same logits (tests: max abs difference <= 1e-5). Its
  tokenizer is the task's character vocabulary as a word-level tokenizer over single characters, with the same ids
  (``<pad>`` 0, ``<bos>`` 1, ``<eos>`` 2), so ``model=hf model.path=<export>`` trains on the same tokens. It puts
  ``<bos>`` before a text itself (a post-processor, as Llama's tokenizers do): ``tokenizer("12+34=")`` gives the ids
  TinyGPT was trained on, so ``AutoTokenizer`` + ``generate`` answer as pgcli does.
- A ``model=hf`` run is its base model with the run's weights (LoRA adapters merged), and the base's tokenizer.

Either directory loads with ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from pgcli.lm.model import TinyGPT
from pgcli.lm.tasks import PAD, CharVocab

if TYPE_CHECKING:
    from pgcli.lm.hf import HFCausalLM

BOS, EOS = "<bos>", "<eos>"


def gpt2_config(model: TinyGPT, vocab: CharVocab) -> Any:
    """The ``GPT2Config`` of ``model``'s sizes (no dropout, exact GELU, LayerNorm eps 1e-5 as ``nn.LayerNorm``)."""
    from transformers import GPT2Config

    s = model.sizes
    return GPT2Config(
        vocab_size=s.vocab_size,
        n_positions=s.max_len,
        n_embd=s.d_model,
        n_layer=s.n_layers,
        n_head=s.n_heads,
        n_inner=s.d_ff,
        activation_function="gelu",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        layer_norm_epsilon=1e-5,
        tie_word_embeddings=True,
        bos_token_id=vocab.bos_id,
        eos_token_id=vocab.eos_id,
        pad_token_id=vocab.pad_id,
    )


def gpt2_state(model: TinyGPT) -> dict[str, torch.Tensor]:
    """TinyGPT's weights under GPT-2's names (GPT-2's ``Conv1D`` stores its weight as [in, out]: transposed)."""
    sd = model.state_dict()
    out = {
        "transformer.wte.weight": sd["tok_emb.weight"],
        "transformer.wpe.weight": sd["pos_emb.weight"],
        "transformer.ln_f.weight": sd["ln_f.weight"],
        "transformer.ln_f.bias": sd["ln_f.bias"],
        "lm_head.weight": sd["tok_emb.weight"],
    }
    pairs = {
        "ln1": "ln_1",
        "ln2": "ln_2",
        "qkv": "attn.c_attn",
        "proj": "attn.c_proj",
        "mlp.0": "mlp.c_fc",
        "mlp.2": "mlp.c_proj",
    }
    for i in range(model.sizes.n_layers):
        for ours, theirs in pairs.items():
            weight, bias = sd[f"blocks.{i}.{ours}.weight"], sd[f"blocks.{i}.{ours}.bias"]
            linear = not ours.startswith("ln")
            out[f"transformer.h.{i}.{theirs}.weight"] = weight.t().contiguous() if linear else weight
            out[f"transformer.h.{i}.{theirs}.bias"] = bias
    return out


def char_tokenizer(vocab: CharVocab) -> Any:
    """The task's character vocabulary as a ``PreTrainedTokenizerFast`` with the same ids."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    ids = {PAD: vocab.pad_id, BOS: vocab.bos_id, EOS: vocab.eos_id}
    ids |= {c: i for c, i in zip(vocab.chars, range(3, vocab.size), strict=True)}
    tok = Tokenizer(models.WordLevel(vocab=ids, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one token per character
    tok.decoder = decoders.Fuse()
    # TinyGPT read every prompt after <bos>: without it generate answers another model's question (issue 34)
    bos = [(BOS, vocab.bos_id)]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=bos
    )
    # no token_type_ids: GPT-2 would add their embeddings (token 0's) to every position
    names = ["input_ids", "attention_mask"]
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS, model_input_names=names
    )


def export_tiny_gpt(model: TinyGPT, vocab: CharVocab, out: Path) -> Path:
    """Write ``model`` as a GPT-2 directory with its character tokenizer into ``out``."""
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel(gpt2_config(model, vocab))
    missing, unexpected = hf.load_state_dict(gpt2_state(model), strict=False)
    assert not unexpected and all(k.endswith("attn.bias") or k.endswith("masked_bias") for k in missing), missing
    out.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(out)
    char_tokenizer(vocab).save_pretrained(out)
    return out


def export_hf(policy: HFCausalLM, tokenizer: Any, out: Path) -> Path:
    """Write a ``model=hf`` policy (adapters merged) and its tokenizer into ``out``."""
    import copy

    lm = copy.deepcopy(policy.lm)
    if policy.has_adapter:
        lm = lm.merge_and_unload()
    out.mkdir(parents=True, exist_ok=True)
    lm.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
