"""``pgcli ui``: the MLflow UI on pgcli's run store, said ready when it answers, opened on the runs.

- The server is MLflow's own (``python -m mlflow ui``), run in a private empty folder. ``python -m`` puts the current
  folder first on ``sys.path``, and so does the uvicorn it starts (its ``--app-dir`` defaults to ``.``), so in the
  user's folder a file named ``mlflow.py`` or ``uvicorn.py`` would run instead of MLflow (docs/sweeps.md, "In the
  MLflow UI"). The store's paths are absolute, so the folder the server runs in does not matter to it.
- Before it starts: the store must exist and be an MLflow store (nothing is created in a folder without one), the
  port must be in range and free. Bad input exits 2, a fault (port taken, server that never answers) exits 1.
- It polls the server's ``/health`` endpoint and prints the URLs once the UI answers, with the time that took; the
  server's access log is off (``uvicorn --no-access-log``), and what else the server says is passed on only after
  the URLs, so no request line lands between them.
- A sweep's runs are nested under its parent, which MLflow shows collapsed, and the chart view charts only the rows
  shown: the parent, which logs no metrics ("No charts"). The chart link of an experiment with a sweep therefore
  filters the runs to the latest sweep's children (``searchFilter=tags.mlflow.parentRunId = '<id>'``, a query
  parameter of MLflow's runs page, as are ``orderByKey`` and ``compareRunsMode``), sorted by name: MLflow 3.17's UI
  fetches the parents of the runs it lists only when they are sorted by creation time (its ``shouldFetchParents``),
  so the children are listed flat and charted.
- The URLs it prints open MLflow's model-training view. MLflow 3.17's UI takes the view from its sidebar switch
  (GenAI / Model training), kept in the browser's local storage and defaulting to GenAI, where an experiment opens
  on an empty Traces page; ``?workflowType=machine_learning`` selects model training (the experiment's
  ``mlflow.experimentKind`` tag, which pgcli also sets, is what earlier MLflow 3 releases read).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections import deque
from typing import IO, Any

from pgcli.errors import CommandParser, ConfigError, PgcliError
from pgcli.redact import redact_uri
from pgcli.tracking.checks import check_store
from pgcli.tracking.uri import TrackingTarget, probe_health, resolve_tracking_target, sqlite_path

ML_VIEW = "workflowType=machine_learning"
"""Query of MLflow UI URLs that selects the model-training view (runs, charts) over the GenAI one."""
BY_NAME = "tags.`mlflow.runName`"
"""MLflow UI's ``orderByKey`` for sorting runs by name."""
DEFAULT_TIMEOUT_S = 180.0


def parse_args(args: list[str]) -> argparse.Namespace:
    parser = CommandParser(
        prog="pgcli ui",
        description="Open the MLflow UI on pgcli's run store (the one `pgcli train` logs to with the same "
        "tracking overrides). Prints the URL once the UI answers. Runs of a sweep are nested under their parent "
        "run; select runs and use the Chart view to compare learning curves.",
        epilog="comparing a sweep's runs (pgcli train -m ...):\n"
        "  1. open the URL pgcli prints (it selects MLflow's 'Model training' view; in the sidebar, switch from\n"
        "     'GenAI' to 'Model training' if an experiment opens on an empty Traces page)\n"
        "  2. open the experiment (the env name, or `sweeps` for a sweep over several envs, or experiment=...);\n"
        "     the sweep is one row, `sweep-<date>-<time>`: expand it (+) to see its jobs as child runs;\n"
        "     its Artifacts tab has children.md (each job's status and final return), Optuna's\n"
        "     optimization_results.yaml, and compare/ once `pgcli compare` has run\n"
        "  3. the printed 'charts of its latest sweep' URL lists that sweep's runs flat in Chart view: each metric\n"
        "     (eval/return_mean, rollout/ep_return_mean, ...) is one chart against env steps, one line per run;\n"
        "     for another sweep, filter tags.mlflow.parentRunId = '<its id>' and sort by Run Name\n"
        "  4. to average over seeds with a confidence band, run `pgcli compare --parent <parent run id>`\n"
        "  filter runs in the search box: tags.mlflow.parentRunId = '<id>', params.algo = 'ppo'",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--port", type=int, default=5000, help="port (default: 5000)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: localhost only)")
    parser.add_argument("--workers", type=int, default=1, help="UI server worker processes (default: 1)")
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds to wait for the UI to answer (default: 180)"
    )
    parser.add_argument("overrides", nargs="*", help="tracking overrides, e.g. tracking.store_dir=elsewhere")
    return parser.parse_args(args)


def main(args: list[str]) -> int:
    """Entry point of ``pgcli ui``: start the server, say when it is ready, run until Ctrl-C or SIGTERM."""
    ns = parse_args(args)
    check_options(ns)
    target = store_to_show(ns.overrides)
    if target.uri.startswith(("http://", "https://")):
        print(f"pgcli: runs are on a tracking server; open {redact_uri(target.uri, keep_user=True)} in a browser")
        return 0
    check_store(target.uri, "read", doing="show")
    check_port_free(ns.host, ns.port)
    url = f"http://{browser_host(ns.host)}:{ns.port}"
    print(f"pgcli: starting the MLflow UI on {url} (store {target.uri}) ...", file=sys.stderr)
    return serve(server_command(target, ns), url, timeout_s=ns.timeout)


def check_options(ns: argparse.Namespace) -> None:
    """Raise a one-line ConfigError (exit 2) for a port, worker count or timeout out of range."""
    if not 1 <= ns.port <= 65535:
        raise ConfigError(f"--port must be between 1 and 65535 (got {ns.port}); e.g. --port 5000")
    if ns.workers < 1:
        raise ConfigError(f"--workers must be >= 1 (got {ns.workers})")
    if not ns.timeout > 0:
        raise ConfigError(f"--timeout must be > 0 seconds (got {ns.timeout})")


def store_to_show(overrides: list[str]) -> TrackingTarget:
    """The store ``pgcli train`` with the same tracking overrides logs to (ConfigError with ``tracking=off``)."""
    from pgcli.config.compose import compose_train_config  # Hydra: not needed for --help or a bad option

    run_cfg = compose_train_config(overrides)
    if run_cfg.tracking.backend != "mlflow":
        raise ConfigError("tracking=off has no run store to show; drop the tracking override")
    return resolve_tracking_target(run_cfg.tracking)


def server_command(target: TrackingTarget, ns: argparse.Namespace) -> list[str]:
    """``python -m mlflow ui`` on the store, with the store's path absolute: the server runs in another folder."""
    db = sqlite_path(target.uri)
    store_uri = f"sqlite:///{db.resolve()}" if db else target.uri
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "ui",
        "--backend-store-uri",
        store_uri,
        "--host",
        ns.host,
        "--port",
        str(ns.port),
        "--workers",
        str(ns.workers),
    ]
    if target.artifact_root:
        cmd += ["--default-artifact-root", target.artifact_root]
    return [*cmd, "--uvicorn-opts=--no-access-log"]  # a line per request would bury the URLs and errors


def serve(cmd: list[str], url: str, *, timeout_s: float) -> int:
    """Run the UI server ``cmd`` until Ctrl-C or SIGTERM (exit 0), printing its URLs once it answers at ``url``."""
    # One worker and no job runner: ~5 s to healthy instead of ~11 s with MLflow's 4 workers + 7 huey consumers
    # on a 2-core machine.
    env = {**os.environ}
    env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)  # `kill` stops the server too, as Ctrl-C does
    start = time.monotonic()
    # A session of its own: the server and its uvicorn child are stopped together, as one process group.
    server_dir = tempfile.TemporaryDirectory(prefix="pgcli-ui-")  # nothing in it can shadow mlflow or uvicorn
    server = subprocess.Popen(
        cmd,
        cwd=server_dir.name,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    output = ServerOutput(server.stdout)
    try:
        wait_until_healthy(server, url, output, timeout_s=timeout_s)
        links = ui_links(url)
        print(f"pgcli: MLflow UI ready after {time.monotonic() - start:.1f} s; Ctrl-C to stop", file=sys.stderr)
        sys.stderr.flush()
        print("".join(f"  {label}: {link}\n" for label, link in links), end="", flush=True)
        output.forward()  # the server's own lines (warnings, errors) from now on, after the URLs
        code = server.wait()
    except KeyboardInterrupt:
        stop(server)
        print("pgcli: MLflow UI stopped", file=sys.stderr)
        return 0
    except BaseException:
        stop(server)
        raise
    finally:
        server_dir.cleanup()
    raise PgcliError(f"the MLflow UI server stopped with status {code}: {output.last_line()}")


def ui_links(url: str) -> list[tuple[str, str]]:
    """(label, URL) to print: the experiments page and, if there is a run, the latest experiment's runs and its
    charts, in the training view; with a sweep in that experiment, the charts of its latest sweep's runs."""
    links = [("experiments", f"{url}/#/experiments?{ML_VIEW}")]
    latest = latest_experiment(url)
    if latest is None:
        return links
    experiment_id, name = latest
    runs_url = f"{url}/#/experiments/{experiment_id}/runs?{ML_VIEW}"
    links.append((f"latest experiment '{name}'", runs_url))
    sweep = latest_sweep(url, experiment_id)
    if sweep is None:
        return [*links, ("its charts", f"{runs_url}&compareRunsMode=CHART")]
    query = urllib.parse.urlencode(
        {
            "compareRunsMode": "CHART",
            "searchFilter": f"tags.mlflow.parentRunId = '{sweep[0]}'",
            "orderByKey": BY_NAME,  # sorted by creation time, MLflow would fetch the parent too, collapsed
            "orderByAsc": "true",
        },
        quote_via=urllib.parse.quote,
    )
    return [*links, (f"charts of its latest sweep '{sweep[1]}'", f"{runs_url}&{query}")]


def browser_host(host: str) -> str:
    """Where a browser on this machine reaches a server bound to ``host``."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def check_port_free(host: str, port: int) -> None:
    """Raise a one-line PgcliError when ``host:port`` cannot be bound (in use, or an address not on this machine)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: TIME_WAIT is not "in use"
        try:
            sock.bind((host, port))
        except OSError as exc:
            what = "is in use (another pgcli ui or server?)" if exc.errno == 98 else f"cannot be used ({exc.strerror})"
            raise PgcliError(f"{host}:{port} {what}; pick another with --port N") from None


class ServerOutput:
    """Reads the server's output in a thread: kept (last lines) until the UI is ready, then passed to stderr."""

    def __init__(self, stream: IO[str] | None) -> None:
        self.lines: deque[str] = deque(maxlen=50)
        self._forward = threading.Event()
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream: IO[str] | None) -> None:
        if stream is None:
            return
        for line in stream:
            self.lines.append(line.rstrip())
            if self._forward.is_set():
                sys.stderr.write(line)

    def forward(self) -> None:
        self._forward.set()

    def last_line(self) -> str:
        """The server's last meaningful line (its error), for a one-line message."""
        self._thread.join(timeout=2)
        meaningful = [line for line in self.lines if line.strip() and not line.startswith((" ", "\t", "^"))]
        return meaningful[-1] if meaningful else "no output"


def wait_until_healthy(server: subprocess.Popen[str], url: str, output: ServerOutput, *, timeout_s: float) -> None:
    """Poll ``url/health`` until the UI answers; raise a one-line PgcliError if the server exits or times out."""
    deadline = time.monotonic() + timeout_s
    while True:
        code = server.poll()
        if code is not None:
            raise PgcliError(f"the MLflow UI server exited with status {code} before it answered: {output.last_line()}")
        if probe_health(url, timeout_s=2.0).ok:
            return
        if time.monotonic() > deadline:
            stop(server)
            raise PgcliError(
                f"the MLflow UI did not answer on {url} within {timeout_s:.0f} s (last output: {output.last_line()}); "
                "a busy machine may need --timeout"
            )
        time.sleep(0.2)


def latest_experiment(url: str) -> tuple[str, str] | None:
    """(id, name) of the experiment whose newest run started last (what the user trained last), read through the
    server's REST API; None when there is no run. Not the last created or changed experiment: a new run in an older
    experiment changes neither."""
    experiments: list[dict[str, Any]] = []
    token = None
    try:
        while True:
            page = _post(url, "experiments/search", {"max_results": 1000, **({"page_token": token} if token else {})})
            experiments += page.get("experiments", [])
            token = page.get("next_page_token")
            if not token:
                break
        names = {str(e["experiment_id"]): str(e["name"]) for e in experiments}
        if not names:
            return None
        order = {"experiment_ids": list(names), "max_results": 1, "order_by": ["attributes.start_time DESC"]}
        runs = _post(url, "runs/search", order).get("runs", [])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # only a convenience: the experiments URL is printed anyway
    if not runs:
        return None
    experiment_id = str(runs[0]["info"]["experiment_id"])
    return (experiment_id, names[experiment_id]) if experiment_id in names else None


def latest_sweep(url: str, experiment_id: str) -> tuple[str, str] | None:
    """(run id, name) of the sweep parent (tag ``pgcli_role=sweep``) that started last in the experiment; None when
    it has none or the server cannot say."""
    query = {
        "experiment_ids": [experiment_id],
        "filter": "tags.pgcli_role = 'sweep'",
        "max_results": 1,
        "order_by": ["attributes.start_time DESC"],
    }
    try:
        runs = _post(url, "runs/search", query).get("runs", [])
        return (str(runs[0]["info"]["run_id"]), str(runs[0]["info"]["run_name"])) if runs else None
    except (OSError, ValueError, KeyError, TypeError):
        return None  # only a convenience: the experiment's URLs are printed anyway


def _post(url: str, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST ``body`` to the server's ``/api/2.0/mlflow/<endpoint>`` and return its JSON answer."""
    request = urllib.request.Request(
        f"{url}/api/2.0/mlflow/{endpoint}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        answer = json.load(response)
    if not isinstance(answer, dict):
        raise ValueError(f"{endpoint} answered {type(answer).__name__}, not an object")
    return answer


def stop(server: subprocess.Popen[str]) -> None:
    """Stop the server's whole process group (MLflow's CLI and its uvicorn): SIGTERM, then SIGKILL after 30 s.

    MLflow's CLI forwards the signal to uvicorn and waits for it: 5-9 s on a busy 2-core machine.
    """
    try:
        os.killpg(server.pid, signal.SIGTERM)
    except ProcessLookupError:
        return  # already gone, children included
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
