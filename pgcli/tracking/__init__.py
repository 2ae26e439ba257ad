"""Experiment tracking: MLflow behind one logger interface; the only package that imports mlflow.

- ``logger``: :class:`MetricLogger` (what trainers see) and :class:`RunLogger` (a training run's logger);
- ``reports``: ``metrics.csv`` and ``learning_curve.png`` from the metric history;
- ``backend``: :class:`MLflowBackend`, the batched MLflow writer of one run;
- ``spool`` / ``sync``: writes a tracking server could not take, kept and delivered later (``pgcli sync``);
- ``models``: a saved agent packaged as an MLflow Model (loader: ``pgcli.pyfunc``);
- ``store``: :class:`RunStore`, every reader of stored runs, and the read-only check before opening one;
- ``uri``: where runs go, and the store and server facts found without MLflow;
- ``client``: retries, quiet logs and experiments, shared by every MLflow call.
"""
