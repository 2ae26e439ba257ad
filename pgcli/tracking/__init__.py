"""Experiment tracking: MLflow behind one logger interface; the only package that imports mlflow."""
