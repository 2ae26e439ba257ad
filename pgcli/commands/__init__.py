"""One module per ``pgcli`` command, each with a ``main(args)`` that ``pgcli.cli`` dispatches to; ``report.py`` prints
what they raise as pgcli's one error line."""
