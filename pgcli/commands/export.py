"""``pgcli export <run id | run dir | model dir>``: a text run's policy as a Hugging Face model directory
(:mod:`pgcli.lm.export`; docs/lm.md, "Exporting a text run").

A TinyGPT run becomes a GPT-2 with the same logits and its character tokenizer; a ``model=hf`` run its base model with
the run's weights merged in. Either trains on with ``model=hf model.path=<export>``, which takes the run's task settings
from the export's ``pgcli_task.json`` as ``init=`` does (:func:`pgcli.training.pipeline.export_overrides`).
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Sequence
from dataclasses import MISSING, fields, replace
from pathlib import Path
from typing import Any

from pgcli.config.overrides import override_key
from pgcli.errors import CommandParser, ConfigError


def parse_args(args: Sequence[str]) -> argparse.Namespace:
    parser = CommandParser(
        prog="pgcli export",
        description="Write a text run's policy as a Hugging Face model directory (config.json, weights, tokenizer): "
        "TinyGPT as a GPT-2 with the same logits, a model=hf run with its LoRA adapters merged.",
        epilog="examples:\n"
        "  pgcli export 3f9c0d...                    # -> <run dir>/hf (or ./<run name>-hf without the run dir)\n"
        "  pgcli export outputs/runs/.../model --out ./addition-sft\n"
        "  pgcli train algo=grpo env=addition model=hf model.path=./addition-sft",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("target", help="run id, run directory or model directory of a text run")
    parser.add_argument("--best", action="store_true", help="the best-evaluated model (best_model/) instead")
    parser.add_argument("--out", type=Path, help="directory to write (default: <run dir>/hf)")
    parser.add_argument("overrides", nargs="*", help="tracking overrides, e.g. tracking.uri=... (as for pgcli train)")
    ns = parser.parse_intermixed_args(list(args))
    bad = [o for o in ns.overrides if not override_key(o).startswith("tracking")]
    if bad:
        raise ConfigError(f"pgcli export takes tracking overrides only (got {bad[0]!r})")
    if ns.out is not None:
        from pgcli.training.preflight import check_out_dir

        ns.out = check_out_dir(ns.out, "--out", empty=True)
    return ns


def main(args: Sequence[str]) -> int:
    """Entry point of ``pgcli export``."""
    ns = parse_args(args)
    import torch

    from pgcli.commands.eval import EVAL, resolve_target
    from pgcli.config import HFModelConfig, TextEnvConfig
    from pgcli.config.saved_agent import read_agent_spec, write_export_task
    from pgcli.lm.load import make_text_policy, make_text_task
    from pgcli.tracking.store import open_run_store
    from pgcli.training.checks import train_config
    from pgcli.training.preflight import check_out_dir

    store = open_run_store(train_config(ns.overrides).tracking)
    with resolve_target(ns.target, best=ns.best, store=store, wording=replace(EVAL, doing="export")) as target:
        cfg = target.cfg
        if not isinstance(cfg.env, TextEnvConfig):
            raise ConfigError(
                f"{ns.target} is a {target.env} run; pgcli export writes text policies (env=addition, sort, countdown)"
            )
        out = ns.out or check_out_dir(
            _default_out(target.run_dir, cfg.run_name or f"{target.algo}-{target.env}"), "--out", empty=True
        )
        task = make_text_task(cfg.env, cfg.model, saved=read_agent_spec(target.model_dir), rows=False)
        policy = make_text_policy(task, cfg.model, torch.device("cpu"), target.model_dir)
        if isinstance(cfg.model, HFModelConfig):
            from pgcli.lm.export import export_hf
            from pgcli.lm.hf import HFCausalLM, HFTokenizer

            assert isinstance(policy, HFCausalLM) and isinstance(task.vocab, HFTokenizer)
            export_hf(policy, task.vocab.tokenizer, out)
            kind = f"{cfg.model.path} with the run's weights"
        else:
            from pgcli.lm.export import export_tiny_gpt
            from pgcli.lm.model import TinyGPT
            from pgcli.lm.tasks import CharVocab

            assert isinstance(policy, TinyGPT) and isinstance(task.vocab, CharVocab)
            export_tiny_gpt(policy, task.vocab, out)
            kind = "GPT-2, the same logits"
        run_id = target.run.run_id if target.run is not None else None
        write_export_task(out, read_agent_spec(target.model_dir), run_id)
    n_params = sum(p.numel() for p in policy.parameters())
    print(f"wrote {out} ({kind}; {n_params / 1e6:.2f}M parameters)")
    command = ["pgcli", "train", "algo=grpo", f"env={cfg.env.id}", *task_settings(cfg.env), "model=hf"]
    print(f"train from it: {shlex.join([*command, f'model.path={out}'])}")
    return 0


def task_settings(env: Any) -> list[str]:
    """``env.<key>=<value>`` for each task setting of ``env`` that differs from the task's default (those ``init=``
    carries, and a dataset's ``env.path``): the hint trains the exported run's task, not the default one."""
    from pgcli.config import TextEnvConfig
    from pgcli.lm.init import NOT_CARRIED

    shared = {f.name for f in fields(TextEnvConfig)}
    out = []
    for f in sorted(fields(env), key=lambda f: f.name in shared):  # the task's own settings (n_digits) first
        value = getattr(env, f.name)
        if f.name in NOT_CARRIED or not isinstance(value, int | float | str):
            continue
        if f.default is MISSING or value != f.default:
            out.append(f"env.{f.name}={value}")
    return out


def _default_out(run_dir: Path | None, name: str) -> Path:
    return run_dir / "hf" if run_dir is not None else Path(f"{name}-hf")
