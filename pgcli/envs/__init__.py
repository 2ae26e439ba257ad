"""Environments: the one vector-env builder, normalisation, episode state for checkpoints, env ids and wrappers, and
the vector envs that step half their sub-envs in a worker process."""
