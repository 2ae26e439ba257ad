"""pgcli: a command-line experiment runner for policy-gradient reinforcement learning."""

__version__ = "0.1.0"
