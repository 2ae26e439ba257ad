"""Environments: the one vector-env builder, normalisation, env state, spec checks, the worker vector envs."""
