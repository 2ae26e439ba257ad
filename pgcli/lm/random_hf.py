"""A Hugging Face causal LM with random weights, written to a directory, with nothing downloaded: ``model=hf`` tried
offline, the tests' model, and the GPU benchmark's model of a real shape (docs/lm.md, "Hugging Face models").

    python -m pgcli.lm.random_hf ./tiny-llama                       # ~0.1M parameters, a BPE tokenizer of 128 tokens
    python -m pgcli.lm.random_hf ./qwen-shape --hidden 896 --layers 24 --heads 14 --kv-heads 2 --vocab 151936

The model is a Llama (pre-RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention: the architecture of most
open models); the tokenizer a byte-pair encoding trained in-process on text of pgcli's tasks (digits, operators, a
newline), with ``<pad>``, ``<s>`` and ``</s>`` and a one-turn chat template. A larger ``--vocab`` than the trained
merges pads the embedding (as models whose vocabulary is rounded up).
"""

from __future__ import annotations

import argparse
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)
"""A one-line-per-turn template: enough to test ``model.chat_template=true`` (real models bring their own)."""
SPECIAL = ("<pad>", "<s>", "</s>")


def _corpus(n: int = 2000) -> list[str]:
    """Lines of addition, sorting and countdown text to train the merges on (fixed, so the tokenizer is the same
    every time)."""
    import numpy as np

    rng = np.random.default_rng(0)
    lines = []
    for _ in range(n):
        a, b = (int(x) for x in rng.integers(0, 10_000, size=2))
        digits = "".join(str(int(d)) for d in rng.integers(0, 10, size=6))
        nums = [int(x) for x in rng.integers(1, 10, size=3)]
        lines += [
            f"{a}+{b}={a + b}\n",
            f"{digits}={''.join(sorted(digits))}\n",
            f"{nums[0]},{nums[1]},{nums[2]}>{nums[0] * nums[1] + nums[2]}={nums[0]}*{nums[1]}+{nums[2]}\n",
            "user: assistant: ()-",
        ]
    return lines


def build_tokenizer(vocab_size: int = 128) -> object:
    """A ``PreTrainedTokenizerFast``: byte-pair merges over the corpus's characters, up to ``vocab_size`` tokens."""
    from tokenizers import Tokenizer, decoders, models, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.decoder = decoders.Fuse()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL), show_progress=False)
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def write_random_model(
    directory: Path,
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int | None = None,
    vocab: int | None = None,
    max_positions: int = 512,
    seed: int = 0,
) -> Path:
    """Write a random Llama and its tokenizer to ``directory`` with ``save_pretrained``; returns ``directory``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tokenizer()
    n_tokens = len(tokenizer)  # type: ignore[arg-type]
    ids = {name: tokenizer.convert_tokens_to_ids(name) for name in SPECIAL}  # type: ignore[attr-defined]
    config = LlamaConfig(
        vocab_size=max(vocab or n_tokens, n_tokens),
        hidden_size=hidden,
        intermediate_size=intermediate or 4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        pad_token_id=ids["<pad>"],
        bos_token_id=ids["<s>"],
        eos_token_id=ids["</s>"],
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)  # type: ignore[attr-defined]
    return directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pgcli.lm.random_hf", description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path, help="where to write the model (made if missing)")
    parser.add_argument("--hidden", type=int, default=64, help="width of the residual stream (default: 64)")
    parser.add_argument("--layers", type=int, default=2, help="transformer blocks (default: 2)")
    parser.add_argument("--heads", type=int, default=4, help="attention heads; --hidden divides by it (default: 4)")
    parser.add_argument(
        "--kv-heads", type=int, default=2, help="key/value heads (grouped-query attention); --heads divides by it"
    )
    parser.add_argument(
        "--intermediate", type=int, default=None, help="width of the SwiGLU MLP (default: 4 x --hidden)"
    )
    parser.add_argument("--vocab", type=int, default=None, help="embedding rows (at least the tokenizer's 128)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights (default: 0)")
    args = parser.parse_args(argv)
    write_random_model(**vars(args))  # each option's dest is a keyword of write_random_model
    print(f"wrote a random Llama to {args.directory} (model=hf model.path={args.directory})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
