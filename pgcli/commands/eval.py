"""``pgcli eval <run id | run dir | model dir>``: score a trained agent, optionally on video.

The agent (final, or ``--best``) is loaded with its normalisation statistics, frozen, and plays ``--episodes`` episodes
on a fresh env built from the run's own logged config (``agent.json`` in the model directory, else the run's
``.hydra/``). By default the evaluation repeats the run's own: the same number of episodes and evaluation envs, the
same env seed (the run's seed + 10000), deterministic actions, so a final model scores exactly the run's last
``eval/return_mean`` (and ``--best`` its ``eval/best_return_mean``).

Results go to a new MLflow run, ``eval-<run name>``, nested under the evaluated run (tag ``source_run_id``, and
``mlflow.parentRunId`` so the UI shows it under the run): the training run's own history stays what training logged,
and each evaluation keeps its settings as params. ``--video`` records episodes (MP4, or GIF without an encoder) and
logs them as ``videos/`` artifacts of that run; ``--no-log`` logs nothing.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pgcli.config.overrides import override_key
from pgcli.errors import CommandParser, ConfigError
from pgcli.training.logged import LoggedRun, Wording
from pgcli.training.progress import number, write_line

if TYPE_CHECKING:
    from gymnasium.vector import VectorEnv

    from pgcli.config import TrackingConfig, TrainConfig
    from pgcli.tracking.store import RunRecord, RunStore

VIDEO_FLAGS = ("video=true", "video=True", "+video=true")
EVAL = Wording(
    not_a_run="{ref!r} is not a directory, nor an MLflow run id (32 hex digits, or a unique prefix of at least 8)",
    no_store="tracking=off has no run store to find a run id in; pass the run directory instead",
    not_found="no run {ref} in {uri}; pass tracking.uri=... for another store",
    doing="evaluate",
)


@dataclass
class EvalTarget:
    """What ``pgcli eval`` evaluates: a model directory, the run's config, and where it came from."""

    model_dir: Path
    cfg: Any
    """The run's :class:`~pgcli.config.TrainConfig`."""
    algo: str
    env: str
    which: str
    """'final' or 'best'."""
    run_dir: Path | None
    run: RunRecord | None
    """The run's record when it was named by run id."""
    logged: LoggedRun | None = None
    """The evaluated run (None for a model directory outside a run directory)."""


def parse_args(args: Sequence[str]) -> argparse.Namespace:
    parser = CommandParser(
        prog="pgcli eval",
        description="Evaluate a trained agent: its final (or best) model with the run's frozen normalisation, on a "
        "fresh env built from the run's logged config. Prints return mean ± std and logs an `eval-<run>` MLflow run "
        "nested under the evaluated one.",
        epilog="examples:\n"
        "  pgcli eval 3f9c0d1e                           # a run id as pgcli runs shows it (8+ hex digits, or all)\n"
        "  pgcli eval outputs/runs/2026-11-23/10-00-00_ppo_cartpole_s0 --best --episodes 20\n"
        "  pgcli eval outputs/runs/.../model --video      # a model dir; MP4 of one episode, logged as videos/\n"
        "  pgcli eval 3f9c0d1e tracking.uri=http://127.0.0.1:5000 --no-log   # tracking overrides as for train",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "target",
        help="run id (or a unique prefix of 8+ hex digits, as pgcli runs shows), run directory or model directory",
    )
    parser.add_argument(
        "--best", action="store_true", help="the best-evaluated agent (best_model/) instead of the final"
    )
    parser.add_argument("--episodes", type=int, help="episodes to play (default: the run's eval.episodes)")
    parser.add_argument("--stochastic", action="store_true", help="sample actions (default: deterministic)")
    parser.add_argument("--seed", type=int, help="env seed (default: the run's seed + 10000, as its evaluations)")
    parser.add_argument("--video", action="store_true", help="record episodes to MP4 (or GIF); also: video=true")
    parser.add_argument("--video-episodes", type=int, default=1, help="episodes to record with --video (default 1)")
    parser.add_argument("--out", type=Path, help="directory for videos (default: <run dir>/eval/<time>)")
    parser.add_argument("--no-log", action="store_true", help="log nothing to MLflow")
    parser.add_argument("overrides", nargs="*", help="tracking overrides, e.g. tracking.uri=... (as for pgcli train)")
    ns = parser.parse_intermixed_args(list(args))
    ns.video = ns.video or any(o in VIDEO_FLAGS for o in ns.overrides)
    ns.overrides = [o for o in ns.overrides if o not in VIDEO_FLAGS and o not in ("video=false", "video=False")]
    bad = [o for o in ns.overrides if not override_key(o).startswith("tracking")]
    if bad:
        raise ConfigError(
            f"pgcli eval takes tracking overrides only (got {bad[0]!r}); the run's config is used as logged"
        )
    if ns.episodes is not None and ns.episodes < 1:
        raise ConfigError(f"--episodes must be >= 1 (got {ns.episodes})")
    if ns.video_episodes < 1:
        raise ConfigError(f"--video-episodes must be >= 1 (got {ns.video_episodes})")
    if ns.seed is not None and ns.seed < 0:
        raise ConfigError(f"--seed must be >= 0 (got {ns.seed})")
    if ns.out is not None:
        from pgcli.training.preflight import check_out_dir

        ns.out = check_out_dir(ns.out, "--out")
    return ns


def main(args: Sequence[str]) -> int:
    """Entry point of ``pgcli eval``."""
    ns = parse_args(args)
    from pgcli.tracking.checks import check_store
    from pgcli.tracking.store import open_run_store

    tracking = tracking_config(ns.overrides)
    store = open_run_store(tracking)  # opened on first use: a run id is looked up only in a store that is there
    if store is not None and not ns.no_log:
        check_store(
            store.uri, "write", doing="log the evaluation", fix="pass --no-log, or tracking.uri=<a store you can write>"
        )
    with resolve_target(ns.target, best=ns.best, store=store) as target:
        return evaluate(target, ns, store=None if ns.no_log else store, artifact_root=_artifact_root(tracking))


def tracking_config(overrides: list[str]) -> TrackingConfig:
    """The tracking settings of the command line: the default ``tracking`` group without overrides (no Hydra
    composition), else the composed config's, with the rules of their values. Only tracking is this command's: the
    default env's world (gymnasium, a probe of CartPole) is not checked."""
    from pgcli.config import TrackingConfig

    if not overrides:  # conf/tracking/local.yaml sets the dataclass's defaults (tests/unit/test_eval_start.py)
        return TrackingConfig()
    from pgcli.config.compose import compose_train_config

    return compose_train_config(overrides).tracking


def _artifact_root(tracking: Any) -> str | None:
    from pgcli.tracking.uri import resolve_tracking_target

    return resolve_tracking_target(tracking).artifact_root if tracking.backend == "mlflow" else None


@contextmanager
def resolve_target(target: str, *, best: bool, store: RunStore | None, wording: Wording = EVAL) -> Iterator[EvalTarget]:
    """The model directory and config ``target`` names; a one-line ConfigError when it names none.

    A run id, or a unique prefix of one, is looked up in ``store`` (:class:`~pgcli.training.logged.LoggedRun`); its
    model is read from the run directory when that still exists here, else downloaded from the run's artifacts into a
    temporary directory (removed afterwards).
    """
    path = Path(target).expanduser()
    which = "best" if best else "final"
    subdir = "best_model" if best else "model"
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{target} is a file; pass a run id, a run directory or a model directory")
    if path.is_dir() and _is_model_dir(path):
        if best:
            raise ConfigError(f"{target} is a model directory; --best picks best_model/ of a run directory or id")
        run = LoggedRun(target, path.parent, None, None) if (path.parent / ".hydra").is_dir() else None
        yield _target(path, "final", run)
        return
    run = LoggedRun.locate(target, store=lambda: store, wording=wording)
    if run.record is None:  # a run directory
        if not (path / ".hydra").is_dir() and not (path / "model").is_dir():
            raise ConfigError(
                f"{target} is neither a run directory (.hydra/, model/) nor a model directory (model.pt or model.zip)"
            )
        if not _is_model_dir(path / subdir):
            raise ConfigError(_missing_model(target, best))
        yield _target(path / subdir, which, run)
        return
    if run.run_dir is not None and _is_model_dir(run.run_dir / subdir):
        yield _target(run.run_dir / subdir, which, run)
        return
    assert store is not None  # the run was found there
    with tempfile.TemporaryDirectory(prefix="pgcli-eval-") as tmp:
        model_dir = store.download(run.record.run_id, subdir, Path(tmp))
        if model_dir is None or not _is_model_dir(model_dir):
            raise ConfigError(_missing_model(f"run {run.record.run_id}", best))
        yield _target(model_dir, which, run)


def _missing_model(what: str, best: bool) -> str:
    if best:
        return f"{what} has no best_model (eval.save_best=false, or it ended before an evaluation)"
    return f"{what} has no model (the run did not finish, or tracking.log_model=false)"


def _is_model_dir(path: Path) -> bool:
    from pgcli.config.saved_agent import is_model_dir

    return is_model_dir(path)


def _target(model_dir: Path, which: str, run: LoggedRun | None) -> EvalTarget:
    """The run's config from ``agent.json`` of the model, else the run's ``.hydra`` (models saved before agent.json;
    the ``hydra`` artifact when the run directory is not here)."""
    from pgcli.config.saved_agent import AGENT_FILE, agent_config, read_agent_spec

    run_dir, record = (run.run_dir, run.record) if run is not None else (None, None)
    if (model_dir / AGENT_FILE).is_file():
        spec = read_agent_spec(model_dir)
        return EvalTarget(model_dir, agent_config(spec), spec["algo"], spec["env"], which, run_dir, record, run)
    missing = ConfigError(f"{model_dir} has no {AGENT_FILE} and its run's .hydra/config.yaml is not at hand")
    if run is None:
        raise missing
    with run.hydra_dir() as found:
        if found is None:
            raise missing
        logged = run.logged_config(found)
    return EvalTarget(model_dir, logged.train_config(), logged.algo, logged.env, which, run_dir, record, run)


def _eval_env(cfg: TrainConfig, *, video: bool, seed: int, n_envs: int) -> VectorEnv:
    """The evaluation envs; with ``video``, a one-line error now, before any MLflow run exists, if this env cannot
    render here."""
    from pgcli.envs.make import make_vec_env
    from pgcli.video import make_recording_env

    if video:
        return make_recording_env(cfg.env, seed=seed, n_envs=n_envs)
    return make_vec_env(cfg.env, seed=seed, n_envs=n_envs, vectorization="lean", training=False)


def evaluate(target: EvalTarget, ns: argparse.Namespace, *, store: RunStore | None, artifact_root: str | None) -> int:
    """Play the episodes, print the result, log it (unless ``store`` is None); returns the exit status."""
    from pgcli.config import TextEnvConfig

    cfg = target.cfg
    if isinstance(cfg.env, TextEnvConfig):  # before the gymnasium side's imports: a text run needs none of them
        return evaluate_text_target(target, ns, store=store, artifact_root=artifact_root)
    import torch

    from pgcli.agent import load_agent
    from pgcli.envs.episodes import run_episodes
    from pgcli.envs.make import EVAL_SEED_OFFSET
    from pgcli.envs.normalize import load_saved_normalizer
    from pgcli.training.progress import episode_progress
    from pgcli.video import EpisodeRecorder

    episodes = ns.episodes or cfg.eval.episodes
    seed = cfg.seed + EVAL_SEED_OFFSET if ns.seed is None else ns.seed
    deterministic = not ns.stochastic
    torch.manual_seed(seed)  # --stochastic: the action samples repeat with the seed
    env = _eval_env(cfg, video=ns.video, seed=seed, n_envs=min(cfg.eval.n_envs, episodes))
    try:
        load_saved_normalizer(env, target.model_dir)  # frozen
        agent = load_agent(target.model_dir, cfg, env.single_observation_space, env.single_action_space)
        recorder = None
        if ns.video:
            out = ns.out or _default_out(target)
            n_video = min(ns.video_episodes, episodes // env.num_envs)  # sub-env 0 plays this many
            recorder = EpisodeRecorder(env, out, n_episodes=n_video)
        source = _source_run(target, store) if store is not None else target.run
        playing = f"evaluating {episodes} episode{'s' * (episodes != 1)} of {target.env}, {target.which} model"
        with eval_run(store, target, source, artifact_root) as run, episode_progress(episodes, playing) as played:
            start = time.perf_counter()
            result = run_episodes(
                env, agent, episodes, deterministic=deterministic, seed=seed, recorder=recorder, on_episode=played
            )
            videos = recorder.close() if recorder is not None else []
            elapsed = time.perf_counter() - start
            if run is not None:
                assert store is not None  # eval_run opens a run only in a store
                _log_eval(
                    store,
                    run.run_id,
                    result,
                    videos,
                    episodes=episodes,
                    seed=seed,
                    deterministic=deterministic,
                    which=target.which,
                )
    finally:
        env.close()
    _print_result(
        target,
        result,
        seed=seed,
        deterministic=deterministic,
        elapsed=elapsed,
        videos=videos,
        source=source,
        eval_run=run,
        store=store,
    )
    return 0


def evaluate_text_target(
    target: EvalTarget, ns: argparse.Namespace, *, store: RunStore | None, artifact_root: str | None
) -> int:
    """``pgcli eval`` of a text policy (docs/lm.md, "Evaluation"): the run's own held-out evaluation
    (``pgcli.lm.evaluation``), with the same sampling seed, so a final model scores exactly the run's last
    ``eval/accuracy``; ``--seed`` changes the seed of the pass@k samples. A reward model's is its own: pairwise
    accuracy and margin on the run's held-out pairs (:func:`_reward_model_evaluation`). The full samples table is
    written under ``--out`` (default ``<run dir>/eval/<time>_<which>``) and logged as ``samples/eval.json``; its
    first rows are printed."""
    import torch

    from pgcli.config import RMConfig

    cfg = target.cfg
    if cfg.hardware.torch_threads > 0:  # the run's own, as its evaluations had it
        torch.set_num_threads(cfg.hardware.torch_threads)
    device = torch.device("cpu")
    seed = cfg.seed if ns.seed is None else ns.seed
    evaluation = _reward_model_evaluation if isinstance(cfg.algo, RMConfig) else _policy_evaluation
    what, run_eval = evaluation(target, seed, device)
    if ns.video:
        write_line(sys.stderr, "pgcli: note: --video: a text task has no frames; the samples table is written instead")
    source = _source_run(target, store) if store is not None else target.run
    write_line(sys.stderr, f"pgcli: evaluating {what} of {target.env}, {target.which} model...")
    with eval_run(store, target, source, artifact_root) as run:
        start = time.perf_counter()
        result = run_eval()
        elapsed = time.perf_counter() - start
        table = _write_table(ns.out or _default_out(target), result.samples or [])
        if run is not None:
            assert store is not None  # eval_run opens a run only in a store
            store.log_params(run.run_id, {"seed": seed, "which": target.which, "n_eval": len(result.returns)})
            store.log_metrics(run.run_id, {"eval/return_mean": result.mean, **result.extra})
            store.log_artifact(run.run_id, table, "samples")
    where = f"run {source.run_id}" if source is not None else str(target.model_dir)
    seeded = "" if isinstance(cfg.algo, RMConfig) else f", sampling seed {seed}"
    lines = [f"{target.algo} on {target.env}, {target.which} model ({where}): {what}{seeded}, {elapsed:.1f} s"]
    width = max([KEY_WIDTH, *(len(key.removeprefix("eval/")) for key in result.extra)])
    logged = source.metrics if source is not None and target.which == "final" else {}
    lines += text_result_lines(result.extra, logged, width)
    lines += sample_lines(result.samples or [])
    lines.append(f"  {'samples table':<{width}} {table}" + (" (artifact samples/eval.json)" if run else ""))
    if run is not None:
        assert store is not None  # eval_run opens a run only in a store
        lines.append(f"  {'MLflow run':<{width}} {run.run_id}  ({store.uri})")
    print("\n".join(lines), flush=True)
    return 0


def _policy_evaluation(target: EvalTarget, seed: int, device: Any) -> tuple[str, Callable[[], Any]]:
    """What a text policy's evaluation plays (``32 held-out problems``) and the evaluation itself."""
    from pgcli.config.saved_agent import read_agent_spec
    from pgcli.lm.evaluation import TextEvalSettings, evaluate_text
    from pgcli.lm.load import make_text_policy, make_text_task
    from pgcli.training.references import learned_reward

    cfg = target.cfg
    task = make_text_task(cfg.env, cfg.model, saved=read_agent_spec(target.model_dir))  # a dataset run's characters
    reward_model, _ = learned_reward(cfg.env, cfg.model, cfg.tracking, device)  # env.reward=rm:<run>: its proxy
    if reward_model is not None:
        task = task.with_learned_reward(reward_model)
    policy = make_text_policy(task, cfg.model, device, target.model_dir)
    settings = TextEvalSettings(
        pass_k=cfg.env.eval_pass_k,
        temperature=cfg.model.temperature,
        top_p=cfg.model.top_p,
        n_table_rows=cfg.env.eval_samples,
    )
    problems = task.eval_problems()

    def run() -> Any:
        return evaluate_text(
            task, policy, problems, settings, seed=seed, device=device, learned_reward=task.learned_reward
        )

    return f"{len(problems)} held-out problems", run


def _reward_model_evaluation(target: EvalTarget, seed: int, device: Any) -> tuple[str, Callable[[], Any]]:
    """A reward model's held-out evaluation, as its run evaluated it: pairwise accuracy, margin and loss on the
    run's held-out pairs (generated from the task's held-out problems, or the held-out rows of ``env=dataset``)."""
    from types import SimpleNamespace

    from pgcli.config.saved_agent import read_agent_spec
    from pgcli.lm.dataset_rows import on_rows, supervised_rows
    from pgcli.lm.load import make_text_policy, make_text_task
    from pgcli.lm.reward_model import load_reward_model, reward_model_evaluator
    from pgcli.lm.rows_eval import rows_evaluator
    from pgcli.training.references import init_source

    cfg, spec = target.cfg, read_agent_spec(target.model_dir)
    evaluator: Any
    if on_rows(cfg.env, cfg.algo):
        # a reward model's rows are preference pairs (PreferenceRows), read in the characters the run recorded
        task: Any = supervised_rows(cfg.env, cfg.model, cfg.algo, recorded=spec.get("vocab") or None)
        reward_model = load_reward_model(task, cfg.model, device, target.model_dir)
        evaluator = rows_evaluator(task, reward_model.backbone, cfg.env, cfg.model, device)
    else:
        task = make_text_task(cfg.env, cfg.model, saved=spec)
        reward_model = load_reward_model(task, cfg.model, device, target.model_dir)
        reference = None
        if cfg.algo.pairs == "policy":  # the wrong completions are the init model's samples, as in the run
            source = init_source(cfg)
            assert source is not None  # TrainConfig's rule: algo.pairs=policy needs init
            reference = make_text_policy(task, cfg.model, device, source.model_dir).eval()
        evaluator = reward_model_evaluator(cfg, task, reference, device)
    n_pairs = len(evaluator.pairs)
    return f"{n_pairs} held-out preference pairs", lambda: evaluator(SimpleNamespace(reward_model=reward_model))


KEY_WIDTH = 19
"""Width of the key column of ``pgcli eval``'s text report (``proxy_reward_sampled_mean`` runs past it)."""


def text_result_lines(extra: dict[str, float], logged: dict[str, float], width: int = KEY_WIDTH) -> list[str]:
    """One line per ``eval/*`` metric of a text evaluation (keys in a column ``width`` wide), with the run's own last
    value where it logged one."""
    lines = []
    for key, value in extra.items():
        was = f"  (logged {number(logged[key])})" if key in logged else ""
        lines.append(f"  {key.removeprefix('eval/'):<{width}} {number(value)}{was}")
    return lines


SAMPLE_ROWS = 4
"""Rows of the samples table ``pgcli eval`` prints (the whole table is a file)."""
SAMPLE_COLUMNS = (
    ("prompt", "prompt"),
    ("reference", "reference"),
    ("greedy", "greedy answer"),
    ("correct", "correct"),
    ("chosen", "chosen"),
    ("rejected", "rejected"),
    ("reward_chosen", "r(chosen)"),
    ("reward_rejected", "r(rejected)"),
    ("ranked_right", "ranked right"),
)
"""The columns printed, where the table has them: a policy's (a multi-turn task's greedy answer is its transcript), a
reward model's."""
CELL_WIDTH = 40


def sample_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The first :data:`SAMPLE_ROWS` rows of a samples table as aligned columns (long cells cut with ``...``)."""
    if not rows:
        return []
    columns = [(key, title) for key, title in SAMPLE_COLUMNS if key in rows[0]]
    cells = [[title for _, title in columns]]
    for row in rows[:SAMPLE_ROWS]:
        cells.append([_cell(row.get(key)) for key, _ in columns])
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    shown = min(SAMPLE_ROWS, len(rows))
    lines = [f"  samples ({shown} of {len(rows)} in the table):"]
    lines += ["    " + "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in cells]
    return lines


def _cell(value: Any) -> str:
    text = f"{value:.3f}" if isinstance(value, float) else repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= CELL_WIDTH else text[: CELL_WIDTH - 3] + "..."


def _write_table(out: Path, rows: list[dict[str, Any]]) -> Path:
    """The samples table as ``<out>/eval.json``."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    table = out / "eval.json"
    table.write_text(json.dumps(rows, indent=1) + "\n")
    return table


def _default_out(target: EvalTarget) -> Path:
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    if target.run_dir is not None:
        return target.run_dir / "eval" / f"{stamp}_{target.which}"
    name = target.run.run_id if target.run is not None else target.model_dir.name
    return Path("outputs") / "eval" / name / f"{stamp}_{target.which}"


def _source_run(target: EvalTarget, store: RunStore | None) -> RunRecord | None:
    """The evaluated run in the store (its record), None when the store does not have it."""
    if target.run is not None:
        return target.run
    return target.logged.find_in(store) if target.logged is not None else None


@contextmanager
def eval_run(
    store: RunStore | None, target: EvalTarget, source: RunRecord | None, artifact_root: str | None
) -> Iterator[RunRecord | None]:
    """The ``eval-<run>`` MLflow run (None when ``store`` is None: ``--no-log``), ended as a training run ends
    (:func:`pgcli.training.run.final_status`): FINISHED, FAILED on an error, KILLED on Ctrl-C, SIGTERM or SIGHUP;
    never left RUNNING."""
    from pgcli.training.run import StopRequest, final_status, stop_signals

    if store is None:
        yield None
        return
    with stop_signals(StopRequest()):  # not armed: a signal raises Interrupted at once, and the run ends KILLED
        run = _open_eval_run(store, target, source, artifact_root)
        try:
            yield run
        except BaseException as exc:
            store.end(run.run_id, final_status(exc))
            raise
        store.end(run.run_id, final_status(None))


def _open_eval_run(
    store: RunStore, target: EvalTarget, source: RunRecord | None, artifact_root: str | None
) -> RunRecord:
    tags = {
        "pgcli.eval.model": target.which,
        "model_dir": str(target.model_dir.resolve()),
        "algo": target.algo,
        "env": target.env,
        "seed": str(target.cfg.seed),
    }
    if source is not None:
        tags |= {"source_run_id": source.run_id, "mlflow.parentRunId": source.run_id}
        return store.create_run_in(source.experiment_id, run_name=f"eval-{source.name}", tags=tags)
    experiment = target.cfg.experiment or target.env
    name = f"eval-{target.algo}-{target.env}-s{target.cfg.seed}"
    return store.create_run(experiment, run_name=name, tags=tags, artifact_root=artifact_root)


def _log_eval(store: RunStore, run_id: str, result: Any, videos: list[Path], **params: Any) -> None:
    store.log_params(run_id, params)
    store.log_metrics(
        run_id,
        {
            "eval/return_mean": result.mean,
            "eval/return_std": result.std,
            "eval/ep_len_mean": float(result.lengths.mean()),
        },
    )
    for i, (ret, length) in enumerate(zip(result.returns, result.lengths, strict=True)):
        store.log_metrics(run_id, {"eval/episode_return": float(ret), "eval/episode_len": float(length)}, step=i)
    for video in videos:
        store.log_artifact(run_id, video, "videos")


def _print_result(
    target: EvalTarget,
    result: Any,
    *,
    seed: int,
    deterministic: bool,
    elapsed: float,
    videos: list[Path],
    source: RunRecord | None,
    eval_run: RunRecord | None,
    store: RunStore | None,
) -> None:
    mode = "deterministic" if deterministic else "stochastic"
    where = f"run {source.run_id}" if source is not None else str(target.model_dir)
    lines = [
        f"{target.algo} on {target.env}, {target.which} model ({where}): {len(result.returns)} episodes, {mode}, "
        f"env seed {seed}, {elapsed:.1f} s",
        f"  return        {result.mean:.1f} ± {result.std:.1f}  (min {result.returns.min():.1f}, "
        f"max {result.returns.max():.1f}, mean length {result.lengths.mean():.0f})",
        "  per episode   " + " ".join(f"{r:.1f}" for r in result.returns),
    ]
    logged_key = "eval/best_return_mean" if target.which == "best" else "eval/return_mean"
    if source is not None and logged_key in source.metrics:
        lines.append(f"  logged        {source.metrics[logged_key]:.1f} ({logged_key} of the run's evaluations)")
    for video in videos:
        lines.append(f"  video         {video}")
    if eval_run is not None:
        assert store is not None  # eval_run opens a run only in a store
        lines.append(f"  MLflow run    {eval_run.run_id}  ({store.uri})")
    print("\n".join(lines), flush=True)
