"""``pgcli data show|export``: look at a text task's rows as the model will see them, or write a built-in task's rows
as jsonl (docs/lm.md, "Your data").

- ``pgcli data show env=dataset env.path=rows.jsonl [model=hf model.path=...]``: the row counts, the columns, two
  prompts exactly as the model reads them (chat template applied) with their token counts, and what the verifier says
  about the reference answers, so a dataset whose answers its own verifier rejects is caught before a GPU hour is
  spent. It works on the built-in tasks too (``pgcli data show env=countdown``).
- ``pgcli data export env=addition env.n_digits=2 --out DIR``: ``DIR/train.jsonl`` (``--rows`` training problems drawn
  as a run draws them) and ``DIR/eval.jsonl`` (the task's held-out set), with ``prompt``, ``answer`` and
  ``completion`` (the demonstration) columns, so the built-in task and ``env=dataset`` can be compared on the same
  problems.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pgcli.config.overrides import override_key
from pgcli.errors import CommandParser, ConfigError

if TYPE_CHECKING:
    from pgcli.config import TrainConfig
    from pgcli.lm.tasks import Problem, TextTask

ACTIONS = ("show", "export")
CHECKED_ANSWERS = 1000
"""``show`` runs the verifier on at most this many reference answers of each split."""


def parse_args(args: Sequence[str]) -> argparse.Namespace:
    parser = CommandParser(
        prog="pgcli data",
        description="Show a text task's rows as the model sees them (show), or write a built-in task as jsonl rows "
        "(export). Overrides are those of pgcli train (env=..., env.*, model=..., model.*).",
        epilog="examples:\n"
        "  pgcli data show env=dataset env.path=data/train.jsonl env.reward=math\n"
        "  pgcli data show env=dataset env.path=data/chat.jsonl model=hf model.path=./my-model\n"
        "  pgcli data export env=addition env.n_digits=2 --out data/addition --rows 20000\n"
        "  pgcli train algo=grpo env=dataset env.path=data/addition/train.jsonl env.eval_path=data/addition/eval.jsonl",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "action",
        choices=ACTIONS,
        help="show: counts, columns, rendered prompts, verifier check; export: a built-in task's rows as jsonl",
    )
    parser.add_argument("--out", type=Path, help="export: the directory to write train.jsonl and eval.jsonl into")
    parser.add_argument("--rows", type=int, default=10000, help="export: training rows to draw (default 10000)")
    parser.add_argument("--seed", type=int, default=0, help="export: seed of the training draw (default 0)")
    parser.add_argument("--show", type=int, default=2, help="show: prompts to print (default 2)")
    parser.add_argument("overrides", nargs="*", help="env=..., env.*, model=..., model.* (as for pgcli train)")
    ns = parser.parse_intermixed_args(list(args))
    bad = [o for o in ns.overrides if override_key(o).split(".")[0] not in ("env", "model", "hardware", "tracking")]
    if bad:
        raise ConfigError(f"pgcli data takes env, model and hardware overrides (got {bad[0]!r})")
    if ns.action == "export" and ns.out is None:
        raise ConfigError("pgcli data export needs --out DIR (train.jsonl and eval.jsonl are written there)")
    if ns.rows < 1 or ns.show < 0:
        raise ConfigError(f"--rows must be >= 1 and --show >= 0 (got --rows {ns.rows}, --show {ns.show})")
    return ns


def main(args: Sequence[str]) -> int:
    """Entry point of ``pgcli data``."""
    ns = parse_args(args)
    if ns.action == "export":
        _check_out(ns.out)
    cfg = _config(ns.overrides)
    from pgcli.lm.load import make_text_task

    task = make_text_task(cfg.env, cfg.model)
    if ns.action == "export":
        return export(task, cfg, ns.out, rows=ns.rows, seed=ns.seed)
    return show(task, cfg, n_show=ns.show)


def _config(overrides: list[str]) -> TrainConfig:
    """The run config these overrides describe, as ``pgcli train algo=grpo`` composes it (the task and the model)."""
    from pgcli.config import TextEnvConfig
    from pgcli.training.checks import train_config

    if not any(override_key(o) == "env" for o in overrides):
        raise ConfigError("pgcli data needs a text task: env=dataset env.path=... or env=addition|sort|countdown")
    cfg = train_config(["algo=grpo", *overrides])
    if not isinstance(cfg.env, TextEnvConfig):
        raise ConfigError(f"pgcli data reads text tasks; env={cfg.env.id} is a gymnasium env")
    return cfg


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; pass a directory")
    for name in ("train.jsonl", "eval.jsonl"):
        if (out / name).exists():
            raise ConfigError(f"--out {out} already holds {name}; pass another --out")


def export(task: TextTask, cfg: TrainConfig, out: Path, *, rows: int, seed: int) -> int:
    """Write ``rows`` training problems and the held-out set as jsonl; print the command that trains on them."""
    import numpy as np

    from pgcli.config import DatasetEnvConfig

    if isinstance(cfg.env, DatasetEnvConfig):
        raise ConfigError(
            "pgcli data export writes a built-in task (env=addition|sort|countdown); env=dataset rows are already files"
        )
    train = task.sample(np.random.default_rng(seed), rows)
    held_out = task.eval_problems()
    out.mkdir(parents=True, exist_ok=True)
    for name, problems in (("train.jsonl", train), ("eval.jsonl", held_out)):
        tmp = out / f".{name}.tmp"
        with tmp.open("w") as f:
            for problem in problems:
                f.write(json.dumps(_row(task, problem)) + "\n")
        tmp.replace(out / name)  # a reader never sees half a file
    print(
        f"wrote {len(train)} training rows to {out / 'train.jsonl'} and the {len(held_out)} held-out rows to "
        f"{out / 'eval.jsonl'} (env={cfg.env.id}, draw seed {seed})"
    )
    print("train on them:")
    print(f"  pgcli sft env=dataset env.path={out / 'train.jsonl'} env.eval_path={out / 'eval.jsonl'}")
    return 0


def _row(task: TextTask, problem: Problem) -> dict[str, Any]:
    return {"prompt": problem.prompt, "answer": problem.answer, "completion": task.demonstration(problem)}


def show(task: TextTask, cfg: TrainConfig, *, n_show: int) -> int:
    """Print what the model will read of this task, and the verifier's verdict on the reference answers."""
    described = getattr(task, "describe", None)
    lines = (
        described() if callable(described) else [f"task {task.name} (generated: rows are drawn as a run draws them)"]
    )
    for line in lines:
        print(line)
    held_out = task.eval_problems()
    print(f"held-out problems scored at each evaluation: {len(held_out)}")
    import numpy as np

    examples = task.sample(np.random.default_rng(cfg.seed), max(n_show, 1))[:n_show]
    for i, problem in enumerate(examples, 1):
        tokens = task.vocab.encode_prompt(problem.prompt)
        print(f"\n--- prompt {i} ({len(tokens)} tokens, at most {task.max_completion_len} to complete) ---")
        print(problem.prompt)
        print(f"--- reference answer: {problem.answer!r}")
    _print_verdict(task, held_out)
    return 0


def _print_verdict(task: TextTask, held_out: list[Problem]) -> None:
    """The checker on the reference answers: a dataset whose answers its verifier rejects cannot be learned."""
    checked = held_out[:CHECKED_ANSWERS]
    if getattr(task, "checker", True) is None:
        print("\nno verifier: this task's reward is not a checker (eval/accuracy is not reported)")
        return
    passed = [task.correct(p, task.demonstration(p)) for p in checked]
    rate = sum(passed) / max(len(passed), 1)
    print(
        f"\nverifier on the reference answers of {len(checked)} held-out problems: {sum(passed)} accepted ({rate:.1%})"
    )
    rejected = [p for p, ok in zip(checked, passed, strict=True) if not ok][:3]
    for problem in rejected:
        print(f"  rejected: prompt {problem.prompt[:60]!r} answer {problem.answer[:60]!r}")
    if rejected:
        print("  a reference answer its own verifier rejects cannot earn reward: check env.answer_key and env.reward")
