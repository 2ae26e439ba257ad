"""``pgcli data`` end to end (docs/lm.md, "Your data"): ``export`` writes a built-in task's rows as jsonl whose
held-out rows are the task's own held-out set, ``show`` prints prompts as the model reads them and the verifier's
verdict on the reference answers; bad arguments are one line, exit 2, with nothing written."""

from __future__ import annotations

import json
from pathlib import Path

from pgcli.config import AdditionEnvConfig
from pgcli.lm.tasks import make_task
from tests.conftest import run_pgcli


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_export_writes_the_tasks_rows_and_its_held_out_set(workdir: Path) -> None:
    proc = run_pgcli(["data", "export", "env=addition", "env.n_digits=2", "--rows", "40", "--out", "rows"], cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    train, held_out = _rows(workdir / "rows" / "train.jsonl"), _rows(workdir / "rows" / "eval.jsonl")
    assert len(train) == 40 and set(train[0]) == {"prompt", "answer", "completion"}
    for row in train:
        a, b = row["prompt"].rstrip("=").split("+")
        assert int(a) < 100 and int(b) < 100 and row["answer"] == row["completion"] == str(int(a) + int(b))
    task = make_task(AdditionEnvConfig(n_digits=2))
    assert [r["prompt"] for r in held_out] == [p.prompt for p in task.eval_problems()]
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held_out}  # never trained on, as the task promises
    assert "env.path=rows/train.jsonl env.eval_path=rows/eval.jsonl" in proc.stdout


def test_show_prints_prompts_and_the_verifiers_verdict(workdir: Path) -> None:
    proc = run_pgcli(["data", "show", "env=countdown", "--show", "3"], cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("--- prompt ") == 3 and "tokens" in proc.stdout
    assert "verifier on the reference answers of 256 held-out problems: 256 accepted (100.0%)" in proc.stdout


def test_bad_arguments_are_one_line_and_write_nothing(workdir: Path) -> None:
    (workdir / "taken").mkdir()
    (workdir / "taken" / "train.jsonl").write_text("keep\n")
    (workdir / "a_file").write_text("keep\n")
    cases = {
        ("data", "export", "env=addition"): "needs --out DIR",
        ("data", "export", "env=addition", "--out", "a_file"): "is a file",
        ("data", "export", "env=addition", "--out", "taken"): "already holds train.jsonl",
        ("data", "show"): "needs a text task",
        ("data", "show", "env=cartpole"): "env=CartPole-v1 is a gymnasium env",
        ("data", "show", "env=addition", "algo=ppo"): "takes env, model and hardware overrides",
        ("data", "list", "env=addition"): "invalid choice: 'list'",
    }
    for args, message in cases.items():
        proc = run_pgcli(list(args), cwd=workdir)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], (args, proc.stderr)
    assert (workdir / "taken" / "train.jsonl").read_text() == "keep\n" and (workdir / "a_file").read_text() == "keep\n"
    assert sorted(p.name for p in workdir.iterdir()) == ["a_file", "taken"]
