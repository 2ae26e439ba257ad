"""The real `pgcli` console script in a subprocess: help, version, config printing, and bad input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pgcli import __version__
from pgcli.config.compose import CONF_DIR
from tests.conftest import Store, cli_env, run_pgcli

HEAVY = ("torch", "mlflow", "stable_baselines3", "sb3_contrib")


def heavy_modules_imported(argv: list[str], cwd: Path) -> tuple[list[str], subprocess.CompletedProcess[str]]:
    """Run ``pgcli <argv>`` in a fresh interpreter and report which heavy packages it imported (even on sys.exit)."""
    probe = (
        "import atexit, sys\n"
        f"heavy = {HEAVY!r}\n"
        "atexit.register(lambda: sys.stderr.write('HEAVY=' + ','.join(sorted({m.split('.')[0] for m in sys.modules"
        " if m.split('.')[0] in heavy})) + '\\n'))\n"
        "from pgcli.cli import main\n"
        f"sys.exit(main({argv!r}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], cwd=cwd, capture_output=True, text=True, timeout=120, env=cli_env()
    )
    line = next(line for line in proc.stderr.splitlines() if line.startswith("HEAVY="))
    return [m for m in line.removeprefix("HEAVY=").split(",") if m], proc


def test_top_level_help_lists_commands(workdir: Path):
    proc = run_pgcli(["--help"], cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    for command in ("train", "ui", "compare"):
        assert f"\n  {command} " in proc.stdout
    assert "usage: pgcli <command>" in proc.stdout
    assert run_pgcli([], cwd=workdir).stdout == proc.stdout  # bare `pgcli` shows the same


@pytest.mark.parametrize("argv", [["--help"], ["--version"]], ids=" ".join)
def test_cheap_commands_do_not_import_torch_mlflow_or_sb3(argv: list[str], workdir: Path):
    heavy, proc = heavy_modules_imported(argv, workdir)
    assert proc.returncode == 0, proc.stderr
    assert heavy == [], f"`pgcli {' '.join(argv)}` imported {heavy}"


def test_version(workdir: Path):
    proc = run_pgcli(["--version"], cwd=workdir)
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"pgcli {__version__}"


def test_train_help_lists_every_group_option_and_examples(workdir: Path):
    heavy, proc = heavy_modules_imported(["train", "--help"], workdir)
    assert proc.returncode == 0, proc.stderr
    assert heavy == []
    out = proc.stdout
    assert out.startswith("pgcli train")
    for group in ("algo", "env", "model", "hardware", "tracking", "preset"):
        options = sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml"))
        assert f"\n{group}: {', '.join(options)}\n" in out, f"group {group} not listed with {options}"
    assert "Examples:" in out and "pgcli train algo=a2c env=pendulum" in out
    assert "total_steps: 100000" in out  # the composed config follows
    assert "schema" not in out.split("== Config (")[0]  # the internal schema groups are not options
    assert "\n  ppo (default)  Stable-Baselines3 PPO\n" in out  # each option with its description
    assert not (workdir / "outputs").exists()


def test_train_help_shows_the_config_the_given_overrides_compose_to(workdir: Path):
    proc = run_pgcli(["train", "algo=trpo", "env=hopper", "--help"], cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    config = proc.stdout.split("== Config (")[1]
    assert "target_kl: 0.01" in config and "id: Hopper-v5" in config and "cg_max_steps: 25" in config  # zoo preset
    bad = run_pgcli(["train", "algo=trpoo", "--help"], cwd=workdir)
    assert bad.returncode == 2 and bad.stderr.startswith("pgcli: error: unknown algo option 'trpoo'")
    assert "Traceback" not in bad.stderr and bad.stdout == ""


def test_sft_help_is_headed_pgcli_sft_with_its_algo_task_and_model(workdir: Path):
    # `pgcli sft` is `pgcli train algo=sft env=addition`: its page says so, not "pgcli train" and "ppo (default)"
    proc = run_pgcli(["sft", "--help"], cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("pgcli sft") and "usage: pgcli sft " in out and "usage: pgcli train" not in out
    groups = out.split("== Config (")[0]
    assert "\nalgo: sft\n" in groups and "ppo (default)" not in groups
    assert "\n  addition (default) " in groups and "\n  tiny_gpt (default) " in groups
    assert "pgcli sft env=addition" in out.split("== Config (")[1]  # its own examples
    assert "warmup_steps:" in out.split("== Config (")[1] and "pgcli train algo=a2c" not in out


def test_rm_help_is_headed_pgcli_rm_with_its_algo(workdir: Path):
    proc = run_pgcli(["rm", "--help"], cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("pgcli rm") and "usage: pgcli rm " in proc.stdout
    assert "\nalgo: rm\n" in proc.stdout.split("== Config (")[0] and "label_noise:" in proc.stdout


TINY_RUN = ["tracking=off", "total_steps=256", "eval.episodes=2", "eval.every=0", "progress=false",
            "checkpoint_every=0"]  # fmt: skip


def preset_notes(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("pgcli: note: preset")]


def test_a_run_says_which_preset_it_starts_with_once(workdir: Path):
    proc = run_pgcli(["train", *TINY_RUN], cwd=workdir)  # PPO on CartPole: the ppo_cartpole preset
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert preset_notes(proc.stderr) == [
        "pgcli: note: preset ppo_cartpole applied (conf/preset/ppo_cartpole.yaml; ~preset trains without it)"
    ]
    # ...and where it computes, as its start line and its summary (issue 34: no run said which device it used)
    assert "pgcli: ppo on cartpole (seed 0): cpu, float32\n" in proc.stderr
    assert "  device             cpu, float32\n" in proc.stdout
    # a sweep says it once, with the jobs it applies to (vpg has no CartPole preset)
    proc = run_pgcli(["train", "-m", "algo=ppo,vpg", *TINY_RUN], cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert preset_notes(proc.stderr) == [
        "pgcli: note: preset ppo_cartpole applied to 1 of 2 jobs (conf/preset/ppo_cartpole.yaml; ~preset trains "
        "without it)"
    ]


def test_train_cfg_job_prints_composed_config_and_runs_nothing(workdir: Path):
    heavy, proc = heavy_modules_imported(["train", "--cfg", "job", "algo=a2c", "env=pendulum", "seed=7"], workdir)
    assert proc.returncode == 0, proc.stderr
    assert heavy == []
    cfg = yaml.safe_load(proc.stdout)
    assert cfg["seed"] == 7 and cfg["env"]["id"] == "Pendulum-v1"
    assert cfg["algo"]["n_steps"] == 8 and cfg["algo"]["use_sde"] is True  # the a2c_pendulum preset
    assert "hydra" not in cfg
    assert not (workdir / "outputs").exists()


BAD_INPUT = [
    (["train", "algo.clip_rnge=0.1"], "algo.clip_rnge"),
    (["train", "algo.learning_rate=0"], "algo.learning_rate must be > 0"),
    (["train", "algo.gamma=abc"], "algo.gamma"),
    (["train", "env.id=NoSuchEnv-v0"], "not a registered gymnasium environment"),
    (["train", "algo=nope"], "unknown algo option 'nope' (available: "),
    (["train", "-m", "seed=0,1", "env.n_envs=0,1"], "env.n_envs must be >= 1"),
    (["trian"], "did you mean 'train'"),
]


@pytest.mark.parametrize(("argv", "fragment"), BAD_INPUT, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_bad_input_one_line_status_2_and_no_run(argv: list[str], fragment: str, workdir: Path, store: Store):
    args = [*argv, f"tracking.uri={store.uri}"] if argv[0] == "train" else argv
    proc = run_pgcli(args, cwd=workdir)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("pgcli: error: "), proc.stderr
    assert fragment in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.stdout == ""
    # nothing was created: neither the given store nor the default one, nor a run directory
    assert not store.root.exists()
    assert not (workdir / "outputs").exists()


def test_a_reader_that_stops_early_gets_no_traceback(workdir: Path):
    # `pgcli train --help | true`: the reader exits at once, long before pgcli has composed the config and writes
    exe = Path(sys.executable).parent / "pgcli"
    proc = subprocess.run(
        ["bash", "-c", f"set -o pipefail; '{exe}' train --help | true"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=120,
        env=cli_env(),
    )
    assert proc.stderr == "" and proc.returncode == 141  # 128 + SIGPIPE, as a tool killed by SIGPIPE


COMPLETE = """\
eval "$(pgcli completion bash)"
complete_line() {
    COMP_LINE="$1"; COMP_POINT=${#1}; read -ra COMP_WORDS <<< "$1"
    [[ "$1" == *" " ]] && COMP_WORDS+=("")
    COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 )); _pgcli_complete; echo "${COMPREPLY[*]}"
}
complete_line "pgcli tr"
complete_line "pgcli train algo=t"
complete_line "pgcli train seed=1 env=h"
complete_line "pgcli train algo.clip_r"
"""


def test_bash_completion_completes_commands_and_train_overrides(workdir: Path):
    # what bash does on <TAB>: set COMP_* and call the registered function (the one README.md, "Usage", advertises
    # once failed)
    env = cli_env(PATH=f"{Path(sys.executable).parent}:{cli_env()['PATH']}")
    proc = subprocess.run(["bash", "-c", COMPLETE], cwd=workdir, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "train",
        "algo=trpo",
        "env=halfcheetah env=hopper",
        "algo.clip_range= algo.clip_range_schedule= algo.clip_range_vf=",
    ]


def test_hydra_help_does_not_advertise_hydras_broken_completion(workdir: Path):
    proc = run_pgcli(["train", "--hydra-help"], cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    assert "-sc" not in proc.stdout and 'eval "$(pgcli completion bash)"' in proc.stdout
    sc = run_pgcli(["train", "-sc", "install=bash"], cwd=workdir)
    assert sc.returncode == 2 and sc.stderr.count("\n") == 1 and "pgcli completion bash" in sc.stderr
