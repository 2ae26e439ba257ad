"""One module per ``pgcli`` command (``pgcli.cli`` dispatches to them)."""
