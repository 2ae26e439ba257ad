"""The ``hardware`` group at run time: device and core placement, the spawned child processes, the worker watch."""
