"""Runs across seeds, aggregated for ``pgcli compare`` (:mod:`pgcli.commands.compare`): which runs are seeds of one
experiment (:mod:`.groups`), their curves and final values with bootstrap intervals (:mod:`.stats`), and the table
and plot (:mod:`.report`). Nothing here reads a store or imports MLflow."""
