"""Inputs, the first step of the flow: what a run is given.

Task sources (``mm.groups``, ``mm.items``, ``mm.grid`` and their product),
the tables they read (pandas, polars, Arrow, Parquet and CSV files), the
readers a worker uses for its slice of them, and keys: how a group's key
is encoded, compared and found again. Nothing here knows of tasks or workers.
"""
