"""What a text `pgcli eval` and a refused LoRA target import (issue 34, item 10; docs/benchmarks/overhead.md, "Light
commands: budgets"): each command runs through ``pgcli.cli.main`` in a fresh interpreter (not the test's forked
server, which has everything imported already), which then lists the heavy packages it holds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.integration.conftest import SFTRun

HEAVY = ("torch", "transformers", "peft", "mlflow", "gymnasium", "stable_baselines3", "ray", "optuna", "mujoco")
HEAVY += ("hydra", "matplotlib", "sqlalchemy")
PROBE = f"""
import json, sys
from pgcli.cli import main
code = main(sys.argv[1:])
print(json.dumps({{"code": code, "heavy": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""


def imports_of(args: list[str], cwd: Path) -> tuple[int, list[str], str]:
    """Exit status of ``pgcli <args>`` in a fresh interpreter, the heavy packages it imported, and its stderr."""
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    return report["code"], report["heavy"], proc.stderr


def test_a_text_eval_without_logging_imports_torch_alone(lm_sft_run: SFTRun, tmp_path: Path):
    run_dir = lm_sft_run.run_dir
    code, heavy, stderr = imports_of(["eval", str(run_dir), "--no-log", "--out", str(tmp_path / "eval")], tmp_path)
    assert code == 0, stderr[-2000:]
    assert heavy == ["torch"]  # no env, SB3, MLflow, Hydra or transformers for a TinyGPT run
    assert json.loads((tmp_path / "eval" / "eval.json").read_text())  # it evaluated


def test_an_unknown_run_id_is_refused_before_torch_or_mlflow(tmp_path: Path):
    from mlflow.tracking import MlflowClient

    (tmp_path / "outputs").mkdir()
    MlflowClient(f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}").create_experiment("x")  # a store, no such run
    code, heavy, stderr = imports_of(["eval", "0123abcd"], tmp_path)
    assert code == 2 and stderr.startswith("pgcli: error: no run 0123abcd in sqlite:///"), stderr
    assert heavy == []


def test_a_lora_target_the_model_lacks_is_refused_before_torch(tiny_hf_model: Path, tmp_path: Path):
    lora = ["model=hf", f"model.path={tiny_hf_model}", "model.lora.r=4", "model.lora.target_modules=[qkv_nope]"]
    args = ["train", "algo=grpo", "env=addition", *lora, "tracking=off"]
    code, heavy, stderr = imports_of(args, tmp_path)
    assert code == 2, stderr[-2000:]
    assert stderr.startswith("pgcli: error: model.lora.target_modules=['qkv_nope']: ") and "q_proj" in stderr
    assert stderr.count("\n") == 1, stderr
    assert not {"torch", "transformers", "peft"} & set(heavy), heavy
    assert not (tmp_path / "outputs").exists()
