"""What ``pgcli runs`` shows beyond the runs' records (:class:`~pgcli.tracking.store.RunRecord` keeps each metric's
latest value, not its step): each run's last logged step and each experiment's name, a few queries per listing
however many runs it shows."""

from __future__ import annotations

from collections.abc import Sequence

from pgcli.tracking.client import with_retry
from pgcli.tracking.store import RunRecord, RunStore

IDS_PER_QUERY = 100
"""Run ids per ``attributes.run_id IN (...)`` search: keeps each filter string and page small."""


def experiment_names(store: RunStore) -> dict[str, str]:
    """Experiment id -> name, for the experiments of ``store`` (the ones :meth:`RunStore.experiment_ids` lists)."""
    if store.reader is not None:
        return dict(store.reader.experiments())
    return {str(e.experiment_id): e.name for e in with_retry(store.client.search_experiments)}


def last_steps(store: RunStore, records: Sequence[RunRecord]) -> dict[str, int]:
    """Run id -> the run's last logged step: the largest step among its metrics' latest points (MLflow keeps the
    latest point of each metric with its step). Runs that logged no metric are left out."""
    if store.reader is not None:
        return store.reader.last_steps([r.run_id for r in records])
    found: dict[str, int] = {}
    for i in range(0, len(records), IDS_PER_QUERY):
        chunk = records[i : i + IDS_PER_QUERY]
        ids = ", ".join(f"'{r.run_id}'" for r in chunk)
        runs = with_retry(
            store.client.search_runs,
            sorted({r.experiment_id for r in chunk}),
            filter_string=f"attributes.run_id IN ({ids})",
            max_results=len(chunk),
        )
        for run in runs:
            points = run.data.to_proto().metrics
            if points:
                found[run.info.run_id] = max(int(m.step) for m in points)
    return found
