"""Inputs, the first step of the flow: what a run is given.

Task sources (``mm.groups``, ``mm.items``, ``mm.grid`` and their product),
the tables they read (pandas, polars, Arrow, Parquet and CSV files), the
readers a worker uses for its slice of them, and keys: how a group's key
is encoded, compared and found again. It imports nothing of the planner or
the engine: a worker's reader is opened, and handed each batch's data
references, by the task data of :mod:`manymodels.planning.taskdata`.
"""
