"""pgcli.config.renames: TRPO's old key names read as sb3-contrib's, on a command line, in a logged config and in a
run's MLflow params; each announced once per process, and a key given under both names is one line."""

from __future__ import annotations

import pytest

from pgcli.config import SB3TRPOConfig, TRPOConfig, renames
from pgcli.config.renames import renamed_key, renamed_keys, renamed_overrides, renamed_params, renamed_section
from pgcli.errors import ConfigError

OLD_TO_NEW = {
    "cg_iters": "cg_max_steps",
    "backtrack_coeff": "line_search_shrinking_factor",
    "backtrack_iters": "line_search_max_iter",
    "vf_learning_rate": "learning_rate",
    "vf_lr_schedule": "lr_schedule",
}


@pytest.fixture(autouse=True)
def _fresh_notes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(renames, "_NOTED", set())


def test_the_table_is_trpos_and_names_sb3_contribs_keys():
    assert dict(renamed_keys("trpo")) == OLD_TO_NEW
    sb3 = {f for f in SB3TRPOConfig.__dataclass_fields__}
    shared = set(OLD_TO_NEW.values()) - {"lr_schedule"}  # PPO's name for learning_rate's schedule
    assert shared <= sb3
    assert renamed_keys("ppo") == {} and renamed_keys("no_such_algo") == {}


def test_an_old_key_is_renamed_in_place_with_one_note(capsys: pytest.CaptureFixture[str]):
    lines = ["algo=trpo", "algo.cg_iters=5", "seed=1", "++algo.backtrack_coeff=0.5", "~algo.vf_lr_schedule"]
    assert renamed_overrides(lines) == [
        "algo=trpo",
        "algo.cg_max_steps=5",
        "seed=1",
        "++algo.line_search_shrinking_factor=0.5",
        "~algo.lr_schedule",
    ]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pgcli: note: algo.cg_iters is now algo.cg_max_steps, ")
    assert "algo.vf_lr_schedule is now algo.lr_schedule" in err and "the old names still work" in err


def test_each_key_is_announced_once_per_process(capsys: pytest.CaptureFixture[str]):
    renamed_overrides(["algo=trpo", "algo.cg_iters=5"])
    renamed_overrides(["algo=trpo", "algo.cg_iters=6"])
    renamed_overrides(["algo=trpo", "algo.cg_iters=7", "algo.backtrack_iters=3"])
    lines = capsys.readouterr().err.splitlines()
    still = " (SB3's vocabulary); the old name still works"
    assert lines == [
        f"pgcli: note: algo.cg_iters is now algo.cg_max_steps{still}",
        f"pgcli: note: algo.backtrack_iters is now algo.line_search_max_iter{still}",
    ]


def test_a_sweep_value_is_kept_as_typed():
    assert renamed_overrides(["algo=trpo", "algo.cg_iters=5,10"]) == ["algo=trpo", "algo.cg_max_steps=5,10"]
    # an Optuna search space typed on the command line
    searched = renamed_overrides(["algo=trpo", "algo.vf_learning_rate=tag(log, interval(1e-4, 1e-2))"])
    assert searched[1] == "algo.learning_rate=tag(log, interval(1e-4, 1e-2))"


@pytest.mark.parametrize(
    "lines",
    [
        ["algo=trpo", "algo.cg_iters=5", "algo.cg_max_steps=10"],
        ["algo=trpo", "algo.cg_max_steps=10", "+algo.cg_iters=5"],
    ],
)
def test_old_and_new_name_together_is_one_line_naming_both(lines: list[str], capsys: pytest.CaptureFixture[str]):
    with pytest.raises(ConfigError) as info:
        renamed_overrides(lines)
    message = str(info.value)
    assert "algo.cg_iters" in message and "algo.cg_max_steps" in message and "\n" not in message
    assert capsys.readouterr().err == ""  # an error is the only line


def test_only_the_chosen_algos_keys_are_renamed(capsys: pytest.CaptureFixture[str]):
    # vf_learning_rate is VPG's (and ppo_lm's) own key
    assert renamed_overrides(["algo=vpg", "algo.vf_learning_rate=1e-3"]) == ["algo=vpg", "algo.vf_learning_rate=1e-3"]
    # the default algo (PPO) has no cg_iters: left for validation to report
    assert renamed_overrides(["algo.cg_iters=5"]) == ["algo.cg_iters=5"]
    assert capsys.readouterr().err == ""


def test_a_sweep_where_the_old_name_is_another_algos_key_is_one_line():
    with pytest.raises(ConfigError, match=r"algo.vf_learning_rate is a key of algo=vpg, the old name of"):
        renamed_overrides(["algo=trpo,vpg", "algo.vf_learning_rate=1e-3"])


def test_a_logged_section_reads_under_the_new_names(capsys: pytest.CaptureFixture[str]):
    old = {"n_steps": 64, "cg_iters": 5, "backtrack_coeff": 0.8, "vf_learning_rate": 2e-3, "npg": False}
    new = renamed_section("trpo", old, "run abc: ")
    assert new == {
        "n_steps": 64,
        "cg_max_steps": 5,
        "line_search_shrinking_factor": 0.8,
        "learning_rate": 2e-3,
        "npg": False,
    }
    assert capsys.readouterr().err.startswith("pgcli: note: run abc: algo.cg_iters is now algo.cg_max_steps")
    current = {"cg_max_steps": 5}
    assert renamed_section("trpo", current) is current  # nothing to rename: the same object, no note
    assert renamed_section("vpg", {"vf_learning_rate": 1e-3}) == {"vf_learning_rate": 1e-3}


def test_params_of_an_old_run_are_keyed_as_a_new_runs():
    old = {"algo": "trpo", "seed": "1", "algo.cg_iters": "25", "algo.vf_lr_schedule": "constant", "env.id": "x"}
    assert renamed_params(old) == {
        "algo": "trpo",
        "seed": "1",
        "algo.cg_max_steps": "25",
        "algo.lr_schedule": "constant",
        "env.id": "x",
    }
    vpg = {"algo": "vpg", "algo.vf_learning_rate": "0.001"}
    assert renamed_params(vpg) == vpg


def test_a_group_by_key_takes_its_new_name_unless_another_algo_owns_it():
    assert renamed_key("algo.cg_iters") == "algo.cg_max_steps"
    assert renamed_key("algo.vf_learning_rate") == "algo.vf_learning_rate"  # VPG's own key
    assert renamed_key("algo.gamma") == "algo.gamma" and renamed_key("seed") == "seed"


def test_the_old_names_are_no_fields_of_the_schema():
    fields = set(TRPOConfig.__dataclass_fields__)
    assert not set(OLD_TO_NEW) & fields and set(OLD_TO_NEW.values()) <= fields
