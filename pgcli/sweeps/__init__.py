"""Sweeps: a parent MLflow run with nested children, and Optuna searches."""
