"""model=hf on one GPU: sampling speed against ``model.generate`` and the peak memory of one GRPO update, with random
weights of a 0.5B model's real shape (Qwen2.5-0.5B: hidden 896, 24 layers, 14 query / 2 key-value heads, MLP 4864,
vocabulary 151,936) in bfloat16 (docs/benchmarks/lm_hf.md, "One GPU"). Sized to finish in under 8 minutes on one
H100; nothing is downloaded (the model is written by ``pgcli.lm.random_hf``).

``speed``: 128 prompts (16 addition prompts x 8), 256 new tokens each, sampled at temperature 1: pgcli's batched
key/value-cache loop (``pgcli.lm.model.generate`` over ``HFCausalLM``, what every trainer samples with) against
``transformers``' ``model.generate(do_sample=True)`` with the same batch, interleaved round by round; tokens/s and the
ratio (target >= 1.0).

``memory``: one GRPO update (16 prompts x G = 8, 256 new tokens, minibatches of 32, checkpointing) with LoRA r=16
against a full fine-tune; ``torch.cuda.max_memory_allocated`` of each (target: LoRA <= 16 GB and <= 0.5x full).

    python benchmarks/lm_hf_gpu.py --out results.json                       # on the GPU machine
    python benchmarks/lm_hf_gpu.py --tiny --device cpu --out /tmp/dry.json  # a dry run of the same code on a CPU
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

SHAPE = {"hidden": 896, "layers": 24, "heads": 14, "kv_heads": 2, "intermediate": 4864, "vocab": 151936}
TINY = {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128, "vocab": 4096}


def config(model_dir: Path, *extra: str) -> Any:
    from pgcli.training.checks import train_config

    return train_config(
        [
            "algo=grpo",
            "env=addition",
            "model=hf",
            f"model.path={model_dir}",
            "tracking=off",
            "algo.group_size=8",
            "algo.n_groups=16",
            "algo.batch_size=32",
            *extra,
        ]
    )


def speed(model_dir: Path, device: Any, dtype: str, new_tokens: int, rounds: int) -> dict[str, Any]:
    import numpy as np
    import torch

    from pgcli.lm.load import make_text_policy, make_text_task
    from pgcli.lm.model import generate
    from pgcli.lm.tasks import encode_prompts

    cfg = config(model_dir, f"model.dtype={dtype}", f"model.max_new_tokens={new_tokens}", "model.lora.r=0")
    task = make_text_task(cfg.env, cfg.model)
    policy = make_text_policy(task, cfg.model, device).eval()
    problems = [p for p in task.sample(np.random.default_rng(0), 16) for _ in range(8)]
    tokens, mask = encode_prompts(task.vocab, problems, device)
    never = [policy.lm.config.vocab_size + 1]  # no stop token: every row samples all new_tokens, on both sides
    ours, theirs = [], []
    for round_ in range(rounds):
        _sync(device)
        start = time.perf_counter()
        with torch.no_grad():
            out = generate(
                policy,
                tokens,
                mask,
                max_new_tokens=new_tokens,
                eos_id=never,
                temperature=1.0,
                generator=torch.Generator(device=device).manual_seed(round_),
                pad_id=task.vocab.pad_id,
            )
        _sync(device)
        ours.append(int(out.mask.sum()) / (time.perf_counter() - start))
        start = time.perf_counter()
        with torch.no_grad():
            hf = policy.lm.generate(
                input_ids=tokens,
                attention_mask=mask.long(),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                pad_token_id=task.vocab.pad_id,
                use_cache=True,
            )
        _sync(device)
        theirs.append((hf.shape[1] - tokens.shape[1]) * hf.shape[0] / (time.perf_counter() - start))
        print(f"round {round_}: pgcli {ours[-1]:.0f} tok/s, model.generate {theirs[-1]:.0f} tok/s", flush=True)
    del policy
    _free(device)
    return {
        "pgcli_tokens_per_s": statistics.median(ours),
        "generate_tokens_per_s": statistics.median(theirs),
        "ratio": statistics.median(o / t for o, t in zip(ours, theirs, strict=True)),
        "rounds": rounds,
    }


def update_peak(model_dir: Path, device: Any, dtype: str, new_tokens: int, lora_r: int) -> dict[str, Any]:
    """Peak GPU memory (GB) and wall time of one GRPO update (sampling included) from a fresh model."""
    import torch

    from pgcli.algo.lm_base import kl_reference
    from pgcli.algo.lm_grpo import LMGRPO
    from pgcli.lm.hf import AdapterOff
    from pgcli.lm.load import make_text_policy, make_text_task

    cfg = config(
        model_dir,
        f"model.dtype={dtype}",
        f"model.max_new_tokens={new_tokens}",
        f"model.lora.r={lora_r}",
        "model.gradient_checkpointing=true",
        "algo.beta=0.04",
    )
    task = make_text_task(cfg.env, cfg.model)
    policy = make_text_policy(task, cfg.model, device)
    reference = kl_reference(cfg.algo, policy, AdapterOff(policy) if lora_r else None)  # as pgcli train builds it
    trainer = LMGRPO(cfg.algo, task=task, policy=policy, reference=reference, model=cfg.model, seed=0, device=device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    class Quiet:
        def log(self, step: int, metrics: dict[str, float]) -> None: ...

        def update(self, step: int, agent: object) -> None: ...

        def add_episodes(self, *args: object) -> None: ...

    _sync(device)
    start = time.perf_counter()
    trainer.learn(cfg.algo.group_size * cfg.algo.n_groups, Quiet())  # type: ignore[arg-type]
    _sync(device)
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else float("nan")
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    del trainer, policy, reference
    _free(device)
    print(f"GRPO update, lora r={lora_r}: peak {peak:.2f} GB, {seconds:.1f} s, {trainable / 1e6:.1f}M trainable")
    return {"lora_r": lora_r, "peak_gb": peak, "seconds": seconds, "trainable_params": trainable}


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free(device: Any) -> None:
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def main() -> None:
    import torch

    from pgcli.lm.random_hf import write_random_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a tiny model and short completions (a dry run)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    device = torch.device(args.device)
    shape, new_tokens = (TINY, 16) if args.tiny else (SHAPE, 256)
    dtype = "float32" if device.type == "cpu" else "bfloat16"
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_random_model(Path(tmp) / "model", max_positions=1024, **shape)
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        result: dict[str, Any] = {
            "shape": shape,
            "new_tokens": new_tokens,
            "dtype": dtype,
            "torch": torch.__version__,
            "device": name,
        }
        result["speed"] = speed(model_dir, device, dtype, new_tokens, args.rounds)
        result["lora"] = update_peak(model_dir, device, dtype, new_tokens, lora_r=16)
        result["full"] = update_peak(model_dir, device, dtype, new_tokens, lora_r=0)
    result["lora_over_full_peak"] = result["lora"]["peak_gb"] / result["full"]["peak_gb"]
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
