"""A pgcli with its libraries already imported, forked for each command a test runs (``run_pgcli``,
``start_pgcli``).

Each ``pgcli`` process of the suite used to spend 3.5 s (an idle machine) to over 10 s (a loaded one) importing
torch, MLflow, SB3, Hydra and gymnasium before it did anything; the suite starts several hundred of them. This server
imports those libraries once (and no pgcli module, so every command still imports its own code fresh), then forks one
child per command. The child is a real process of its own: its working directory, environment, argv and standard
streams are the command's, it runs ``pgcli.cli.main`` as the console script does, and it exits through Python's
normal shutdown (atexit handlers, MLflow's flushes), so the exit status and output are what the console script gives.

What it does not cover, and where the suite still runs the console script itself (``fork=False``, the
import-laziness probes of ``test_cli.py``, the tests that start ``pgcli`` through ``subprocess`` directly): what a
command imports, its start-up time. A command whose environment changes a variable the interpreter or the preloaded
libraries may read at start-up (:data:`IMPORT_ENV`: ``OMP_*``, ``CUDA_*``, ``PYTHONHASHSEED`` ...) runs the console
script too (:meth:`ForkServer.stopping`). ``PGCLI_TEST_EXEC=1`` runs every command through the console script.
Where the ``lm`` extra is installed, transformers and peft are preloaded as well (and ``HF_*`` is such a variable):
a command that sets an ``HF_*`` variable itself before its first import of them (``env=dataset`` sets
``HF_HUB_OFFLINE`` before importing ``datasets``, then sets ``datasets.config`` too) finds huggingface_hub's constants
read already, as a console-script command that loaded ``model=hf`` first does.

Protocol (one Unix socket per pytest worker): the client sends one JSON line (argv, cwd, env, stdout and stderr file
paths); a handler process forked for that connection forks the command, answers ``{"pid": N}``, waits for it and
answers ``{"status": S}`` (``os.waitstatus_to_exitcode``: negative for a signal, as ``subprocess`` reports it).
"""

from __future__ import annotations

import gc
import json
import locale
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types
from contextlib import suppress
from pathlib import Path
from subprocess import CompletedProcess
from typing import BinaryIO

PRELOAD = (
    "numpy",
    "torch",
    "torch._dynamo",  # the first optimizer imports it (with sympy): 3-5 s of every training command
    "pandas",
    "sqlalchemy",
    "alembic",
    "mlflow",
    "mlflow.tracking",
    "mlflow.store.tracking.sqlalchemy_store",
    "mlflow.pyfunc",
    "hydra",
    "omegaconf",
    "gymnasium",
    "stable_baselines3",
    "sb3_contrib",
    "matplotlib",
    "matplotlib.pyplot",
    "tqdm",
    "yaml",
)
"""Imported once by the server. No pgcli module: a command imports pgcli's code afresh, as the console script does."""

PRELOAD_IF_INSTALLED = (
    "transformers",
    "transformers.models.llama.modeling_llama",  # model=hf's tests: a random Llama (tests/conftest.py)
    "transformers.models.gpt2.modeling_gpt2",  # pgcli export writes a GPT-2
    "peft",
    "datasets",  # env=dataset reads rows with it
)
"""Imported too where the ``lm`` extra is installed: 3-4 s of CPU in every command that loads a ``model=hf``, 1-2 s
in every ``env=dataset`` command."""

IMPORT_ENV = (
    "PYTHON",
    "LANG",
    "LC_",
    "TZ",
    "LD_",
    "OMP_",
    "KMP_",
    "GOMP_",
    "MKL_",
    "OPENBLAS_",
    "NUMEXPR_",
    "CUDA_",
    "NVIDIA_",
    "TORCH",
    "PYTORCH_",
    "MPL",
    "TQDM_",
    "SQLALCHEMY_",
    "HF_",
    "HUGGINGFACE_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
    "SAFETENSORS_",
    "ACCELERATE_",
    "PEFT_",
)
"""Prefixes of the environment variables the interpreter or a preloaded library may read at start-up or import: a
command whose environment changes one of these runs as the console script. ``PYTHONPATH`` is the exception: the child
puts its entries on ``sys.path`` where the interpreter would have."""


class ForkServer:
    """The client side: one server per pytest process (the caller closes it)."""

    def __init__(self, env: dict[str, str], *, cwd: Path) -> None:
        self.env = env
        self.dir = Path(tempfile.mkdtemp(prefix="pgcli-fork-"))
        self.socket = self.dir / "socket"
        self.children: list[Forked] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.forkserver", str(self.socket)],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"tests/forkserver.py did not start (exit {self.proc.wait()})")

    def stopping(self, env: dict[str, str]) -> list[str]:
        """The variables that keep a command with environment ``env`` from being forked: those it changes that the
        interpreter or the preloaded libraries may read at start-up (:data:`IMPORT_ENV`). Empty: it may be forked."""
        changed = {k for k in env.keys() | self.env.keys() if env.get(k) != self.env.get(k)}
        return sorted(k for k in changed if k.startswith(IMPORT_ENV) and k != "PYTHONPATH")

    def start(self, argv: list[str], *, cwd: Path, env: dict[str, str], stdout: Path, stderr: Path) -> Forked:
        for stream_file in {stdout, stderr} - {Path(os.devnull)}:
            stream_file.write_bytes(b"")  # there when this returns, as with Popen (the child opens it to append)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(str(self.socket))
        stream = conn.makefile("rwb")
        request = {"exe": argv[0], "args": argv[1:], "cwd": str(cwd), "env": env}
        stream.write(json.dumps({**request, "stdout": str(stdout), "stderr": str(stderr)}).encode() + b"\n")
        stream.flush()
        child = Forked(argv, json.loads(stream.readline())["pid"], conn, stream)
        self.children = [c for c in self.children if c.returncode is None] + [child]
        return child

    def run(self, argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float) -> CompletedProcess[str]:
        """Like ``subprocess.run(argv, capture_output=True, text=True, timeout=timeout)``."""
        out, err = (self.dir / f"{time.monotonic_ns()}.{name}" for name in ("out", "err"))
        try:
            child = self.start(argv, cwd=cwd, env=env, stdout=out, stderr=err)
            try:
                child.wait(timeout)
            except subprocess.TimeoutExpired:
                child.kill_group()
                raise subprocess.TimeoutExpired(argv, timeout, _read(out), _read(err)) from None
            return CompletedProcess(argv, child.returncode, _read(out), _read(err))
        finally:
            out.unlink(missing_ok=True)
            err.unlink(missing_ok=True)

    def close(self) -> None:
        for child in self.children:
            if child.returncode is None:
                child.kill_group()
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


SERVERS: list[ForkServer] = []
"""This pytest process's server, kept here and not in tests/conftest.py: pytest imports that file as ``conftest``
and the tests import it again as ``tests.conftest``, two modules, and the session's end must close the server the
tests started (it kills the commands still running; its commands' CPU time then counts as the pytest process's)."""


class Forked:
    """A forked command, as much of ``subprocess.Popen`` as the tests use."""

    def __init__(self, args: list[str], pid: int, conn: socket.socket, stream: BinaryIO) -> None:
        self.args, self.pid, self.returncode = args, pid, None
        self._conn, self._stream = conn, stream

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._conn], [], [], 0)[0]:
            self._collect()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._conn], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self._collect()
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def kill_group(self) -> None:
        """SIGKILL to the command and every process it started (it leads a session of its own)."""
        with suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)

    def _collect(self) -> None:
        line = self._stream.readline()
        self.returncode = json.loads(line)["status"] if line else -signal.SIGKILL  # no answer: the handler died
        self._stream.close()
        self._conn.close()


def _read(path: Path) -> str:
    """A stream's text as ``subprocess.run(text=True)`` gives it (the locale's encoding, universal newlines)."""
    try:
        with path.open(encoding=locale.getpreferredencoding(False)) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def serve(path: str) -> None:
    for name in PRELOAD:
        __import__(name)
    for name in PRELOAD_IF_INSTALLED:
        with suppress(ImportError):
            __import__(name)
    import matplotlib

    matplotlib.use("Agg")  # what pgcli's plots select; done here once so no child differs in it
    gc.disable()
    gc.freeze()  # the preloaded objects leave the collector: a child's collections neither scan nor copy them
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    print("ready", flush=True)
    parent = os.getppid()
    listener.settimeout(2)
    while os.getppid() == parent:  # the pytest process that started it is gone: so is the server
        _reap()
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        conn.settimeout(None)
        if os.fork() == 0:  # the handler: one per command, so commands may overlap
            listener.close()
            _command(_handle(conn))  # only the command's own process gets here; it never returns
        conn.close()


def _reap() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def _handle(conn: socket.socket) -> dict:
    """In the handler: read the request, fork the command and return the request in it; report and exit here."""
    code = 1
    try:
        stream = conn.makefile("rwb")
        request = json.loads(stream.readline())
        pid = os.fork()
        if pid == 0:
            stream.close()
            conn.close()
            return request
        stream.write(json.dumps({"pid": pid}).encode() + b"\n")
        stream.flush()
        _, status = os.waitpid(pid, 0)
        stream.write(json.dumps({"status": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
        stream.flush()
        code = 0
    except BaseException:
        pass
    os._exit(code)


def _command(request: dict) -> None:
    """Become the command: its own session (a timeout kills the whole group), directory, environment, streams, argv."""
    gc.enable()
    os.setsid()
    # Ctrl-C raises KeyboardInterrupt, as in a terminal, even when pytest runs as a background job (SIGINT ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    served = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ.clear()
    os.environ.update(request["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    for fd, target in ((null, 0), (out, 1), (err, 2)):
        os.dup2(fd, target)
        os.close(fd)
    sys.argv = [request["exe"], *request["args"]]
    own = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    rest = [p for p in sys.path[1:] if p not in served]
    sys.path[:] = [os.path.dirname(request["exe"]), *own, *rest]  # the console script's (the server's [0]: the repo)
    # __main__ is the console script, as multiprocessing's spawn start method reads it: a worker process runs that
    # file (its `if __name__ == "__main__"` guard keeps it from training again), not this server's module
    main_module = types.ModuleType("__main__")
    main_module.__file__ = request["exe"]
    main_module.__spec__ = None
    sys.modules["__main__"] = main_module
    from pgcli.cli import main

    sys.exit(main())  # SystemExit unwinds to the interpreter's own exit: atexit handlers and flushes run


if __name__ == "__main__":
    serve(sys.argv[1])
