"""Trainers: one module per algorithm (``sb3.py`` adapts SB3). Importing this package imports nothing heavy."""
