"""Observation, beside the flow: watching a run as it goes and after.

The progress bar, callbacks, the MLflow tracker, the HTML report and the
live dashboard. They read the engine's events and the store; nothing in the
flow below imports them: the run layer hands them in.
"""
