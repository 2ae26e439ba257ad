"""How a command's failure reaches the terminal: one line, ``pgcli: error: <message>`` (secrets redacted), and the exit
status of its error (:class:`~pgcli.errors.ConfigError` 2, any other :class:`~pgcli.errors.PgcliError` 1); a
traceback only when ``PGCLI_DEBUG=1`` asks for one.

``pgcli.cli.main`` reports what a command raises; a Hydra job (``pgcli.commands.train.run_train``) reports its own,
since Hydra would print it with a traceback.
"""

from __future__ import annotations

import os
import sys

from pgcli.errors import PgcliError


def report_error(exc: PgcliError) -> int:
    """Print ``exc`` as pgcli's one error line on stderr; returns its exit status."""
    from pgcli.redact import redact_text

    print(f"pgcli: error: {redact_text(str(exc))}", file=sys.stderr)
    return exc.exit_code


def debug_requested() -> bool:
    """``PGCLI_DEBUG=1`` (or Hydra's ``HYDRA_FULL_ERROR=1``): show tracebacks instead of one-line errors."""
    return any(os.environ.get(name, "") not in ("", "0") for name in ("PGCLI_DEBUG", "HYDRA_FULL_ERROR"))


def unexpected_error(exc: BaseException) -> PgcliError:
    """An exception pgcli did not foresee as a one-line PgcliError (exit 1) naming its type and first line."""
    lines = str(exc).strip().splitlines()
    return PgcliError(f"{type(exc).__name__}: {lines[0] if lines else ''} (PGCLI_DEBUG=1 for the traceback)")
