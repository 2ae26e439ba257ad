"""Start and stop a one-machine Ray head bound to 127.0.0.1 (``make ray-up`` / ``make ray-down``, and the tests).

``python -m hydra_plugins.pgcli_ray_launcher.head up [--port 6379] [--num-cpus N]`` starts ``ray start --head
--block`` in the background with every Ray socket on loopback, waits until it accepts connections and writes its
pid to ``outputs/ray/head.pid``; ``down`` stops exactly that process (SIGTERM: ``ray start --block`` then stops the
processes it started) instead of ``ray stop``, which kills every Ray process on the machine, other users' included.
"""

# No `from __future__ import annotations`: Hydra's plugin scan imports this module in a way that breaks
# dataclasses with string annotations.
import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HEAD_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # Ray's single-machine mode: every address stays on 127.0.0.1
    "RAY_AUTH_MODE": "token",  # token auth, as `ray start` defaults to; the token is in ~/.ray/auth_token
    "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",  # stop at once on SIGTERM (default: drain for up to 30 s)
    "RAY_DISABLE_USAGE_STATS": "1",
}
DEFAULT_DIR = Path("outputs/ray")


@dataclass
class Head:
    """A running head: its ``ray start`` process and the address jobs connect to."""

    pid: int
    address: str
    log: Path


def start_head(
    *, port: int = 6379, num_cpus: int | None = None, state_dir: Path = DEFAULT_DIR, timeout_s: float = 90.0
) -> Head:
    """Start a Ray head on 127.0.0.1:``port`` in the background and wait until it accepts connections.

    Raises RuntimeError (with the end of Ray's log) if it does not come up within ``timeout_s``.
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    log = state_dir / "head.log"
    ray = Path(sys.executable).with_name("ray")
    ensure_auth_token(ray)
    cmd = [
        str(ray),
        "start",
        "--head",
        "--block",
        "--node-ip-address=127.0.0.1",
        f"--port={port}",
        "--include-dashboard=false",
        "--disable-usage-stats",
    ]
    if num_cpus is not None:
        cmd.append(f"--num-cpus={num_cpus}")
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **HEAD_ENV}, start_new_session=True
        )
    head = Head(proc.pid, f"127.0.0.1:{port}", log)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ray start exited with status {proc.returncode}: {_tail(log)}")
        if "Ray runtime started" in log.read_text(errors="replace") and _port_open(port):
            (state_dir / "head.pid").write_text(f"{proc.pid}\n{head.address}\n")
            return head
        time.sleep(0.5)
    stop_head(proc.pid)
    raise RuntimeError(f"Ray head did not start within {timeout_s:.0f} s: {_tail(log)}")


def ensure_auth_token(ray: Path) -> None:
    """Create the Ray auth token on a machine that has none (a fresh HOME).

    ``ray start`` with token auth (Ray >= 2.52) refuses to start without one and never creates it; jobs that connect
    (``ray.init(address=...)``) read the same file, so one token per user covers the head and the launcher. The token
    is a secret: Ray's command prints it, so its output is discarded.
    """
    if os.environ.get("RAY_AUTH_TOKEN"):
        return
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    if path.is_file() and path.stat().st_size > 0:
        return
    done = subprocess.run(
        [str(ray), "get-auth-token", "--generate"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **HEAD_ENV},
        timeout=60,
    )
    if done.returncode != 0 or not path.is_file():
        raise RuntimeError(f"cannot create the Ray auth token {path}: {done.stderr.strip()[-300:]}")
    path.chmod(0o600)  # Ray writes it world-readable; it grants access to the cluster


def stop_head(pid: int, *, timeout_s: float = 30.0) -> None:
    """Stop the ``ray start --block`` process ``pid`` and the Ray processes it started (its session)."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return
        time.sleep(0.2)
    # The head ignored SIGTERM: end its whole session (start_new_session made it a process group of its own).
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:  # not our child (make ray-down): probe it
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _tail(log: Path, n: int = 10) -> str:
    return " | ".join(log.read_text(errors="replace").strip().splitlines()[-n:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hydra_plugins.pgcli_ray_launcher.head")
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--port", type=int, default=6379)
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs the head offers (default: all)")
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="where head.pid and head.log go")
    ns = parser.parse_args(argv)
    pid_file = ns.dir / "head.pid"
    if ns.action == "up":
        if pid_file.is_file() and _alive(int(pid_file.read_text().split()[0])):
            print(f"ray head already running ({pid_file}); make ray-down first", file=sys.stderr)
            return 1
        head = start_head(port=ns.port, num_cpus=ns.num_cpus, state_dir=ns.dir)
        print(
            f"ray head on {head.address} (pid {head.pid}, log {head.log}); sweep on it with:\n"
            f"  pgcli train -m hydra/launcher=ray hydra.launcher.address={head.address} seed=0,1"
        )
        return 0
    if not pid_file.is_file():
        print(f"no ray head recorded in {pid_file}", file=sys.stderr)
        return 0
    stop_head(int(pid_file.read_text().split()[0]))
    pid_file.unlink()
    print("ray head stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
