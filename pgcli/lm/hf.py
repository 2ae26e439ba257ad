"""Any Hugging Face causal LM as a text policy (``model=hf``; docs/lm.md, "Hugging Face models").

:class:`HFCausalLM` puts a ``transformers`` causal LM (with ``peft`` LoRA adapters when ``model.lora.r > 0``) behind
the :class:`pgcli.lm.model.CausalLM` interface every text trainer, the generator and the evaluator use: final hidden
states of left-padded rows (positions counted from the padding mask, so padding does not change a row's logits), the
output head, and a key/value cache. Generation runs in the training process with the adapter active (no inference
server, no weight sync); the KL reference of a LoRA run is the same model with its adapter switched off
(:class:`AdapterOff`): one copy of the base weights.

:class:`HFTokenizer` is the model's tokenizer behind the task vocabulary interface (:class:`pgcli.lm.tasks.CharVocab`
is the other): prompts are encoded as strings (optionally wrapped in the chat template), a completion ends at EOS or
at the first token whose text holds a stop string (a newline), and the task's checker reads the decoded string.

Nothing here downloads while training: :func:`~pgcli.lm.model_files.resolve_model_dir` accepts a model directory,
or a hub id that is in the local Hugging Face cache or can be fetched now (the checks before a run call it, before
anything is created).
"""

from __future__ import annotations

import copy
import functools
import inspect
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from pgcli.errors import ConfigError
from pgcli.lm.model import CausalLM
from pgcli.lm.model_files import check_hf_files, check_model_dir, resolve_model_dir

if TYPE_CHECKING:
    from pgcli.config import HFModelConfig

STOP_STRINGS = ("\n",)
"""A completion ends at the first token whose text holds one of these (the tasks' answers are one line)."""
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# --------------------------------------------------------------------------------------------------------------------
# Where the model is, and whether it fits the config (the checks before a run)
# --------------------------------------------------------------------------------------------------------------------


def check_hf_model(cfg: HFModelConfig) -> None:
    """``model.path`` resolves, its files are whole and every LoRA target exists in it (:func:`check_hf_files`, which
    the checks before a run call first, before torch is imported), its weights have the shapes of its
    ``config.json``, its tokenizer has an EOS token, and the LoRA adapters wrap it (checked on an empty copy on the
    meta device: no weights are read).

    Raises:
        ConfigError: one line naming what is missing.
    """
    directory = check_hf_files(cfg)
    check_model_dir(directory, f"model.path={cfg.path}", base_shapes(directory, cfg.path))
    load_tokenizer(cfg, directory)
    if cfg.lora.r == 0:
        return
    _with_lora(_empty_model(directory, cfg.path), cfg)


def _empty_model(directory: Path, path: str) -> nn.Module:
    """The model of ``directory``'s ``config.json`` on the meta device: its shapes, no weights read."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(directory)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"model.path={path}: cannot read {directory / 'config.json'} ({_last_line(exc)})") from None
    with torch.device("meta"):
        empty: nn.Module = AutoModelForCausalLM.from_config(config)
    return empty


@functools.lru_cache(maxsize=4)
def base_shapes(directory: Path, path: str) -> dict[str, tuple[int, ...]]:
    """The shape of every weight of the model ``config.json`` describes in ``directory`` (name as in its state
    dict)."""
    return {name: tuple(t.shape) for name, t in _empty_model(directory, path).state_dict().items()}


def check_weights_fit(weights: Path, cfg: HFModelConfig) -> None:
    """A run's ``policy.pt`` (``weights``: a model directory of it) fits the base model of ``model.path`` as it is now;
    one line naming both otherwise (only the shapes are read: the file is memory-mapped)."""
    from pgcli.lm.model import POLICY_FILE
    from pgcli.lm.model_files import check_state_fits

    directory = resolve_model_dir(cfg.path)
    state = torch.load(weights / POLICY_FILE, map_location="cpu", weights_only=True, mmap=True)
    shapes = {name: tuple(t.shape) for name, t in state.items()}
    check_state_fits(
        shapes, base_shapes(directory, cfg.path), weights / POLICY_FILE, directory, f"model.path={cfg.path}"
    )


def _last_line(exc: BaseException, limit: int = 200) -> str:
    """The last line of ``exc``'s message (its type when it has none), cut at ``limit`` characters."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:limit]


# --------------------------------------------------------------------------------------------------------------------
# The tokenizer as a task vocabulary
# --------------------------------------------------------------------------------------------------------------------


class HFTokenizer:
    """A Hugging Face tokenizer with the vocabulary interface of :class:`pgcli.lm.tasks.CharVocab`."""

    def __init__(self, tokenizer: Any, *, chat_template: bool = False) -> None:
        if tokenizer.eos_token_id is None:
            raise ConfigError("model=hf: the tokenizer has no EOS token; set one in its tokenizer_config.json")
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.eos_id: int = int(tokenizer.eos_token_id)
        self.pad_id: int = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id)
        self.bos_id: int | None = None if tokenizer.bos_token_id is None else int(tokenizer.bos_token_id)
        self.size = len(tokenizer)
        vocab = tokenizer.convert_ids_to_tokens(list(range(self.size)))
        stops = [
            i
            for i, piece in enumerate(vocab)
            if piece and any(s in tokenizer.convert_tokens_to_string([piece]) for s in STOP_STRINGS)
        ]
        self.stop_ids: tuple[int, ...] = (self.eos_id, *(i for i in stops if i != self.eos_id))
        self._stop_set = frozenset(self.stop_ids)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added)."""
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False)
        return ids

    def encode_prompt(self, text: str) -> list[int]:
        """A prompt's ids: the chat template's user turn and generation prompt, or BOS (where the model has one)
        followed by the text."""
        if self.chat_template:
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
            )
            return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        return ([] if self.bos_id is None else [self.bos_id]) + self.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` up to EOS (excluded) or up to the first stop string."""
        kept: list[int] = []
        for i in ids:
            i = int(i)
            if i == self.eos_id:
                break
            kept.append(i)
            if i in self._stop_set:
                break
        text: str = self.tokenizer.decode(kept, skip_special_tokens=True)
        for stop in STOP_STRINGS:
            text = text.split(stop, 1)[0]
        return text


def load_tokenizer(cfg: HFModelConfig, directory: Path | None = None) -> HFTokenizer:
    """The tokenizer of ``model.path`` as a task vocabulary (one-line ConfigError when it cannot be read)."""
    return _tokenizer(directory or resolve_model_dir(cfg.path), cfg.path, cfg.chat_template)


@functools.lru_cache(maxsize=4)
def _tokenizer(directory: Path, path: str, chat_template: bool) -> HFTokenizer:
    """Read once per process: the checks before a run and the run itself ask for the same one, and finding the stop
    tokens reads the whole vocabulary (151,936 tokens for Qwen2.5)."""
    from transformers import AutoTokenizer

    from pgcli.lm.model_files import check_tokenizer_files

    check_tokenizer_files(directory, f"model.path={path}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory)
    except (OSError, ValueError, TypeError) as exc:
        raise ConfigError(f"model.path={path}: cannot read its tokenizer ({_last_line(exc)})") from None
    if chat_template and not getattr(tokenizer, "chat_template", None):
        raise ConfigError(f"model.chat_template=true: the tokenizer of {path} has no chat template")
    return HFTokenizer(tokenizer, chat_template=chat_template)


# --------------------------------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------------------------------


class HFCache:
    """The key/value cache of :class:`HFCausalLM`: the model's own cache object, the real-token mask so far and the
    count of real tokens per row (the next token's position)."""

    def __init__(self, batch: int, device: torch.device) -> None:
        self.past: Any = None
        self.mask = torch.zeros(batch, 0, dtype=torch.bool, device=device)
        self.n_real = torch.zeros(batch, dtype=torch.long, device=device)


class HFCausalLM(CausalLM):
    """A ``transformers`` causal LM (LoRA-wrapped or not) as a :class:`CausalLM` (module docstring)."""

    lm: Any
    _decoder: Any
    _head: Any

    def __init__(self, lm: Any, *, logprob_chunk: int | None = None, autocast: torch.dtype | None = None) -> None:
        super().__init__()
        self.lm = lm
        self.autocast = autocast
        """Mixed precision: the forward passes run in this dtype over float32 weights (None: the weights' dtype)."""
        base = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
        self.hidden_size = int(base.config.hidden_size)
        self.logprob_chunk = logprob_chunk
        object.__setattr__(self, "_decoder", base.get_decoder())  # a view into self.lm, not a second submodule
        object.__setattr__(self, "_head", base.get_output_embeddings())
        # transformers 5.24 renamed the decoder's cache argument and output from past_key_values to cache
        self._cache_key = (
            "cache" if "cache" in inspect.signature(self._decoder.forward).parameters else "past_key_values"
        )

    @property
    def has_adapter(self) -> bool:
        return hasattr(self.lm, "disable_adapter")

    def hidden(self, tokens: Tensor, mask: Tensor, cache: Any = None) -> Tensor:
        with self._precision(tokens.device):
            if cache is None:
                positions = (mask.long().cumsum(1) - 1).clamp(min=0)
                out = self._decoder(
                    input_ids=tokens, attention_mask=mask.long(), position_ids=positions, use_cache=False
                )
            else:
                assert isinstance(cache, HFCache)
                positions = (cache.n_real[:, None] + mask.long().cumsum(1) - 1).clamp(min=0)
                cache.mask = torch.cat([cache.mask, mask], 1)
                out = self._decoder(
                    input_ids=tokens,
                    attention_mask=cache.mask.long(),
                    position_ids=positions,
                    use_cache=True,
                    **{self._cache_key: cache.past},
                )
                cache.past = getattr(out, self._cache_key)
                cache.n_real = cache.n_real + mask.long().sum(1)
        hidden: Tensor = out.last_hidden_state
        return hidden.float() if self.autocast is not None else hidden  # a float32 value head reads it as it is

    def logits(self, hidden: Tensor) -> Tensor:
        with self._precision(hidden.device):
            return self._head(hidden)  # type: ignore[no-any-return]

    def _precision(self, device: torch.device) -> Any:
        """The autocast context of :attr:`autocast` (a no-op without it)."""
        return torch.autocast(device.type, dtype=self.autocast or torch.float32, enabled=self.autocast is not None)

    def new_cache(self, batch: int, max_len: int) -> HFCache:
        del max_len  # the model's cache grows as it goes
        return HFCache(batch, self._head.weight.device)

    def policy_state(self) -> dict[str, Tensor]:
        """The weights a fresh base model of ``model.path`` loads to compute this policy: the adapters merged into
        the base (what ``policy.pt`` holds, so ``init=`` and ``pgcli eval`` need no adapter bookkeeping)."""
        if not self.has_adapter:
            return self.lm.state_dict()
        merged = copy.deepcopy(self.lm).merge_and_unload()
        return merged.state_dict()  # type: ignore[no-any-return]


class AdapterOff(CausalLM):
    """The KL reference of a LoRA run: the policy's own model with its adapters switched off (the base weights, shared:
    no copy). Holds the policy outside the module tree, so ``requires_grad_(False)``, ``eval()`` and ``to()`` on the
    reference never touch the policy's adapters."""

    _policy: HFCausalLM

    def __init__(self, policy: HFCausalLM) -> None:
        super().__init__()
        object.__setattr__(self, "_policy", policy)
        self.hidden_size = policy.hidden_size
        self.logprob_chunk = policy.logprob_chunk

    def hidden(self, tokens: Tensor, mask: Tensor, cache: Any = None) -> Tensor:
        with self._policy.lm.disable_adapter():
            return self._policy.hidden(tokens, mask, cache)

    def logits(self, hidden: Tensor) -> Tensor:
        return self._policy.logits(hidden)

    def new_cache(self, batch: int, max_len: int) -> HFCache:
        return self._policy.new_cache(batch, max_len)


def shard_hf_policy(policy: CausalLM, device: torch.device, *, frozen: bool = False) -> None:
    """Shard ``policy`` over the run's processes in place (``hardware.shard=params``): each decoder layer a unit,
    the embeddings, final norm and head the root's; its ``hidden`` and ``logits`` gather as ``forward`` would. A LoRA
    policy's frozen base shards alike (only its adapters train). ``frozen``: a KL reference, never trained."""
    from pgcli.hardware.sharding import shard

    if not isinstance(policy, HFCausalLM):
        raise ConfigError("hardware.shard=params shards model=hf")
    shard(policy, list(policy._decoder.layers), device, methods=("hidden", "logits"), frozen=frozen)


def load_hf_policy(
    cfg: HFModelConfig, device: torch.device, state: dict[str, Tensor] | None = None, weights: Path | None = None
) -> HFCausalLM:
    """The policy of ``model=hf`` on ``device``: the base model of ``model.path`` in ``model.dtype``, then ``state``
    (merged weights of an earlier run, :meth:`HFCausalLM.policy_state`, read from ``weights``) when given, then fresh
    LoRA adapters. A damaged base, or one ``state`` does not fit, is one line (:mod:`pgcli.lm.model_files`)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from pgcli.lm.model_files import check_model_dir, check_state_fits

    hf_logging.disable_progress_bar()  # a bar per load of a few files: pgcli's own bar is the one that matters
    directory = resolve_model_dir(cfg.path)
    option = f"model.path={cfg.path}"
    shapes = base_shapes(directory, cfg.path)
    check_model_dir(directory, option, shapes)
    if state is not None:
        where = weights if weights is not None else Path("the run's weights")
        check_state_fits({k: tuple(v.shape) for k, v in state.items()}, shapes, where, directory, option)
    lm: Any
    try:
        lm = AutoModelForCausalLM.from_pretrained(
            directory, dtype=DTYPES[cfg.dtype], attn_implementation=cfg.attn_implementation
        )
    except (OSError, ValueError, ImportError) as exc:
        raise ConfigError(f"model.path={cfg.path}: cannot load the model ({_last_line(exc)})") from None
    if state is not None:
        lm.load_state_dict(state)
    lm.config.use_cache = False  # the training forward passes; generation passes its own cache
    if cfg.gradient_checkpointing:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.lora.r > 0:
        lm = _with_lora(lm, cfg)
    return HFCausalLM(lm.to(device), logprob_chunk=cfg.logprob_chunk, autocast=mixed_precision(cfg, device))


def mixed_precision(cfg: HFModelConfig, device: torch.device) -> torch.dtype | None:
    """bfloat16 autocast over float32 weights on a GPU that has it (the weights and Adam's steps stay float32: a
    bfloat16 weight loses an update below 1/256 of itself); None on a CPU or with half-precision weights."""
    gpu = device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return torch.bfloat16 if gpu and cfg.dtype == "float32" else None


def _with_lora(lm: nn.Module, cfg: HFModelConfig) -> nn.Module:
    """``lm`` with LoRA adapters on ``model.lora.target_modules`` (one-line ConfigError when a target is missing)."""
    from peft import LoraConfig, get_peft_model

    targets: Any = cfg.lora.target_modules
    if list(targets) == ["all-linear"]:
        targets = "all-linear"
    from transformers.pytorch_utils import Conv1D

    alpha: Any = cfg.lora.alpha  # peft annotates an int and takes a float
    conv1d = any(isinstance(m, Conv1D) for m in lm.modules())  # GPT-2 stores its linear layers transposed
    config = LoraConfig(
        r=cfg.lora.r,
        lora_alpha=alpha,
        lora_dropout=cfg.lora.dropout,
        target_modules=targets,
        fan_in_fan_out=conv1d,
        task_type="CAUSAL_LM",
    )
    try:
        with warnings.catch_warnings():  # peft reads an attribute transformers deprecated: not the user's concern
            warnings.simplefilter("ignore", FutureWarning)
            return get_peft_model(lm, config)  # type: ignore[arg-type]
    except ValueError as exc:
        raise ConfigError(
            f"model.lora.target_modules={list(cfg.lora.target_modules)}: {_last_line(exc)} (module "
            f"names of {cfg.path}: {_linear_names(lm)})"
        ) from None


def _linear_names(lm: nn.Module) -> str:
    names = sorted({name.rsplit(".", 1)[-1] for name, m in lm.named_modules() if isinstance(m, nn.Linear)})
    return ", ".join(names[:12])
