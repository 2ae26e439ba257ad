"""The statuses a run has in the store, named once: every module compares a run's status with these constants.

They are MLflow's own ``RunStatus`` names (docs/runs.md); pgcli writes no other. :data:`PRUNED` is pgcli's label in a
search's summary for a KILLED run an Optuna pruner stopped (its ``pruned`` tag), never stored as a status. This module
imports nothing: every layer may use it.
"""

from __future__ import annotations

from typing import Final

RUNNING: Final = "RUNNING"
"""Open: its process writes it, or died without ending it (``pgcli runs --stale``)."""
FINISHED: Final = "FINISHED"
"""Completed: trained its budget and wrote everything."""
FAILED: Final = "FAILED"
"""Ended by an error, or something could not be written (its ``error`` tag says what)."""
KILLED: Final = "KILLED"
"""Stopped by the user (a signal), a search's pruner, or ``pgcli runs --stale``."""
PRUNED: Final = "PRUNED"
"""A search summary's word for a KILLED run its pruner stopped (never a stored status)."""
RUN_STATUSES: Final = (FINISHED, FAILED, KILLED)
"""How a run can end in the store (docs/runs.md): completed, failed, or stopped by the user."""
