"""init=<run>: an SFT model directory is found, checked against the new run, and its weights loaded."""

from __future__ import annotations

import json

import pytest
import torch

from pgcli.agent import write_text_agent_files
from pgcli.config.compose import compose_train_config
from pgcli.errors import ConfigError
from pgcli.lm.init import check_init
from pgcli.lm.load import make_text_policy
from pgcli.lm.model import load_policy, save_policy
from pgcli.lm.tasks import make_task
from pgcli.training.pipeline import init_overrides
from pgcli.training.references import locate_init


@pytest.fixture
def sft_run(tmp_path):
    """A run directory as `pgcli sft` leaves it: model/policy.pt + agent.json, run.json."""
    cfg = compose_train_config(["algo=sft", "env=addition", "model.d_model=32", "model.d_ff=64"])
    policy = make_text_policy(make_task(cfg.env), cfg.model, torch.device("cpu"))
    run_dir = tmp_path / "run"
    save_policy(policy, run_dir / "model")
    write_text_agent_files(run_dir / "model", cfg, algo_name="sft", env_name="addition")
    (run_dir / "run.json").write_text(json.dumps({"run_id": "a" * 32}))
    return run_dir, policy


def test_a_run_dir_or_its_model_dir_is_found_and_loads(sft_run):
    run_dir, policy = sft_run
    cfg = compose_train_config(["algo=sft", "env=addition", "model.d_model=32", "model.d_ff=64", "env.n_digits=4"])
    for target in (run_dir, run_dir / "model"):
        source = locate_init(str(target), cfg.tracking)
        assert source.model_dir == (run_dir / "model").resolve() and source.spec["algo"] == "sft"
        check_init(source, cfg.env, cfg.model, str(target))  # 4 digits: same characters, same sizes: fits
    assert locate_init(str(run_dir), cfg.tracking).run_id == "a" * 32
    fresh = make_text_policy(make_task(cfg.env), cfg.model, torch.device("cpu"))
    load_policy(fresh, run_dir / "model")
    for a, b in zip(fresh.state_dict().values(), policy.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_a_model_of_other_sizes_or_characters_is_refused(sft_run):
    run_dir, _ = sft_run
    cfg = compose_train_config(["algo=sft", "env=addition", "model.d_model=64", "model.d_ff=64"])
    source = locate_init(str(run_dir), cfg.tracking)
    with pytest.raises(ConfigError, match=r"^init=x: the source has model.d_model=32, this run model.d_model=64; set"):
        check_init(source, cfg.env, cfg.model, "x")
    sort = compose_train_config(["algo=sft", "env=sort", "model.d_model=32", "model.d_ff=64"])
    with pytest.raises(ConfigError, match=r"^init=x: the source was trained on env=addition, whose characters differ"):
        check_init(source, sort.env, sort.model, "x")


def test_missing_sources_are_one_line_errors(tmp_path):
    cfg = compose_train_config(["algo=sft", "env=addition", f"tracking.store_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"no such run directory \(and not an MLflow run id\)"):
        locate_init(str(tmp_path / "nowhere"), cfg.tracking)
    with pytest.raises(ConfigError, match=r"holds no model/policy.pt"):
        locate_init(str(tmp_path), cfg.tracking)
    with pytest.raises(ConfigError, match=r"no tracking store at sqlite:///"):
        locate_init("b" * 32, cfg.tracking)


def test_init_overrides_take_what_the_command_line_leaves_out(sft_run, capsys):
    run_dir, _ = sft_run  # 4-digit addition on d_model=32, d_ff=64
    args = ["algo=grpo", "env=addition", f"init={run_dir}"]
    assert init_overrides([*args, "env.n_digits=3"]) == ["model.d_model=32", "model.d_ff=64"]
    note = capsys.readouterr().err
    assert note == (
        f"pgcli: note: init={run_dir} sets model.d_model=32 model.d_ff=64 (the init run's model and "
        "task settings; a value on the command line wins)\n"
    )
    assert init_overrides([*args, "model.d_model=32", "model.d_ff=64"]) == [] and capsys.readouterr().err == ""
    assert init_overrides(["algo=grpo", "env=addition", f"init={run_dir},{run_dir}"]) == []  # a sweep: each job
    with pytest.raises(ConfigError, match=r"^init=\S+: env=addition with env.n_digits=12 needs model.max_len >= 41; "):
        init_overrides([*args, "env.n_digits=12"])
    with pytest.raises(ConfigError, match=r"^init=\S+: the source has model.d_ff=64, this run model.d_ff=32; set"):
        init_overrides([*args, "model.d_ff=32"])
    assert capsys.readouterr().err == ""  # no note before an error
