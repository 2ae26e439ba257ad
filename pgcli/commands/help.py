"""``pgcli train --help`` and ``pgcli sft --help``: the config groups and their options, read from ``conf/``, and the
composed config.

Hydra's own ``--help`` lists config groups by composing the config once per group (about 3 s here, and it shows
the internal ``schema/*`` groups too). pgcli lists them from the files instead: every ``conf/<group>/*.yaml`` is an
option, described by the first line of its header comment, so a new algo or env shows up without touching this
module. The composed config for the given overrides follows (one compose, well under a second).
"""

from __future__ import annotations

from pathlib import Path

HIDDEN_GROUPS = ("hydra", "schema")
"""Directories of ``conf/`` that are not user-facing groups."""
DESCRIBED_GROUPS = ("algo", "env", "model", "hardware", "tracking", "hparams_search")
"""Groups whose options are listed one per line with their description (``preset`` is listed by name only)."""

HEADER = """\
pgcli train: train a policy-gradient agent; every run is tracked in MLflow.

usage: pgcli train [-m] [--cfg job] [group=option ...] [key=value ...]
"""

FOOTER = """\
Examples:
  pgcli train                                            # PPO on CartPole (tuned preset), ~1 minute
  pgcli train algo=a2c env=pendulum seed=1               # the a2c_pendulum preset applies automatically
  pgcli train algo=ppo env=hopper algo.learning_rate=1e-4 total_steps=200000
  pgcli train ~preset algo=ppo env=cartpole              # SB3 defaults, without the tuned preset
  pgcli train -m algo=ppo,a2c env=cartpole seed=0,1,2    # a sweep: 6 runs, one per combination
  pgcli train -m hparams_search=ppo_pendulum             # an Optuna search (docs/sweeps.md)
  pgcli train --cfg job algo=a2c env=hopper              # print the composed config and exit
  pgcli train tracking=off eval.every=0                  # no MLflow; metrics.csv in the run directory
  pgcli train tracking.uri=sqlite:////abs/path/mlflow.db # another store ($MLFLOW_TRACKING_URI works too)

A preset (conf/preset/<algo>_<env>.yaml, rl-baselines3-zoo values) is applied when one exists for the pair; your
overrides always win. `pgcli train algo=trpo env=hopper --help` shows the config that pair composes to.
Runs: outputs/runs/<date>/<time>_<algo>_<env>_s<seed>/; store: outputs/mlflow.db; browse with `pgcli ui`.
Hydra's own flags (launchers, sweepers, tab completion): pgcli train --hydra-help
"""

SFT_HEADER = """\
pgcli sft: supervised warm start of a text policy (pgcli train algo=sft; docs/lm.md); every run is tracked in MLflow.

usage: pgcli sft [-m] [--cfg job] [env=<text task>] [group=option ...] [key=value ...]
"""

SFT_FOOTER = """\
Examples:
  pgcli sft                                              # SFT on addition (the sft_addition preset)
  pgcli sft env=addition total_steps=200000 seed=1
  pgcli train algo=grpo env=addition init=<sft run id>   # RL from the warm start (docs/lm.md)
  pgcli sft --cfg job env=sort                           # print the composed config and exit

The algo is always sft; the task is env=addition unless given, with model=tiny_gpt. A run resumes with
pgcli train resume=<run id | run dir>. Runs: outputs/runs/<date>/<time>_sft_<task>_s<seed>/; browse with `pgcli ui`.
"""

RM_HEADER = """\
pgcli rm: a reward model on a text task's preference pairs (pgcli train algo=rm; docs/lm.md); tracked in MLflow.

usage: pgcli rm [-m] [--cfg job] [env=<text task>] [group=option ...] [key=value ...]
"""

RM_FOOTER = """\
Examples:
  pgcli rm                                               # addition (the rm_addition preset)
  pgcli rm env=addition algo.label_noise=0.2 seed=1      # 20% of the training labels flipped
  pgcli rm env=countdown algo.pairs=partial init=<sft run id>
  pgcli rm --cfg job env=sort                            # print the composed config and exit

The algo is always rm; the task is env=addition unless given, with model=tiny_gpt. A run resumes with
pgcli train resume=<run id | run dir>. Runs: outputs/runs/<date>/<time>_rm_<task>_s<seed>/; browse with `pgcli ui`.
"""

PAGES = {"train": (HEADER, FOOTER), "sft": (SFT_HEADER, SFT_FOOTER), "rm": (RM_HEADER, RM_FOOTER)}
"""command -> the head and foot of its help page."""


def describe(path: Path, width: int = 100) -> str:
    """The first sentence of a config file's header comment (``@package`` lines skipped), at most ``width`` chars.

    A sentence ends at ". " or "; " outside parentheses; a longer one is cut at a word boundary with "...".
    """
    words: list[str] = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        text = line.lstrip("#").strip()
        if text.startswith("@package"):
            continue
        if not text:
            break
        words.append(text)
    header, depth = " ".join(words), 0
    for i, char in enumerate(header):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and char in ".;" and header[i + 1 : i + 2] in (" ", ""):
            header = header[:i]
            break
    header = header.rstrip(" :")
    if len(header) <= width:
        return header
    return header[: width - 3].rsplit(" ", 1)[0].rstrip(",;:") + "..."


def group_options(conf_dir: Path) -> dict[str, list[str]]:
    """group -> sorted option names, for every user-facing group directory of ``conf_dir``."""
    return {
        d.name: sorted(p.stem for p in d.glob("*.yaml"))
        for d in sorted(conf_dir.iterdir())
        if d.is_dir() and d.name not in HIDDEN_GROUPS and any(d.glob("*.yaml"))
    }


def defaults(conf_dir: Path) -> dict[str, str]:
    """group -> default option, from the defaults list of ``train.yaml``."""
    import yaml

    out: dict[str, str] = {}
    for entry in yaml.safe_load((conf_dir / "train.yaml").read_text()).get("defaults", []):
        if isinstance(entry, dict):
            for key, value in entry.items():
                if isinstance(value, str) and not key.startswith(("override", "optional")):
                    out[key] = value
    return out


def train_help(
    conf_dir: Path, composed_yaml: str, *, command: str = "train", chosen: dict[str, str] | None = None
) -> str:
    """The whole ``pgcli <command> --help`` text; ``composed_yaml`` is the config the given overrides compose to.

    ``chosen`` (group -> option) is what the command picks where ``train.yaml``'s defaults list would pick another
    (``pgcli sft``: algo=sft, env=addition, model=tiny_gpt); the command's algo is then the only algo listed.
    """
    header, footer = PAGES[command]
    options, picked = group_options(conf_dir), defaults(conf_dir) | (chosen or {})
    if chosen and "algo" in chosen:  # the command trains one algo: the others are not options of it
        options["algo"] = [chosen["algo"]]
    lines = [header, "== Config groups (group=option) ==", ""]
    lines += [f"{group}: {', '.join(names)}" for group, names in options.items()]
    for group in DESCRIBED_GROUPS:
        if group not in options:
            continue
        lines += ["", f"{group}:"]
        labels = {name: f"{name} (default)" if picked.get(group) == name else name for name in options[group]}
        width = max(len(label) for label in labels.values())
        for name, label in labels.items():
            lines.append(f"  {label:<{width}}  {describe(conf_dir / group / f'{name}.yaml')}".rstrip())
    lines += ["", "== Config (override any key with key=value; composed from the overrides given) ==", ""]
    lines += [composed_yaml.rstrip(), "", footer]
    return "\n".join(lines)
