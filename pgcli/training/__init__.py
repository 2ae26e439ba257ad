"""One training job: the composition root, the run's lifecycle, the monitor around the update loop."""
