"""Schema of ``model=hf``: any Hugging Face causal LM as the policy of a text run (docs/lm.md, "Hugging Face models").

Pure value rules only: whether ``model.path`` is a local model directory or a hub id in the local cache, and whether
the LoRA targets exist in it, are decided after composition, by :mod:`pgcli.training.checks` (nothing is downloaded
while a config is validated).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from omegaconf import MISSING

from pgcli.config.rules import _at_most, _choice, _finite_fields, _positive, require

DTYPES = ("float32", "bfloat16", "float16")
ATTENTION = ("sdpa", "eager", "flash_attention_2")


@dataclass
class LoRAConfig:
    """Low-rank adapters (Hu et al., 2021) through ``peft``: only the adapters train; the base stays frozen."""

    r: int = 16
    """Adapter rank (0: no adapters, a full fine-tune of every weight)."""
    alpha: float = 32.0
    """Scale numerator: the adapter's update is multiplied by alpha / r."""
    dropout: float = 0.0
    """Dropout on the adapters' input."""
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    """Module names (or suffixes) that get adapters; ["all-linear"]: every linear layer but the output head."""

    def __post_init__(self) -> None:
        _finite_fields(self, "model.lora")
        require(0 <= self.r <= 4096, "model.lora.r", self.r, "in [0, 4096]", "0 fine-tunes every weight")
        _positive("model.lora.alpha", self.alpha, "typical: 2 * r")
        require(0 <= self.dropout < 1, "model.lora.dropout", self.dropout, "in [0, 1)")
        require(
            len(self.target_modules) >= 1,
            "model.lora.target_modules",
            self.target_modules,
            "at least one module name",
            'e.g. ["q_proj", "v_proj"] or ["all-linear"]',
        )


@dataclass
class HFModelConfig:
    """A Hugging Face causal LM (``AutoModelForCausalLM``) and its tokenizer as the policy, and how it samples."""

    name: ClassVar[str] = "hf"

    path: str = MISSING
    """A local model directory (config.json, weights, tokenizer) or a hub id already in the local Hugging Face cache."""
    dtype: str = "float32"
    """Weights' dtype: float32 | bfloat16 | float16 (bfloat16 halves memory on a GPU; CPUs run float32 fastest)."""
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """Adapters (model.lora.r=0: full fine-tune)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory, about a third more compute."""
    attn_implementation: str = "sdpa"
    """Attention kernel: sdpa | eager | flash_attention_2 (the last needs the flash-attn package and a GPU)."""
    chat_template: bool = False
    """Wrap each prompt in the tokenizer's chat template as a user turn (instruction-tuned models)."""
    max_new_tokens: int | None = None
    """Completion tokens per sample, EOS included (None: the task's longest answer + EOS)."""
    logprob_chunk: int = 64
    """Completion positions per chunk when scoring: the float32 log-softmax never spans more (large vocabularies)."""
    micro_batch: int = 0
    """Completions (SFT: demonstrations) per forward/backward pass inside a minibatch, gradients accumulated before
    the optimizer step; 0: the whole minibatch at once."""
    temperature: float = 1.0
    """Sampling temperature of RL rollouts and of their log-probabilities (greedy decoding scores eval/accuracy)."""
    top_p: float = 1.0
    """Nucleus sampling mass of RL rollouts and eval/pass@k (1.0: the whole distribution)."""

    def __post_init__(self) -> None:
        _finite_fields(self, "model")
        require(bool(str(self.path).strip()), "model.path", self.path, "a model directory or a hub id")
        _choice("model.dtype", self.dtype, DTYPES)
        _choice("model.attn_implementation", self.attn_implementation, ATTENTION)
        if self.max_new_tokens is not None:
            require(1 <= self.max_new_tokens <= 32768, "model.max_new_tokens", self.max_new_tokens, "in [1, 32768]")
        require(1 <= self.logprob_chunk <= 65536, "model.logprob_chunk", self.logprob_chunk, "in [1, 65536]")
        require(self.micro_batch >= 0, "model.micro_batch", self.micro_batch, ">= 0", "0: the whole minibatch")
        _positive("model.temperature", self.temperature, "typical: 1.0")
        _at_most("model.temperature", self.temperature, 10.0, "typical: 1.0")
        require(0 < self.top_p <= 1, "model.top_p", self.top_p, "in (0, 1]", "1.0 samples the whole distribution")
