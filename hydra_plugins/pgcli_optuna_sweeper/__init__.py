"""pgcli's Hydra sweeper for Optuna (``hydra/sweeper=optuna``); see optuna_sweeper.py."""
