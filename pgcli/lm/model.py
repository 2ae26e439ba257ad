"""TinyGPT: a small causal transformer policy over characters, with key/value-cache generation
(docs/lm.md, "Model (`model=tiny_gpt`)").

Pre-LN GPT blocks (Radford et al., 2019): ``x + attn(ln(x))``, ``x + mlp(ln(x))``, a final LayerNorm and a linear
head tied to the token embedding. Learned absolute positions are counted from the padding mask (``cumsum(mask) - 1``),
so a left-padded row gets the same positions, and therefore the same logits, as the same row unpadded; padded keys
are masked out of attention.

Generation (:func:`generate`) runs the prompt once (prefill) into a :class:`KVCache` and then one token per step,
sampling from ``softmax(logits / temperature)`` restricted to the top-p nucleus (Holtzman et al., 2020); temperature
0 is greedy. :func:`completion_logprobs` re-scores sampled completions in one differentiable forward pass: the
per-token log-probabilities and entropies of the same tempered distribution, what the RL losses need.

Shapes: B batch, P prompt length, C completion length, T = P + C, V vocabulary, D model width, H heads.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from pgcli.hardware import sharding

POLICY_FILE = "policy.pt"
"""The policy's ``state_dict`` in a saved model or checkpoint directory (what ``init=<run>`` loads)."""


@dataclass(frozen=True)
class TinyGPTSizes:
    """The architecture (``pgcli.config.LMModelConfig`` without its sampling settings)."""

    vocab_size: int
    max_len: int
    n_layers: int = 2
    n_heads: int = 4
    d_model: int = 128
    d_ff: int = 512
    init_std: float = 0.02


class KVCache:
    """Keys and values of every layer for positions seen so far, preallocated to ``max_len``.

    ``mask`` [B, max_len] marks real (non-pad) positions; ``n_real`` [B] counts them (the next token's position).
    """

    def __init__(
        self,
        n_layers: int,
        batch: int,
        n_heads: int,
        max_len: int,
        head_dim: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.k = torch.zeros(n_layers, batch, n_heads, max_len, head_dim, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.mask = torch.zeros(batch, max_len, dtype=torch.bool, device=device)
        self.n_real = torch.zeros(batch, dtype=torch.long, device=device)
        self.length = 0
        self.max_len = max_len


class _Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))

    def forward(self, x: Tensor, attn_mask: Tensor, cache: KVCache | None, layer: int) -> Tensor:
        t = x.shape[1]
        q, k, v = self.heads(x)
        if cache is not None:
            start = cache.length
            cache.k[layer, :, :, start : start + t] = k
            cache.v[layer, :, :, start : start + t] = v
            k, v = cache.k[layer, :, :, : start + t], cache.v[layer, :, :, : start + t]  # [B, H, S, Dh]
        return self.attend(x, q, k, v, attn_mask)

    def heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values [B, H, t, Dh] of ``x`` [B, t, D]."""
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        return q, k, v

    def attend(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor) -> Tensor:
        """The block's output [B, t, D] for input ``x`` whose queries ``q`` attend to keys/values ``k``, ``v`` [B, H, S,
        Dh] under ``attn_mask`` [B, 1, t, S]."""
        b, t, d = x.shape
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)  # [B, H, t, Dh]
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class CausalLM(nn.Module):
    """What trainers, generation and evaluation need from a policy: final hidden states of left-padded tokens with a
    real-token mask (continuing a key/value cache when given), the output head, and a new cache.

    :class:`TinyGPT` and :class:`pgcli.lm.hf.HFCausalLM` (any Hugging Face causal LM) implement it.
    """

    hidden_size: int
    """Width D of :meth:`hidden`'s output (what a value head reads)."""
    logprob_chunk: int | None = None
    """Completion positions per chunk in :func:`completion_logprobs` (None: all at once; large vocabularies chunk)."""
    sampler_logprobs: bool = False
    """:func:`generate`'s log-probs of the sampled tokens are :func:`completion_logprobs`' function (the same
    precision, and the same in training mode: no dropout), so a trainer may take them as pi_old's."""

    def hidden(self, tokens: Tensor, mask: Tensor, cache: Any = None) -> Tensor:
        """Final hidden states [B, t, D] of ``tokens`` [B, t] with real-token ``mask`` [B, t]."""
        raise NotImplementedError

    def logits(self, hidden: Tensor) -> Tensor:
        """Next-token logits [..., V] of hidden states [..., D]."""
        raise NotImplementedError

    def new_cache(self, batch: int, max_len: int) -> Any:
        """An empty key/value cache for ``batch`` rows of at most ``max_len`` positions."""
        raise NotImplementedError

    def forward(self, tokens: Tensor, mask: Tensor, cache: Any = None) -> Tensor:
        """Next-token logits [B, t, V] (see :meth:`hidden`)."""
        return self.logits(self.hidden(tokens, mask, cache))

    def completion_hidden(
        self, prompt_tokens: Tensor, prompt_mask: Tensor, prompt_index: Tensor, completion: Tensor, mask: Tensor
    ) -> Tensor:
        """Hidden states [B, C, D] at the positions that predict each token of ``completion`` [B, C] (real: ``mask``):
        the last prompt position, then every completion token but the last; row b follows prompt ``prompt_index[b]``
        of the U distinct ``prompt_tokens`` [U, P]. This default runs every row's whole sequence; :class:`TinyGPT`
        runs each distinct prompt once."""
        p = prompt_tokens.shape[1]
        tokens = torch.cat([prompt_tokens[prompt_index], completion], 1)  # [B, T]
        full_mask = torch.cat([prompt_mask[prompt_index], mask], 1)
        return self.hidden(tokens, full_mask)[:, p - 1 : -1]

    def policy_state(self) -> dict[str, Tensor]:
        """The weights ``policy.pt`` holds: what a fresh model of the same config loads to compute this policy."""
        return self.state_dict()


class TinyGPT(CausalLM):
    """Causal transformer over a character vocabulary (module docstring)."""

    sampler_logprobs = True

    def __init__(self, sizes: TinyGPTSizes) -> None:
        super().__init__()
        if sizes.d_model % sizes.n_heads:
            raise ValueError(f"d_model {sizes.d_model} is not divisible by n_heads {sizes.n_heads}")
        self.sizes = sizes
        self.hidden_size = sizes.d_model
        self.tok_emb = nn.Embedding(sizes.vocab_size, sizes.d_model)
        self.pos_emb = nn.Embedding(sizes.max_len, sizes.d_model)
        self.blocks = nn.ModuleList(_Block(sizes.d_model, sizes.n_heads, sizes.d_ff) for _ in range(sizes.n_layers))
        self.ln_f = nn.LayerNorm(sizes.d_model)
        self.head = nn.Linear(sizes.d_model, sizes.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # tied (Press & Wolf, 2017)
        self.apply(self._init)
        for block in self.blocks:  # GPT-2: residual projections scaled by 1/sqrt(2 * n_layers)
            assert isinstance(block, _Block)
            for proj in (block.proj, block.mlp[2]):
                assert isinstance(proj, nn.Linear)
                nn.init.normal_(proj.weight, std=sizes.init_std / math.sqrt(2 * sizes.n_layers))

    def _init(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=self.sizes.init_std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=self.sizes.init_std)

    def new_cache(self, batch: int, max_len: int | None = None) -> KVCache:
        s = self.sizes
        p = self.tok_emb.weight
        return KVCache(s.n_layers, batch, s.n_heads, max_len or s.max_len, s.d_model // s.n_heads, p.device, p.dtype)

    def hidden(self, tokens: Tensor, mask: Tensor, cache: Any = None) -> Tensor:
        """Final (post-LayerNorm) hidden states [B, t, D] of ``tokens`` [B, t] with real-token ``mask`` [B, t]
        (continuing ``cache`` when given: the new positions follow the cached ones, which they attend to)."""
        b, t = tokens.shape
        past = cache.length if cache is not None else 0
        n_before = cache.n_real if cache is not None else torch.zeros(b, dtype=torch.long, device=tokens.device)
        positions = (n_before[:, None] + mask.long().cumsum(1) - 1).clamp(min=0)  # [B, t]
        if int(positions.max()) >= self.sizes.max_len or past + t > (cache.max_len if cache else self.sizes.max_len):
            raise ValueError(f"sequence longer than the model's max_len {self.sizes.max_len}")
        if cache is not None:
            cache.mask[:, past : past + t] = mask
            key_mask = cache.mask[:, : past + t]  # [B, S]
        else:
            key_mask = mask
        attn = _attention_mask(key_mask, past=past)
        x = self.tok_emb(tokens) + self.pos_emb(positions)
        for layer, block in enumerate(self.blocks):
            x = block(x, attn, cache, layer)
        if cache is not None:
            cache.length += t
            cache.n_real += mask.long().sum(1)
        return self.ln_f(x)

    def logits(self, hidden: Tensor) -> Tensor:
        return self.head(hidden)

    def completion_hidden(
        self, prompt_tokens: Tensor, prompt_mask: Tensor, prompt_index: Tensor, completion: Tensor, mask: Tensor
    ) -> Tensor:
        """:meth:`CausalLM.completion_hidden` with each distinct prompt run once (U rows, not B), as in
        "Prefix Grouper" (Liu et al., 2025): a row's completion attends to its prompt's keys and values, gathered per
        row as a key/value cache holds them. Positions, masks and keys are the whole-sequence pass's, so the outputs
        equal its own up to float32 summation order; the gradients of the G copies of a key sum onto the one."""
        p = prompt_tokens.shape[1]
        inputs, in_mask = completion[:, :-1], mask[:, :-1]  # the last token is predicted, never read
        c = inputs.shape[1]
        if p + inputs.shape[1] + 1 > self.sizes.max_len:
            raise ValueError(f"sequence longer than the model's max_len {self.sizes.max_len}")
        x = self.tok_emb(prompt_tokens) + self.pos_emb((prompt_mask.long().cumsum(1) - 1).clamp(min=0))
        prompt_attn = _attention_mask(prompt_mask, past=0)  # [U, 1, P, P]
        n_prompt = prompt_mask.long().sum(1)[prompt_index]  # [B] real prompt tokens of each row
        y = self.tok_emb(inputs) + self.pos_emb((n_prompt[:, None] + in_mask.long().cumsum(1) - 1).clamp(min=0))
        completion_attn = _attention_mask(torch.cat([prompt_mask[prompt_index], in_mask], 1), past=p)  # [B, 1, c, T-1]
        for block in self.blocks:
            assert isinstance(block, _Block)
            q, k, v = block.heads(x)
            x = block.attend(x, q, k, v, prompt_attn)
            if c > 0:
                qc, kc, vc = block.heads(y)
                keys, values = torch.cat([k[prompt_index], kc], 2), torch.cat([v[prompt_index], vc], 2)
                y = block.attend(y, qc, keys, values, completion_attn)
        last_prompt = self.ln_f(x[:, -1:])[prompt_index]  # [B, 1, D]: predicts each row's first completion token
        return torch.cat([last_prompt, self.ln_f(y)], 1) if c > 0 else last_prompt


def _attention_mask(key_mask: Tensor, *, past: int) -> Tensor:
    """[B, 1, t, S] bool: the t = S - past new queries see the real keys of ``key_mask`` [B, S] up to their own
    position, and themselves."""
    s = key_mask.shape[1]
    t = s - past
    causal = torch.ones(t, s, dtype=torch.bool, device=key_mask.device).tril(diagonal=past)  # [t, S]
    attn = causal[None] & key_mask[:, None, :]  # [B, t, S]
    # a pad query may have no real key before it: let every query see itself so its softmax stays finite
    attn = attn | torch.eye(t, s, dtype=torch.bool, device=key_mask.device).roll(past, dims=1)[None]
    return attn[:, None]


class Generation(NamedTuple):
    tokens: Tensor
    """[B, C] long: sampled tokens, PAD after each row's EOS."""
    mask: Tensor
    """[B, C] bool: True for sampled tokens up to and including EOS."""
    logprobs: Tensor
    """[B, C] float32: log softmax(logits / temperature) of each sampled token (temperature 0: 1, top-p aside), what
    :func:`completion_logprobs` gives for it up to float32 summation order; 0.0 on padding."""


def _sample(logits: Tensor, temperature: float, top_p: float, generator: torch.Generator | None) -> Tensor:
    """One token per row of ``logits`` [B, V]: argmax at temperature 0, else from the tempered top-p nucleus."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)  # [B, V]
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        outside = sorted_probs.cumsum(-1) - sorted_probs >= top_p  # the most likely token is always kept
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate(
    model: CausalLM,
    prompt_tokens: Tensor,
    prompt_mask: Tensor,
    *,
    max_new_tokens: int,
    eos_id: int | Sequence[int],
    temperature: float = 1.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    pad_id: int = 0,
) -> Generation:
    """Sample completions of left-padded prompts with a key/value cache.

    Args:
        model: the policy.
        prompt_tokens: [B, P] long, left-padded (``pgcli.lm.tasks.encode_prompts``).
        prompt_mask: [B, P] bool, True on real prompt tokens.
        max_new_tokens: at most this many tokens per row (EOS included).
        eos_id: a row ends after sampling it (or any of several stop tokens: ``vocab.stop_ids``).
        temperature: softmax temperature (0: greedy).
        top_p: nucleus mass (1.0: the whole distribution).
        generator: the sampling RNG (torch's default RNG when None).

    Returns:
        :class:`Generation` with C <= ``max_new_tokens`` columns (generation stops once every row has ended; a model
        sharded over the processes, once every row of every process has: each decoding step is a forward pass every
        process takes part in).
    """
    lockstep = sharding.in_lockstep(model)
    b, p = prompt_tokens.shape
    stops = torch.as_tensor(eos_id, device=prompt_tokens.device).reshape(-1)
    cache = model.new_cache(b, p + max_new_tokens)
    logits = model(prompt_tokens, prompt_mask, cache)[:, -1]  # [B, V]
    done = torch.zeros(b, dtype=torch.bool, device=prompt_tokens.device)
    ended = False  # every row has ended (a sharded model's generation goes on while another process's rows have not)
    tokens, masks, logprobs = [], [], []
    for _ in range(max_new_tokens):
        alive = ~done  # [B]: rows still generating sample a real token this step
        if ended:  # padding, with no draw: the generator stays where an unsharded process's generation leaves it
            nxt = torch.full_like(done, pad_id, dtype=torch.long)
        else:
            nxt = _sample(logits, temperature, top_p, generator).masked_fill(done, pad_id)  # [B]
        logp = torch.log_softmax(logits.float() / (temperature or 1.0), dim=-1)  # [B, V]
        logprobs.append(logp.gather(-1, nxt[:, None]).squeeze(-1).masked_fill(done, 0.0))
        tokens.append(nxt)
        masks.append(alive)
        done = done | torch.isin(nxt, stops)
        ended = bool(done.all())
        if sharding.every_rank(done.all()) if lockstep else ended:
            break
        logits = model(nxt[:, None], alive[:, None], cache)[:, -1]
    return Generation(torch.stack(tokens, 1), torch.stack(masks, 1), torch.stack(logprobs, 1))


def completion_logprobs(
    model: CausalLM,
    prompt_tokens: Tensor,
    prompt_mask: Tensor,
    completion: Tensor,
    completion_mask: Tensor,
    *,
    temperature: float = 1.0,
    prompt_index: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Per-token log-probabilities and entropies of ``completion`` under ``softmax(logits / temperature)``.

    One forward pass over ``[prompt, completion]``; differentiable. Positions outside ``completion_mask`` get finite
    values that the caller masks out.

    Args:
        prompt_tokens, prompt_mask: [B, P] (left-padded prompts), or with ``prompt_index`` the U distinct prompts.
        completion, completion_mask: [B, C] (``Generation.tokens`` / ``Generation.mask``).
        temperature: the sampling temperature (0 is treated as 1: greedy decoding has no density).
        prompt_index: [B] long, row b's prompt among U distinct ones (G completions per prompt: U = B / G): the model
            may run each prompt once (:meth:`CausalLM.completion_hidden`). None: row b's prompt is row b.

    Returns:
        (logprobs [B, C], entropies [B, C]).
    """
    p = prompt_tokens.shape[1]
    temperature = temperature or 1.0
    chunk = model.logprob_chunk
    if prompt_index is not None:
        hidden = model.completion_hidden(prompt_tokens, prompt_mask, prompt_index, completion, completion_mask)
    else:
        tokens = torch.cat([prompt_tokens, completion], 1)  # [B, T]
        mask = torch.cat([prompt_mask, completion_mask], 1)
        if chunk is None:
            logits = model(tokens, mask)[:, p - 1 : -1]  # [B, C, V]: position t predicts token t + 1
            return _token_logprobs(logits, completion, temperature)
        hidden = model.hidden(tokens, mask)[:, p - 1 : -1]  # [B, C, D]
    if chunk is None:
        return _token_logprobs(model.logits(hidden), completion, temperature)
    parts = []
    for start in range(0, completion.shape[1], chunk):  # never a float32 [B, C, V] tensor, nor its gradient's
        h, target = hidden[:, start : start + chunk], completion[:, start : start + chunk]
        if torch.is_grad_enabled():
            parts.append(checkpoint(_chunk_logprobs, model, h, target, temperature, use_reentrant=False))
        else:
            parts.append(_chunk_logprobs(model, h, target, temperature))
    return torch.cat([lp for lp, _ in parts], 1), torch.cat([ent for _, ent in parts], 1)


def _token_logprobs(logits: Tensor, targets: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    """Log-probabilities of ``targets`` [B, c] and entropies under ``softmax(logits / temperature)``, in float32."""
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)  # [B, c, V]
    logprobs = logp_all.gather(-1, targets[..., None]).squeeze(-1)  # [B, c]
    entropies = -(logp_all.exp() * logp_all).sum(-1)  # [B, c]
    return logprobs, entropies


def _chunk_logprobs(model: CausalLM, hidden: Tensor, targets: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    return _token_logprobs(model.logits(hidden), targets, temperature)


def save_policy(model: CausalLM, directory: Path) -> Path:
    """Write the policy's weights to ``directory/policy.pt`` (what ``init=<run>`` and ``pgcli eval`` load)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / POLICY_FILE
    tmp = path.with_suffix(".pt.tmp")
    torch.save(model.policy_state(), tmp)
    tmp.replace(path)
    return path


def read_policy(directory: Path, device: torch.device | str = "cpu") -> dict[str, Tensor]:
    """The weights in ``directory/policy.pt``."""
    state: dict[str, Tensor] = torch.load(directory / POLICY_FILE, map_location=device, weights_only=True)
    return state


def load_policy(model: TinyGPT, directory: Path) -> TinyGPT:
    """Load ``directory/policy.pt`` into ``model`` (same sizes) and return it."""
    state = read_policy(directory, model.tok_emb.weight.device)
    model.load_state_dict(state)
    return model
