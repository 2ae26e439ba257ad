"""A run's references resolved once and recorded whole (pgcli.training.references), the words of a sweep job
(pgcli.config.overrides), and the other small pure helpers of issue 34's papercuts."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from pgcli.agent import write_text_agent_files
from pgcli.commands.runs import cut_middle, table
from pgcli.config.compose import compose_train_config
from pgcli.config.overrides import Overrides, plain_override, swept_label
from pgcli.errors import ConfigError
from pgcli.lm.init import same_model_path
from pgcli.lm.load import make_text_policy
from pgcli.lm.model import save_policy
from pgcli.lm.tasks import Addition, make_task
from pgcli.pyfunc import prompt_notes
from pgcli.training.console import HideLauncherInternals
from pgcli.training.references import locate_init, override_value, pin_references, recorded_references


def _sft_run(run_dir: Path, status: str | None) -> Path:
    cfg = compose_train_config(["algo=sft", "env=addition", "model.d_model=32", "model.d_ff=64"])
    save_policy(make_text_policy(make_task(cfg.env), cfg.model, torch.device("cpu")), run_dir / "model")
    write_text_agent_files(run_dir / "model", cfg, algo_name="sft", env_name="addition")
    info = {"run_id": None, "tracking_uri": None, **({} if status is None else {"status": status})}
    (run_dir / "run.json").write_text(json.dumps(info))
    return run_dir


@pytest.mark.parametrize("value", ["/tmp/a b,c", "it's", "/a=b", "/tmp/x-1/y", "rm:/a/b", "1234567890" * 3 + "12"])
def test_override_value_reads_back_as_the_same_string(value: str):
    (parsed,) = Overrides.parse([f"init={override_value(value)}"])
    assert parsed.value() == value


def test_a_relative_model_dir_is_pinned_absolute_and_a_hub_id_or_a_sweep_as_typed(tmp_path, monkeypatch):
    (tmp_path / "tl").mkdir()
    monkeypatch.chdir(tmp_path)
    tracking = compose_train_config(["env=addition", "algo=grpo"]).tracking
    lines = ["model=hf", "model.path=./tl", "seed=1"]
    assert pin_references(lines, tracking) == ["model=hf", f"model.path={tmp_path / 'tl'}", "seed=1"]
    assert pin_references(["model.path=Qwen/Qwen2.5-0.5B"], tracking) == ["model.path=Qwen/Qwen2.5-0.5B"]
    assert pin_references(["model.path=./tl,./tl"], tracking) == ["model.path=./tl,./tl"]
    assert pin_references(["seed=1"], tracking) == ["seed=1"]


def test_init_of_a_run_directory_is_pinned_to_the_absolute_run_directory(tmp_path, monkeypatch):
    run_dir = _sft_run(tmp_path / "runs" / "sft", "FINISHED")
    monkeypatch.chdir(tmp_path)
    tracking = compose_train_config(["env=addition", "algo=grpo", "tracking=off"]).tracking
    assert pin_references(["init=runs/sft/model"], tracking) == [f"init={run_dir}"]
    assert locate_init("runs/sft", tracking).run_dir == run_dir


@pytest.mark.parametrize("status", ["FAILED", "RUNNING", "KILLED"])
def test_a_run_directory_that_did_not_finish_is_refused_as_a_run_id_is(tmp_path, status: str):
    run_dir = _sft_run(tmp_path / f"sft-{status}", status)
    tracking = compose_train_config(["env=addition", "algo=grpo", "tracking=off"]).tracking
    with pytest.raises(ConfigError) as info:
        locate_init(str(run_dir), tracking)
    assert str(info.value) == (
        f"init={run_dir}: run {run_dir} is {status}, not FINISHED; its final model may be missing"
    )


def test_a_run_directory_without_a_status_or_run_json_is_taken(tmp_path):
    tracking = compose_train_config(["env=addition", "algo=grpo", "tracking=off"]).tracking
    old = _sft_run(tmp_path / "old", None)
    assert locate_init(str(old), tracking).model_dir == old / "model"
    (old / "run.json").unlink()
    assert locate_init(str(old / "model"), tracking).run_id is None  # a model directory outside a run: no status


def test_resume_uses_the_recorded_directory_while_it_is_here_else_the_whole_id(tmp_path):
    tags = {"init": str(tmp_path), "init_run_id": "a" * 32, "reward_model": str(tmp_path / "gone")}
    tags["reward_model_run_id"] = "b" * 32
    assert recorded_references(tags) == [f"init={tmp_path}", f"env.reward=rm:{'b' * 32}"]
    assert recorded_references({"algo": "ppo"}) == []


def test_same_model_path_compares_directories_not_strings(tmp_path, monkeypatch):
    (tmp_path / "tl").mkdir()
    monkeypatch.chdir(tmp_path)
    assert same_model_path("./tl", str(tmp_path / "tl")) and same_model_path("tl", "./tl/")
    assert same_model_path("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-0.5B")
    assert not same_model_path("./tl", "./other") and not same_model_path("a/b", "a/c")


def test_sweep_jobs_are_labelled_by_what_they_vary_without_hydras_escapes():
    job = ["algo=grpo", "env=addition", "algo.beta=0.04", "env.reward=rm\\:abc12345", "seed=1", "total_steps=8"]
    assert swept_label(job, {"algo.beta", "seed", "algo"}) == "-algo.beta=0.04"
    assert swept_label(job, {"env.reward", "algo.beta"}) == "-algo.beta=0.04-env.reward=rm:abc12345"
    assert swept_label(job, set()) == ""
    assert plain_override("tracking.uri=sqlite\\:////tmp/m.db") == "tracking.uri=sqlite:////tmp/m.db"


def test_hydras_job_lines_are_shown_as_typed():
    record = logging.LogRecord("hydra", logging.INFO, "", 0, "\t#0 : algo=grpo env.reward=rm\\:/tmp/rm", None, None)
    assert HideLauncherInternals().filter(record) and record.getMessage() == "\t#0 : algo=grpo env.reward=rm:/tmp/rm"
    other = logging.LogRecord("hydra", logging.INFO, "", 0, "Launching 2 jobs locally", None, None)
    assert HideLauncherInternals().filter(other) and other.getMessage() == "Launching 2 jobs locally"


def test_runs_cuts_long_names_in_their_middle():
    names = [f"ppo_lm-addition-algo.learning_rate=0.000{i}-s0" for i in range(5)]
    assert cut_middle(names[0], 20) == "ppo_lm-add…0.0000-s0" and len(cut_middle(names[0], 20)) == 20
    assert cut_middle("short", 20) == "short"
    header = ["id", "status", "experiment", "algo", "env", "steps", "duration", "return", "started", "name"]
    row = ["0123abcd", "FINISHED", "e" * 16, "a" * 10, "v" * 18, "1", "1s", "0.0", "2026-01-01 00:00"]
    lines = table(header, [[*row, name] for name in names] + [[*row, "x" * 80]])
    shown = [line.split()[-1] for line in lines[1:6]]
    assert len(set(shown)) == 5  # five names, five different cells


def test_prompts_outside_a_generated_task_are_refused_or_noted():
    puzzle = Addition(2)
    assert prompt_notes(puzzle, "addition", ["12+34="]) == []
    (note,) = prompt_notes(puzzle, "addition", ["1234+5678=", "1+2="])
    assert note.startswith("prompt '1234+5678=' is longer than env=addition's (6 characters at most)")
    with pytest.raises(ValueError, match=r"^prompt '12\*34=': character '\*' is not in the vocabulary"):
        prompt_notes(puzzle, "addition", ["12*34="])


def test_a_resume_that_repeats_the_command_types_its_references_as_the_run_recorded_them(tmp_path, monkeypatch):
    from pgcli.training.resume import _as_recorded

    (tmp_path / "tl").mkdir()
    monkeypatch.chdir(tmp_path)
    cfg = compose_train_config(["env=addition", "algo=grpo", "tracking=off"])
    recorded = ["model=hf", f"model.path={tmp_path / 'tl'}"]
    assert _as_recorded(["model=hf", "model.path=./tl", "total_steps=9"], recorded, cfg) == [
        "model=hf",
        f"model.path={tmp_path / 'tl'}",
        "total_steps=9",
    ]
