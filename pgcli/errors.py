"""User-facing errors: printed as one line by the CLI, never with a traceback."""

import argparse
from typing import NoReturn


class PgcliError(Exception):
    """Base class of the errors a user can fix; the CLI prints ``pgcli: error: <message>`` and exits non-zero."""

    exit_code = 1


class ConfigError(PgcliError, ValueError):
    """A config value breaks a rule. Raised before any env or MLflow run exists; exit status 2."""

    exit_code = 2


class DivergenceError(PgcliError):
    """Training produced a non-finite loss, gradient, parameter or observation.

    Raised by the trainers' once-per-update checks (``pgcli.algo.guard``; docs/checkpoints.md, "Divergence guard")
    before the bad state reaches a checkpoint, so the last checkpoint on disk is the last good one; the run ends FAILED.
    """

    def __init__(self, quantity: str, step: int, value: str, last_checkpoint: str | None = None) -> None:
        self.quantity, self.step, self.value, self.last_checkpoint = quantity, step, value, last_checkpoint
        where = f"last good checkpoint: {last_checkpoint}" if last_checkpoint else "no checkpoint was written yet"
        super().__init__(f"non-finite {quantity} at env step {step} ({value}); {where}")


class CommandParser(argparse.ArgumentParser):
    """``argparse`` for pgcli's commands: a bad option is a one-line ConfigError (exit 2), not usage + error."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{message} (see {self.prog} --help)")
