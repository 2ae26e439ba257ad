"""`pgcli ui` for real: the MLflow server starts (not a `mlflow.py` in the current folder), says when it is ready,
prints URLs of the model-training view, stops with the command; and, in a headless Chromium, a sweep's experiment
shows its runs and an `eval/return_mean` chart (docs/sweeps.md, "In the MLflow UI")."""

from __future__ import annotations

import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest

from tests.conftest import Store, cli_env

pytestmark = pytest.mark.slow  # each test starts an MLflow server: 10-20 s on an idle 2-core machine
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
READY_TIMEOUT_S = 300  # generous: on a 2-core machine shared with other jobs the server has taken over a minute
SHADOW = "open('SHADOWED', 'w').write(__file__)\nraise SystemExit(3)\n"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def log_sweep(store: Store) -> None:
    """A small sweep's worth of runs, written by pgcli's own tracking code: a parent and 2 seeds of PPO on CartPole,
    each with an eval/return_mean history."""
    from pgcli.tracking.store import RunStore

    runs = RunStore(store.uri)
    artifacts = (store.root / "mlartifacts").as_uri()
    parent = runs.create_run("cartpole", run_name="sweep-test", tags={"pgcli_role": "sweep"}, artifact_root=artifacts)
    for seed in (0, 1):
        tags = {"mlflow.parentRunId": parent.run_id, "algo": "ppo", "env_id": "CartPole-v1", "seed": str(seed)}
        child = runs.create_run("cartpole", run_name=f"ppo-cartpole-s{seed}", tags=tags, artifact_root=artifacts)
        runs.log_params(child.run_id, {"algo": "ppo", "env.id": "CartPole-v1", "seed": seed, "total_steps": 4000})
        for step in range(0, 4001, 1000):
            runs.log_metrics(child.run_id, {"eval/return_mean": 20.0 + step / 40 + 10 * seed}, step=step)
        runs.end(child.run_id, "FINISHED")
    runs.end(parent.run_id, "FINISHED")


@dataclass
class UI:
    """A running `pgcli ui` subprocess and what it printed so far."""

    proc: subprocess.Popen[str]
    lines: queue.Queue[tuple[str, str]] = field(default_factory=queue.Queue)
    seen: list[str] = field(default_factory=list)
    stream: dict[str, list[str]] = field(default_factory=lambda: {"out": [], "err": []})

    def wait_for(self, fragment: str, timeout_s: float = READY_TIMEOUT_S) -> str:
        """The first line (stdout or stderr) containing ``fragment``, already seen or to come; fails if pgcli exits or
        time runs out. (Two threads read the two pipes: which of a stdout and a stderr line is seen first is not what
        pgcli printed first.)"""
        for line in self.seen:
            if fragment in line:
                return line
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                name, line = self.lines.get(timeout=1)
            except queue.Empty:
                assert self.proc.poll() is None, f"pgcli ui exited {self.proc.returncode}: {self.seen}"
                continue
            self.seen.append(line)
            self.stream[name].append(line)
            if fragment in line:
                return line
        raise AssertionError(f"no line with {fragment!r} within {timeout_s} s: {self.seen}")

    def quiet_for(self, seconds: float) -> None:
        """Fails if pgcli prints a request line (the server's access log) within ``seconds``."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                name, line = self.lines.get(timeout=left)
            except queue.Empty:
                return
            self.seen.append(line)
            self.stream[name].append(line)
            assert '"GET ' not in line and '"POST ' not in line, self.seen

    def url(self, label: str) -> str:
        return next(line for line in self.seen if line.strip().startswith(label)).split(": ", 1)[1].strip()


def pump(name: str, stream: IO[str], lines: queue.Queue[tuple[str, str]]) -> None:
    for line in stream:
        lines.put((name, line.rstrip()))


@pytest.fixture
def sweep_store(migrated_store: Store) -> Store:
    """The sweep's runs in 'cartpole', the experiment created first: 'pendulum', created after it, has an older run,
    so the latest experiment pgcli ui links to is the one whose newest run started last, not the newest one."""
    from pgcli.tracking.client import get_or_create_experiment
    from pgcli.tracking.store import RunStore

    runs = RunStore(migrated_store.uri)
    artifacts = (migrated_store.root / "mlartifacts").as_uri()
    get_or_create_experiment(runs.client, "cartpole", artifacts)
    older = runs.create_run("pendulum", run_name="ppo-pendulum-s0", tags={}, artifact_root=artifacts)
    runs.end(older.run_id, "FINISHED")
    time.sleep(0.01)  # the sweep's runs start later, whatever the clock's resolution
    log_sweep(migrated_store)
    return migrated_store


@pytest.fixture
def ui(sweep_store: Store, workdir: Path) -> Iterator[UI]:
    """`pgcli ui` on a free port, started in a folder whose mlflow.py and uvicorn.py would run if they could."""
    (workdir / "mlflow.py").write_text(SHADOW)
    (workdir / "uvicorn.py").write_text(SHADOW)
    exe = Path(sys.executable).parent / "pgcli"
    args = [
        str(exe),
        "ui",
        "--port",
        str(free_port()),
        "--timeout",
        str(READY_TIMEOUT_S),
        f"tracking.uri={sweep_store.uri}",
    ]
    proc = subprocess.Popen(args, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env())
    handle = UI(proc)
    for name, stream in (("out", proc.stdout), ("err", proc.stderr)):
        threading.Thread(target=pump, args=(name, stream, handle.lines), daemon=True).start()
    yield handle
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def test_ui_runs_mlflow_not_the_folder_says_ready_and_stops_with_its_server(ui: UI, workdir: Path, sweep_store: Store):
    ui.wait_for("MLflow UI ready after")
    charts = ui.wait_for("charts of its latest sweep 'sweep-test': ")
    assert not (workdir / "SHADOWED").exists()  # neither `python -m mlflow` nor uvicorn imported ./mlflow.py
    experiment = sweep_store.client().get_experiment_by_name("cartpole")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert ui.url("experiments").endswith("/#/experiments?workflowType=machine_learning")
    assert ui.url("latest experiment 'cartpole'").endswith(
        f"/#/experiments/{experiment.experiment_id}/runs?workflowType=machine_learning"
    )
    (parent,) = [r for r in sweep_store.runs("cartpole") if r.data.tags.get("pgcli_role") == "sweep"]
    assert charts.endswith(
        f"/runs?workflowType=machine_learning&compareRunsMode=CHART&searchFilter=tags.mlflow.parentRunId%20%3D%20%27"
        f"{parent.info.run_id}%27&orderByKey=tags.%60mlflow.runName%60&orderByAsc=true"
    )
    # the ready line is the last on stderr and stdout holds the three URLs and nothing else (which pipe's lines the
    # reader threads saw first is not what pgcli printed first), and requests to the server log nothing after them
    ready = next(i for i, line in enumerate(ui.stream["err"]) if "MLflow UI ready after" in line)
    assert ui.stream["err"][ready + 1 :] == [], ui.seen
    assert [line.split(":")[0].strip() for line in ui.stream["out"]] == [
        "experiments",
        "latest experiment 'cartpole'",
        "charts of its latest sweep 'sweep-test'",
    ], ui.seen
    port = int(ui.url("experiments").split(":")[2].split("/")[0])
    for _ in range(3):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30) as answer:
            assert answer.status == 200
    ui.quiet_for(3.0)
    ui.proc.send_signal(signal.SIGTERM)
    assert ui.proc.wait(timeout=60) == 0
    with socket.socket() as sock:  # the server went with pgcli: its port is free again
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
    assert sorted(p.name for p in workdir.iterdir()) == ["mlflow.py", "uvicorn.py"]  # nothing written there


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("needs Debian's chromium and chromium-driver: `make browser-deps` (CI installs them)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (the dev extra)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1500,950",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def test_a_browser_finds_the_sweeps_runs_and_its_eval_chart(ui: UI, browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def page_text(driver: Any = browser) -> str:
        return str(driver.find_element(By.TAG_NAME, "body").text)

    ui.wait_for("charts of its latest sweep")
    browser.get(ui.url("latest experiment 'cartpole'"))
    wait = WebDriverWait(browser, 120)
    wait.until(lambda d: "sweep-test" in page_text(d))
    # the model-training view: its runs table and side bar, not the GenAI one (Overview, Traces, Prompts & versions)
    assert "/runs?" in browser.current_url and "Model registry" in page_text()
    assert "Prompts & versions" not in page_text()
    # MLflow's assistant panel opens on a first visit and covers a quarter of the page: closed, as a user would
    browser.execute_script("window.localStorage.setItem('mlflow.assistant.panelOpen_v1', 'false')")
    browser.refresh()
    wait.until(lambda d: "sweep-test" in page_text(d))
    # the sweep is one row; its runs are nested under it
    expand = browser.find_element(By.XPATH, "//*[text()='sweep-test']/ancestor::*[@role='gridcell'][1]//button")
    browser.execute_script("arguments[0].click()", expand)
    wait.until(lambda d: "ppo-cartpole-s0" in page_text(d) and "ppo-cartpole-s1" in page_text(d))
    chart_mode = browser.find_element(By.CSS_SELECTOR, 'input[name="runs-view-mode"][value="CHART"]')
    browser.execute_script("arguments[0].click()", chart_mode)
    wait.until(lambda d: "eval/return_mean" in page_text(d))
    assert "compareRunsMode=CHART" in browser.current_url  # what the printed "its charts" URL opens directly
    # the eval/return_mean chart draws both runs: 2 runs x 5 evaluations as plotly markers
    points = ".js-plotly-plot .scatterlayer .trace path.point"
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, points)) == 10)
    assert "ppo-cartpole-s1 (eval/return_mean)" in page_text()  # the chart's legend names the runs
    shots = Path(os.environ.get("PGCLI_UI_SCREENSHOTS", tmp_path))  # kept for the docs when the variable is set
    shots.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(shots / "mlflow_sweep_charts.png"))


def test_the_printed_chart_link_opens_on_the_sweeps_learning_curves(ui: UI, browser: Any) -> None:
    """The sweep's parent logs no metrics and MLflow shows it collapsed: the printed link filters to its children,
    which the chart view then charts (no "No charts")."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    link = ui.wait_for("charts of its latest sweep 'sweep-test': ").split(": ", 1)[1].strip()
    browser.get(link)
    wait = WebDriverWait(browser, 120)
    points = ".js-plotly-plot .scatterlayer .trace path.point"
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, points)) == 10)  # 2 runs x 5 evaluations, untouched
    text = browser.find_element(By.TAG_NAME, "body").text
    # the two children listed flat, not the collapsed parent; the eval section holds one chart, which draws both
    assert "2 matching runs" in text and "sweep-test" not in text and "eval\n(1)" in text, text
    assert "ppo-cartpole-s0 (eval/return_mean)" in text and "ppo-cartpole-s1 (eval/return_mean)" in text
