"""Bad invocations and faults (docs/configuration.md, "Validation"): each ends with one line, the right exit status,
no traceback, and nothing created (no run directory, no store, no MLflow run, the given store file untouched).

Bad input (exit 2) goes through ``pgcli.cli.main`` in this process (the whole CLI path: dispatch, composition,
validation, preflight and the error printer; ~0.3 s each); faults of the world around pgcli (exit 1) and a sample of
bad input run as real ``pgcli train`` subprocesses, a few at a time in threads. Where the test cannot make a real
read-only or full directory (not root, or no ``mount``), those cases are skipped with the reason.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from pgcli.cli import main
from tests.conftest import run_pgcli

# --------------------------------------------------------------------------------------------------------------------
# bad input: exit 2, checked in-process
# --------------------------------------------------------------------------------------------------------------------

CONFIG_CASES: list[tuple[str, str]] = [
    # non-finite values, in every group and algo (nan fails comparisons, inf passed `>= 0`)
    ("algo.ent_coef=inf", "algo.ent_coef must be a finite number (got inf)"),
    ("algo.vf_coef=nan", "algo.vf_coef must be a finite number (got nan)"),
    ("algo.target_kl=nan", "algo.target_kl must be a finite number"),
    ("algo.max_grad_norm=inf", "algo.max_grad_norm must be a finite number"),
    ("algo=a2c algo.learning_rate=nan", "algo.learning_rate must be a finite number"),
    ("algo=a2c algo.ent_coef=inf", "algo.ent_coef must be a finite number"),
    ("algo=sb3_trpo algo.cg_damping=inf", "algo.cg_damping must be a finite number"),
    ("algo=trpo algo.cg_damping=inf", "algo.cg_damping must be a finite number"),
    ("algo=trpo algo.cg_residual_tol=nan", "algo.cg_residual_tol must be a finite number"),
    ("algo=vpg algo.ent_coef=inf", "algo.ent_coef must be a finite number"),
    ("algo=ppo_kl algo.beta_init=inf", "algo.beta_init must be a finite number"),
    ("algo=ppo_kl algo.vf_coef=-inf", "algo.vf_coef must be a finite number"),
    ("algo=grpo algo.beta=inf", "algo.beta must be a finite number"),
    ("algo=grpo algo.epsilon_high=inf", "algo.epsilon_high must be a finite number"),
    ("env.clip_obs=inf", "env.clip_obs must be a finite number"),
    ("env.reward_threshold=nan", "env.reward_threshold must be a finite number"),
    ("model.log_std_init=nan", "model.log_std_init must be finite"),
    ("tracking.flush_every_s=inf", "tracking.flush_every_s must be a finite number"),
    # what SB3 / sb3-contrib assert on, and minibatches larger than the rollout
    ("algo.batch_size=1", "algo.batch_size must be > 1 with algo.normalize_advantage=true"),
    ("algo.n_steps=1 env.n_envs=1 algo.batch_size=2", "algo.n_steps * env.n_envs must be > 1"),
    ("algo.n_steps=256 env.n_envs=8 algo.batch_size=4096", "algo.batch_size must be <= algo.n_steps * env.n_envs"),
    ("algo=a2c algo.normalize_advantage=true algo.n_steps=1 env.n_envs=1", "algo.n_steps * env.n_envs must be > 1"),
    ("algo=sb3_trpo algo.n_steps=1 env.n_envs=1 algo.batch_size=1", "algo.n_steps * env.n_envs must be > 1"),
    (
        "algo=sb3_trpo algo.n_steps=16 env.n_envs=1 algo.batch_size=16 algo.sub_sampling_factor=64",
        "algo.sub_sampling_factor must be <= algo.n_steps * env.n_envs",
    ),
    (
        "algo=trpo algo.n_steps=16 env.n_envs=1 algo.batch_size=16 algo.fvp_sub_sampling=64",
        "algo.fvp_sub_sampling must be <= algo.n_steps * env.n_envs",
    ),
    ("algo=trpo algo.batch_size=100000", "algo.batch_size must be <= algo.n_steps * env.n_envs"),
    ("algo=vpg algo.batch_size=100000", "algo.batch_size must be <= algo.n_steps * env.n_envs"),
    ("algo=ppo_kl algo.batch_size=100000", "algo.batch_size must be <= algo.n_steps * env.n_envs"),
    ("algo.sde_sample_freq=-5", "algo.sde_sample_freq must be >= -1"),
    # absurd values
    ("algo.learning_rate=1e300", "algo.learning_rate must be <= 1"),
    ("algo=a2c algo.learning_rate=2", "algo.learning_rate must be <= 1"),
    ("algo=trpo algo.learning_rate=10", "algo.learning_rate must be <= 1"),
    ("total_steps=10000000000000", "total_steps must be <= 1e+12"),
    ("env.n_envs=5000", "env.n_envs must be <= 1024"),
    ("algo.n_epochs=100000", "algo.n_epochs must be <= 1000"),
    ("algo.n_steps=100000000", "algo.n_steps * env.n_envs must be <= 1e+07"),
    ("eval.episodes=10000000", "eval.episodes must be <= 100000"),
    ("eval.n_envs=5000", "eval.n_envs must be <= 1024"),
    ("seed=4294967296", "seed + n_seeds - 1 must be <= 2**32 - 1"),
    ("n_seeds=5000", "n_seeds must be <= 1000"),
    ("model.pi_hidden_sizes=[100000]", "model.pi_hidden_sizes must be widths <= 16384"),
    ("model.log_std_init=50", "model.log_std_init must be in [-20, 5]"),
    ("algo=trpo algo.target_kl=5", "algo.target_kl must be <= 1"),
    ("algo=grpo algo.group_size=100000", "algo.group_size must be <= 4096"),
    ("hardware.torch_threads=100000", "hardware.torch_threads must be <= 1024"),
    # the TRPO setting that made every update a silent no-op
    ("algo=trpo algo.cg_residual_tol=1.0", "algo.cg_residual_tol must be in [0, 1e-06]"),
    # plain mistakes
    ("algo.learning_rate=-1", "algo.learning_rate must be > 0"),
    ("algo.gamma=1.5", "algo.gamma must be in (0, 1]"),
    ("env=hoper", "unknown env option 'hoper'"),
    ("algo=nope", "unknown algo option 'nope'"),
    ("algo.clip_rnge=0.1", "algo.clip_rnge"),
    ("+algo.clip_rnge=0.1", "unknown key 'algo.clip_rnge'"),
    ("total_steps=abc", "total_steps"),
    ("seed=-1", "seed must be >= 0"),
    ("eval.every=-1", "eval.every must be >= 0"),
    ("env.id=NoSuchEnv-v0", "not a registered gymnasium environment"),
    # tracking URIs that are wrong as typed
    ("tracking.uri=ftp://host/x", "MLflow cannot track to scheme 'ftp'"),
    ("tracking.uri=http://", "has no host"),
    ("tracking.uri=http://127.0.0.1:notaport", "is malformed"),
    ("tracking.uri=sqlite://relative.db", "a SQLite store is sqlite:///<relative path>"),
    ("tracking.uri=http:127.0.0.1:5000", "is malformed: expected <scheme>://"),
    ("tracking.uri=sqlite:/x.db", "is malformed: a SQLite store is sqlite:///<relative path>"),
    ("tracking.uri=htp://127.0.0.1:5000", "scheme 'htp' (did you mean http://?"),
    # a folder is MLflow's file store, which MLflow 3 refuses (after pgcli made the run directory)
    ("tracking.uri=./mlruns", "tracking.uri './mlruns' is a folder (MLflow's file store"),
    ("tracking.uri=mlruns", "use e.g. tracking.uri=sqlite:///mlruns/mlflow.db"),
    ("tracking.uri=file:///tmp/pgcli-no-such-store", "is a folder (MLflow's file store"),
    # experiment names MLflow refuses, or whose artifacts would land outside the artifact root
    (f"experiment={'x' * 501}", "experiment must be at most 500 characters (MLflow's limit; got 501)"),
    ("experiment=../../x", "experiment '../../x' must not contain '..'"),
    ("experiment=a/../../x", "must not contain '..'"),
    ("-m seed=0,1 env.n_envs=8,0", "env.n_envs must be >= 1"),
    ("seed=0,1 -m env.n_envs=8,0", "env.n_envs must be >= 1"),  # a flag after the overrides is still a flag
    # Hydra's flags: an unknown one, or a bad value, is one line (not Hydra's whole usage)
    ("--bogus", "unknown option --bogus for pgcli train (see pgcli train --help)"),
    ("algo=ppo --multirun=yes", "unknown option --multirun=yes"),
    ("--cfg foo", "--cfg foo: choose one of job, hydra, all"),
    ("algo=ppo --cfg", "--cfg needs a value"),
    ("--info=nope", "--info=nope: choose one of all, config, defaults"),
]


def one_error_line(err: str, out: str, fragment: str) -> None:
    assert err.startswith("pgcli: error: ") and err.count("\n") == 1, err
    assert fragment in err, err
    assert "Traceback" not in err + out
    assert out == ""


@pytest.mark.parametrize(
    ("args", "fragment"), CONFIG_CASES, ids=[a if len(a) < 80 else f"{a[:40]}..." for a, _ in CONFIG_CASES]
)
def test_bad_input_exits_2_with_one_line_and_creates_nothing(
    args: str, fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert main(["train", "progress=false", *args.split()]) == 2
    captured = capsys.readouterr()
    one_error_line(captured.err, captured.out, fragment)
    assert list(tmp_path.iterdir()) == []  # no outputs/, no store, no run directory


def test_an_unknown_command_exits_2(capsys: pytest.CaptureFixture[str]):
    assert main(["trian"]) == 2
    captured = capsys.readouterr()
    one_error_line(captured.err, captured.out, "did you mean 'train'")


# Each read command's own entry point, patched to fail as a bug would: the handler in pgcli.cli.main must turn it
# into one line whichever command it came from.
UNEXPECTED_CASES = [
    (["compare"], "pgcli.commands.compare.main"),
    (["eval", "0123abcd"], "pgcli.commands.eval.main"),
    (["runs"], "pgcli.commands.runs.main"),
    (["ui"], "pgcli.commands.ui.main"),
    (["sync", "some/run/dir"], "pgcli.tracking.sync.sync_run_dir"),
    (["export", "0123abcd"], "pgcli.commands.export.main"),
]


@pytest.mark.parametrize(("argv", "target"), UNEXPECTED_CASES, ids=[c[0][0] for c in UNEXPECTED_CASES])
def test_an_unexpected_exception_is_one_line_with_exit_1_unless_debugging(
    argv: list[str], target: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    def broken(*args: object, **kwargs: object) -> int:
        raise RuntimeError("disk controller on fire\nsecond line")

    monkeypatch.setattr(target, broken)
    monkeypatch.delenv("PGCLI_DEBUG", raising=False)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    assert main(argv) == 1
    captured = capsys.readouterr()
    one_error_line(
        captured.err, captured.out, "RuntimeError: disk controller on fire (PGCLI_DEBUG=1 for the traceback)"
    )
    monkeypatch.setenv("PGCLI_DEBUG", "1")
    with pytest.raises(RuntimeError, match="disk controller"):
        main(argv)


# --------------------------------------------------------------------------------------------------------------------
# faults: real `pgcli train` subprocesses
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class Places:
    """Files and directories the fault cases point pgcli at."""

    root: Path
    closed_port: int
    readonly: Path | None
    readonly_skip: str
    full: Path | None
    full_skip: str


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def try_mount_tmpfs(path: Path, options: str) -> str:
    """Mount a tmpfs at ``path``; '' on success, else why not."""
    if os.geteuid() != 0:
        return "needs root to mount a tmpfs"
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
    return "" if proc.returncode == 0 else f"mount -t tmpfs failed: {proc.stderr.strip()}"


def make_readonly_dir(path: Path) -> str:
    """A directory this process cannot write: a read-only tmpfs as root (chmod does not stop root), else chmod."""
    path.mkdir()
    if os.geteuid() == 0:
        return try_mount_tmpfs(path, "ro,size=1m")
    path.chmod(0o555)
    try:
        (path / "probe").touch()
    except PermissionError:
        return ""
    return "chmod 555 does not stop writes here"


def fill(path: Path) -> None:
    fd = os.open(path / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)


def make_full_dir(path: Path) -> str:
    """A directory on a full file system: a 64 KiB tmpfs filled up (root only)."""
    path.mkdir()
    why = try_mount_tmpfs(path, "size=64k")
    if not why:
        fill(path)
    return why


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Places]:
    root = tmp_path_factory.mktemp("faults")
    (root / "notes.txt").write_text("not a database\n" * 100)
    con = sqlite3.connect(root / "other_app.db")
    con.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    con.execute("INSERT INTO invoices (total) VALUES (9.5)")
    con.commit()
    con.close()
    (root / "a_directory.db").mkdir()
    (root / "a_file").write_text("x")
    try:
        readonly_skip = make_readonly_dir(root / "readonly")
        full_skip = make_full_dir(root / "full")
        yield Places(
            root,
            closed_port(),
            None if readonly_skip else root / "readonly",
            readonly_skip,
            None if full_skip else root / "full",
            full_skip,
        )
    finally:  # never leave a mount behind, even when making the directories failed half-way
        for name in ("readonly", "full"):
            if os.path.ismount(root / name):
                subprocess.run(["umount", str(root / name)], check=False)
        if (root / "readonly").is_dir():
            (root / "readonly").chmod(0o755)


@dataclass
class Fault:
    id: str
    args: Callable[[Places], list[str]]
    code: int
    fragment: str
    needs: str = ""
    """'readonly' or 'full': skipped where the test cannot make that directory."""
    env: Callable[[Places], dict[str, str]] | None = None
    cwd: Callable[[Places], Path | None] | None = None
    """Where pgcli starts (default: a fresh empty directory)."""


FAULTS = [
    Fault(
        "unreachable server",
        lambda p: ["tracking=server", f"tracking.uri=http://127.0.0.1:{p.closed_port}"],
        1,
        "is not reachable (Connection refused)",
    ),
    Fault(
        "unreachable server from MLFLOW_TRACKING_URI",
        lambda p: [],
        1,
        "is not reachable",
        env=lambda p: {"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{p.closed_port}"},
    ),
    Fault(
        "credentials are not printed",
        lambda p: [f"tracking.uri=https://alice:s3cr3t@127.0.0.1:{p.closed_port}"],
        1,
        "https://***@127.0.0.1",
    ),
    Fault(
        "store is a text file", lambda p: [f"tracking.uri=sqlite:///{p.root}/notes.txt"], 1, "is not a SQLite database"
    ),
    Fault(
        "store is another app's database",
        lambda p: [f"tracking.uri=sqlite:///{p.root}/other_app.db"],
        1,
        "another application's SQLite database (tables: invoices)",
    ),
    Fault("store is a directory", lambda p: [f"tracking.uri=sqlite:///{p.root}/a_directory.db"], 1, "is a directory"),
    Fault("store under /proc", lambda p: ["tracking.uri=sqlite:////proc/pgcli-test/mlflow.db"], 1, "is not writable"),
    Fault("store_dir under a file", lambda p: [f"tracking.store_dir={p.root}/a_file/store"], 1, "is not a directory"),
    Fault("run dir under /proc", lambda p: ["hydra.run.dir=/proc/pgcli-test/run"], 1, "hydra.run.dir"),
    Fault("run dir under a file", lambda p: [f"hydra.run.dir={p.root}/a_file/run"], 1, "is not a directory"),
    Fault(
        "sweep dir under /proc", lambda p: ["-m", "seed=0,1", "hydra.sweep.dir=/proc/pgcli-test"], 1, "hydra.sweep.dir"
    ),
    Fault(
        "read-only store dir", lambda p: [f"tracking.store_dir={p.readonly}/store"], 1, "is not writable", "readonly"
    ),
    Fault("read-only run dir", lambda p: [f"hydra.run.dir={p.readonly}/run"], 1, "is not writable", "readonly"),
    Fault("read-only working directory", lambda p: [], 1, "is not writable", "readonly", cwd=lambda p: p.readonly),
    Fault("full store dir", lambda p: [f"tracking.store_dir={p.full}/store"], 1, "full disk", "full"),
    Fault("full run dir", lambda p: [f"hydra.run.dir={p.full}/run"], 1, "full disk", "full"),
    Fault(
        "tracking off, full run dir", lambda p: ["tracking=off", f"hydra.run.dir={p.full}/run"], 1, "full disk", "full"
    ),
    # a sample of bad input through the real console script
    Fault("non-finite (subprocess)", lambda p: ["algo=trpo", "algo.cg_damping=nan"], 2, "must be a finite number"),
    Fault("SB3 constraint (subprocess)", lambda p: ["algo.batch_size=1"], 2, "algo.batch_size must be > 1"),
    Fault("bad scheme (subprocess)", lambda p: ["tracking.uri=mongodb://127.0.0.1/x"], 2, "scheme 'mongodb'"),
    Fault(
        "file store (subprocess)", lambda p: [f"tracking.uri={p.root}/mlruns"], 2, "is a folder (MLflow's file store"
    ),
    Fault("experiment escapes (subprocess)", lambda p: ["experiment=../../x"], 2, "must not contain '..'"),
    Fault("experiment too long (subprocess)", lambda p: [f"experiment={'x' * 501}"], 2, "at most 500 characters"),
]


def snapshot(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` with its content (what a fault must leave as it was)."""
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def fault_results(places: Places, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[object, ...]]:
    """Run every fault case once, three at a time; id -> (process, files before, files after, its empty cwd)."""
    before = snapshot(places.root)

    def run(case: Fault) -> tuple[object, ...]:
        if case.needs and getattr(places, case.needs) is None:
            return ("skip", getattr(places, f"{case.needs}_skip"))
        cwd = (case.cwd(places) if case.cwd else None) or tmp_path_factory.mktemp("work")
        env = case.env(places) if case.env else {}
        proc = run_pgcli(["train", "progress=false", "total_steps=64", *case.args(places)], cwd=cwd, timeout=120, **env)
        return (proc, cwd)

    with ThreadPoolExecutor(max_workers=3) as pool:
        results = dict(zip([c.id for c in FAULTS], pool.map(run, FAULTS), strict=True))
    return {key: (*value, before, snapshot(places.root)) for key, value in results.items()}


@pytest.mark.parametrize("case", FAULTS, ids=[c.id for c in FAULTS])
def test_fault_is_one_line_with_its_exit_status_and_creates_nothing(case: Fault, fault_results: dict) -> None:
    first, second, before, after = fault_results[case.id]
    if first == "skip":
        pytest.skip(f"cannot make a real {case.needs} directory here: {second}")
    proc, cwd = first, second
    assert isinstance(proc, subprocess.CompletedProcess) and isinstance(cwd, Path)
    assert proc.returncode == case.code, proc.stderr[-2000:]
    one_error_line(proc.stderr, proc.stdout, case.fragment)
    assert "s3cr3t" not in proc.stderr + proc.stdout
    assert list(cwd.iterdir()) == []  # no outputs/, no run directory, no default store
    assert after == before  # the store files it was pointed at are untouched


# --------------------------------------------------------------------------------------------------------------------
# a command that reads a store to find a run: no store there, or a store it cannot write
# --------------------------------------------------------------------------------------------------------------------

RUN_ID = "0123456789abcdef0123456789abcdef"
NO_STORE_CASES = [
    (["eval", RUN_ID], "nothing to evaluate"),
    (["eval", RUN_ID, "--no-log"], "nothing to evaluate"),
    (["train", "--from-run", RUN_ID, "progress=false"], "nothing to re-run"),
    (["sft", "env=addition", f"init={RUN_ID}", "progress=false"], "to look the run up in"),
]


@pytest.mark.parametrize(("argv", "fragment"), NO_STORE_CASES, ids=[" ".join(a[:2]) for a, _ in NO_STORE_CASES])
def test_a_run_id_without_a_store_is_one_line_and_creates_nothing(argv: list[str], fragment: str, tmp_path: Path):
    proc = run_pgcli(argv, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    one_error_line(proc.stderr, proc.stdout, fragment)
    assert f"{tmp_path.resolve()}/outputs/mlflow.db" in proc.stderr  # it names the store it looked in
    assert list(tmp_path.iterdir()) == []  # no outputs/, no mlflow.db


def make_readonly(folder: Path) -> str:
    """Make ``folder`` and the store file in it read-only: remounted read-only as root (a tmpfs mounted there before
    the store was written), else ``chmod a-w``; '' on success, else why not."""
    if os.geteuid() == 0:
        proc = subprocess.run(["mount", "-o", "remount,ro", str(folder)], capture_output=True, text=True)
        return "" if proc.returncode == 0 else f"mount -o remount,ro failed: {proc.stderr.strip()}"
    (folder / "mlflow.db").chmod(0o444)
    folder.chmod(0o555)
    try:
        (folder / "probe").touch()
    except PermissionError:
        return ""
    return "chmod a-w does not stop writes here"


SEED_STORE = """
import socket, subprocess, sys
from pgcli.tracking.store import RunStore
store = RunStore(sys.argv[1])
done = store.create_run("cartpole", run_name="ppo-cartpole-s0", tags={})
store.end(done.run_id, "FINISHED")
gone = subprocess.Popen(["true"])
gone.wait()
store.create_run("cartpole", run_name="crashed", tags={"pid": str(gone.pid), "hostname": socket.gethostname()})
print(done.run_id)
"""
"""A finished run and a RUNNING run of this host whose process is gone, written by another process (so that no
connection of this one keeps the store open when its folder is made read-only)."""


@pytest.fixture(scope="module")
def readonly_store(tmp_path_factory: pytest.TempPathFactory, mlflow_schema_db: Path) -> Iterator[tuple[Path, str]]:
    """A read-only store holding a finished run (its id comes along) and a stale RUNNING run."""
    folder = tmp_path_factory.mktemp("readonly_store") / "store"
    folder.mkdir()
    why = try_mount_tmpfs(folder, "size=8m") if os.geteuid() == 0 else ""
    try:
        if why:
            pytest.skip(f"cannot make a read-only store here: {why}")
        shutil.copyfile(mlflow_schema_db, folder / "mlflow.db")
        seeded = subprocess.run(
            [sys.executable, "-c", SEED_STORE, f"sqlite:///{folder / 'mlflow.db'}"],
            capture_output=True,
            text=True,
            check=True,
        )
        why = make_readonly(folder)
        if why:
            pytest.skip(f"cannot make a read-only store here: {why}")
        yield folder, seeded.stdout.split()[-1]
    finally:
        if os.path.ismount(folder):
            subprocess.run(["umount", str(folder)], check=False)
        elif folder.is_dir():
            folder.chmod(0o755)


READONLY_CASES = [
    (["eval", "{run_id}"], "cannot log the evaluation: the run store {db} is read-only"),
    (["runs", "--stale"], "cannot mark runs KILLED: the run store {db} is read-only"),
]


@pytest.mark.parametrize(("argv", "fragment"), READONLY_CASES, ids=[" ".join(a) for a, _ in READONLY_CASES])
def test_a_read_only_store_is_one_line_naming_it(
    argv: list[str], fragment: str, readonly_store: tuple[Path, str], tmp_path: Path
):
    folder, run_id = readonly_store
    before = snapshot(folder)
    argv = [a.format(run_id=run_id) for a in argv]
    proc = run_pgcli([*argv, f"tracking.uri=sqlite:///{folder / 'mlflow.db'}"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 1, proc.stderr[-2000:]
    one_error_line(proc.stderr, proc.stdout, fragment.format(db=folder / "mlflow.db"))
    assert snapshot(folder) == before and list(tmp_path.iterdir()) == []


def test_a_read_only_store_can_still_be_read(readonly_store: tuple[Path, str], tmp_path: Path):
    folder, _ = readonly_store
    proc = run_pgcli(["runs", "--stale", "--dry-run", f"tracking.uri=sqlite:///{folder / 'mlflow.db'}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "crashed" in proc.stdout and "would mark 1 stale run(s) KILLED" in proc.stderr


# --------------------------------------------------------------------------------------------------------------------
# a run id prefix (docs/runs.md, "Run ids"): too short, or shared by several runs
# --------------------------------------------------------------------------------------------------------------------

PREFIX = "0123abcd"
SHARED_PREFIX_STORE = """
import sys, uuid
from pgcli.tracking.store import RunStore
counter = iter(range(1, 100))
uuid.uuid4 = lambda: uuid.UUID(f"0123abcd{next(counter):024x}")  # every id MLflow makes starts with 0123abcd
store = RunStore(sys.argv[1])
for name in ("ppo-cartpole-s0", "ppo-cartpole-s1"):
    store.end(store.create_run("cartpole", run_name=name, tags={}).run_id, "FINISHED")
print(" ".join(sorted(r.run_id for r in store.search(store.experiment_ids()))))
"""


@pytest.fixture(scope="module")
def shared_prefix_store(tmp_path_factory: pytest.TempPathFactory, mlflow_schema_db: Path) -> tuple[Path, list[str]]:
    """A store with two finished runs whose ids share their first 8 hex digits (:data:`PREFIX`), and their ids."""
    folder = tmp_path_factory.mktemp("shared_prefix")
    shutil.copyfile(mlflow_schema_db, folder / "mlflow.db")
    seeded = subprocess.run(
        [sys.executable, "-c", SHARED_PREFIX_STORE, f"sqlite:///{folder / 'mlflow.db'}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return folder, seeded.stdout.split()


AMBIGUOUS_CASES = [
    ["eval", PREFIX],
    ["train", f"resume={PREFIX}"],
    ["train", "--from-run", PREFIX, "progress=false"],
    ["compare", "--parent", PREFIX],
]


@pytest.mark.parametrize("argv", AMBIGUOUS_CASES, ids=[" ".join(a[:2]) for a in AMBIGUOUS_CASES])
def test_a_run_id_prefix_of_several_runs_is_one_line_and_changes_nothing(
    argv: list[str], shared_prefix_store: tuple[Path, list[str]], tmp_path: Path
):
    folder, run_ids = shared_prefix_store
    assert len(run_ids) == 2 and all(r.startswith(PREFIX) for r in run_ids)
    before = snapshot(folder)
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    proc = run_pgcli([*argv, f"tracking.uri={uri}"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    one_error_line(
        proc.stderr,
        proc.stdout,
        f"run id prefix {PREFIX} matches 2 runs in {uri} ({', '.join(run_ids)}); type more of the id",
    )
    assert snapshot(folder) == before and list(tmp_path.iterdir()) == []


SHORT_CASES = [
    ["eval", "0123abc"],
    ["export", "0123abc"],
    ["train", "resume=0123abc"],
    ["train", "--from-run", "0123abc", "progress=false"],
    ["sft", "env=addition", "init=0123abc", "progress=false"],
]


@pytest.mark.parametrize("argv", SHORT_CASES, ids=[" ".join(a[:2]) for a in SHORT_CASES])
def test_a_run_id_prefix_under_8_hex_digits_is_one_line_and_creates_nothing(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    captured = capsys.readouterr()
    one_error_line(
        captured.err,
        captured.out,
        "'0123abc' is not a directory, and too short to name a run: a run id "
        "prefix needs at least 8 hex digits (pgcli runs shows 8)",
    )
    assert list(tmp_path.iterdir()) == []  # no outputs/, no store, no run directory


# --------------------------------------------------------------------------------------------------------------------
# a path argument that is wrong: one line, exit 2, before any work (issue 34: `export --out <file>` was a raw
# NotADirectoryError, `eval --out <file>` a FileExistsError after the evaluation)
# --------------------------------------------------------------------------------------------------------------------

PATH_CASES = [
    (["export", RUN_ID, "--out", "{file}"], "--out {file} is a file, not a directory; pass a directory"),
    (
        ["export", RUN_ID, "--out", "{file}/hf"],
        "--out {file}/hf: {file} is a file, not a directory; pass another --out",
    ),
    (["export", RUN_ID, "--out", "{full}"], "--out {full} exists and is not empty; pass another --out"),
    (["eval", RUN_ID, "--video", "--out", "{file}"], "--out {file} is a file, not a directory; pass a directory"),
    (["eval", RUN_ID, "--out", "{file}/videos"], "{file} is a file, not a directory; pass another --out"),
    (["compare", "--out", "{file}"], "--out {file} is a file, not a directory; pass a directory"),
    (["compare", "--out", "{file}/a/b"], "--out {file}/a/b: {file} is a file, not a directory; pass another --out"),
    (["sync", "{file}"], "{file} is a file, not a run directory"),
]


@pytest.mark.parametrize(
    ("argv", "fragment"), PATH_CASES, ids=[" ".join(x for x in a if x != RUN_ID) for a, _ in PATH_CASES]
)
def test_a_wrong_path_argument_is_one_line_exit_2_and_touches_nothing(
    argv: list[str], fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("keep me\n")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "config.json").write_text("{}\n")
    places = {"file": str(tmp_path / "notes.txt"), "full": str(tmp_path / "full")}
    before = snapshot(tmp_path)
    assert main([a.format(**places) for a in argv]) == 2
    captured = capsys.readouterr()
    one_error_line(captured.err, captured.out, fragment.format(**places))
    assert snapshot(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["full", "notes.txt"]


# --------------------------------------------------------------------------------------------------------------------
# pgcli sync --uri: the URI checks of pgcli train, before anything is delivered
# --------------------------------------------------------------------------------------------------------------------

SYNC_CASES = [
    ("./mlruns", 2, "is a folder (MLflow's file store"),
    ("sqlite:/x.db", 2, "a SQLite store is sqlite:///<relative path>"),
    ("htp://127.0.0.1:5000", 2, "did you mean http://?"),
    ("sqlite:///{root}/other_app.db", 1, "another application's SQLite database (tables: invoices)"),
]


@pytest.mark.parametrize(("uri", "code", "fragment"), SYNC_CASES, ids=[u for u, _, _ in SYNC_CASES])
def test_sync_checks_its_uri_before_delivering(
    uri: str, code: int, fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    from pgcli.tracking.spool import SPOOL_FILE, Spool

    root = tmp_path / "files"
    root.mkdir()
    con = sqlite3.connect(root / "other_app.db")
    con.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    con.commit()
    con.close()
    spool = Spool(root / "run" / SPOOL_FILE)
    spool.start("0123456789abcdef0123456789abcdef", "http://127.0.0.1:5000")
    spool.append({"op": "metrics", "metrics": [["loss", 1.0, 0, 0]]})
    before = snapshot(root)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(["sync", str(root / "run"), "--uri", uri.format(root=root)]) == code
    captured = capsys.readouterr()
    one_error_line(captured.err, captured.out, fragment)
    assert snapshot(root) == before and list(work.iterdir()) == []


# --------------------------------------------------------------------------------------------------------------------
# pgcli eval --video where MuJoCo cannot render: one line naming MUJOCO_GL and the fix
# --------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hopper_run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny TRPO run on Hopper-v5 (MuJoCo), tracking off: its run directory."""
    work = tmp_path_factory.mktemp("hopper")
    proc = run_pgcli(
        [
            "train",
            "algo=trpo",
            "env=hopper",
            "total_steps=256",
            "algo.n_steps=64",
            "env.n_envs=4",
            "algo.batch_size=64",
            "env.max_episode_steps=20",
            "eval.every=0",
            "eval.episodes=1",
            "tracking=off",
            "progress=false",
        ],
        cwd=work,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (model,) = (work / "outputs" / "runs").rglob("model")
    return model.parent


def osmesa_missing() -> str:
    import ctypes.util

    return "" if ctypes.util.find_library("OSMesa") is None else "libOSMesa is installed here: osmesa renders"


@pytest.mark.parametrize(
    ("gl", "fragment", "skip"),
    [
        ("bogus", "(MUJOCO_GL=bogus): set MUJOCO_GL to one of egl (libegl1", ""),
        ("osmesa", "(MUJOCO_GL=osmesa): its GL library did not load (", osmesa_missing()),
    ],
)
def test_eval_video_without_a_gl_backend_names_mujoco_gl(hopper_run_dir: Path, gl: str, fragment: str, skip: str):
    if skip:
        pytest.skip(skip)
    proc = run_pgcli(["eval", str(hopper_run_dir), "--video", "--no-log"], cwd=hopper_run_dir, MUJOCO_GL=gl)
    assert proc.returncode == 1, proc.stderr[-2000:]
    one_error_line(proc.stderr, proc.stdout, fragment)
    assert "or glfw (libglfw3 and a display)" in proc.stderr
