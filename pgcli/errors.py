"""User-facing errors: printed as one line by the CLI, never with a traceback."""

import argparse
from typing import NoReturn


class PgcliError(Exception):
    """Base class of the errors a user can fix; the CLI prints ``pgcli: error: <message>`` and exits non-zero."""

    exit_code = 1


class ConfigError(PgcliError, ValueError):
    """A config value breaks a rule. Raised before any env or MLflow run exists; exit status 2."""

    exit_code = 2


class CommandParser(argparse.ArgumentParser):
    """``argparse`` for pgcli's commands: a bad option is a one-line ConfigError (exit 2), not usage + error."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{message} (see {self.prog} --help)")
