"""pgcli.redact: URI credentials and secret-named values are masked wherever pgcli stores or prints them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pgcli.redact import is_secret_key, redact_hydra_dir, redact_mapping, redact_text, redact_uri


def test_uri_credentials_are_replaced_and_the_rest_kept():
    assert redact_text("http://alice:s3cr3t@host:5000/path") == "http://***@host:5000/path"
    assert redact_text("https://token@host") == "https://***@host"
    assert redact_text("postgresql+psycopg2://u:p@db:5432/mlflow") == "postgresql+psycopg2://***@db:5432/mlflow"
    # an @ inside the password belongs to the userinfo: the host is after the last @ before the path
    assert redact_text("http://alice:pa@ss@host:5000") == "http://***@host:5000"
    # no userinfo: unchanged, and an @ after the path or in other text is not a credential
    for text in ("http://host:5000", "sqlite:////tmp/mlflow.db", "http://host/a@b", "mail me: a@b.c", "seed=3"):
        assert redact_text(text) == text


def test_secret_named_assignments_in_command_lines_are_masked():
    line = "algo=ppo +env.kwargs.api_token=abc tracking.uri=http://u:p@h:1 seed=0"
    assert redact_text(line) == "algo=ppo +env.kwargs.api_token=*** tracking.uri=http://***@h:1 seed=0"
    assert redact_text("a=1,db_password=x,b=2") == "a=1,db_password=***,b=2"  # Hydra's override_dirname


def test_params_and_tags_mask_secret_keys_and_uri_credentials():
    params = {
        "tracking.uri": "http://u:p@h:1",
        "env.kwargs.password": "hunter2",
        "env.kwargs.secret_key": 3,
        "algo.learning_rate": 0.001,
        "hydra_overrides": "seed=1 tracking.uri=https://t@h",
    }
    assert redact_mapping(params) == {
        "tracking.uri": "http://***@h:1",
        "env.kwargs.password": "***",
        "env.kwargs.secret_key": "***",
        "algo.learning_rate": 0.001,
        "hydra_overrides": "seed=1 tracking.uri=https://***@h",
    }


def test_hydra_files_are_rewritten_only_when_they_hold_a_secret(tmp_path: Path):
    hydra = tmp_path / ".hydra"
    hydra.mkdir()
    (hydra / "overrides.yaml").write_text(yaml.safe_dump(["seed=1", "tracking.uri=http://u:p@h:5000"]))
    (hydra / "config.yaml").write_text(
        yaml.safe_dump({"seed": 1, "tracking": {"uri": "http://u:p@h:5000"}, "env": {"kwargs": {"api_token": "abc"}}})
    )
    clean = {"seed": 1, "run": {"dir": "outputs/${now:%H}"}}
    (hydra / "hydra.yaml").write_text(yaml.safe_dump(clean))
    before = (hydra / "hydra.yaml").read_text()
    changed = redact_hydra_dir(hydra)
    assert sorted(p.name for p in changed) == ["config.yaml", "overrides.yaml"]
    assert yaml.safe_load((hydra / "overrides.yaml").read_text()) == ["seed=1", "tracking.uri=http://***@h:5000"]
    config = yaml.safe_load((hydra / "config.yaml").read_text())
    assert config["tracking"]["uri"] == "http://***@h:5000" and config["env"]["kwargs"]["api_token"] == "***"
    assert (hydra / "hydra.yaml").read_text() == before  # untouched: interpolations stay as written


def test_redact_uri_drops_credentials_or_keeps_the_user():
    assert redact_uri("http://user:pass@Host:5000/x") == "http://host:5000/x"  # files: the bare server
    assert redact_uri("http://token@host") == "http://host"  # a user name alone can be a token
    assert redact_uri("http://user:pass@host:5000/x", keep_user=True) == "http://user:***@host:5000/x"
    assert redact_uri("http://user@host", keep_user=True) == "http://user@host"  # no password: as given
    assert redact_uri("sqlite:////tmp/mlflow.db") == "sqlite:////tmp/mlflow.db"


@pytest.mark.parametrize("key", ["model.max_new_tokens", "tokenizer", "pad_token_id", "time/tokens_per_s"])
def test_a_setting_about_tokens_is_not_a_secret(key):
    assert not is_secret_key(key)
    assert redact_text(f"algo=grpo {key}=64 seed=0") == f"algo=grpo {key}=64 seed=0"


@pytest.mark.parametrize("key", ["hf_token", "env.kwargs.access_token", "token", "HF_TOKEN"])
def test_a_key_naming_a_token_is_a_secret(key):
    assert is_secret_key(key)
    assert redact_text(f"{key}=abc seed=0") == f"{key}=*** seed=0"
