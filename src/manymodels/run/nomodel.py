"""Why a group of the table to predict has no model: it failed in training
(its task is in the run, and kept no model) or it was never trained (no
task of the run has its key). ``Store.predict`` says which of its groups
are which, with counts and a few keys of each, so that a NaN is traced to
a failure to look into or to a group the run never saw."""

from __future__ import annotations

from typing import Any

from ..inputs.keys import TypedKeys, decode_key, encode_key

#: How many keys of each kind a message names.
SHOWN = 3


def without_model(store: Any, run: int | None, by: list[str], run_keys: list[str],
                  unseen: list[Any]) -> str:
    """``"2 failed in training (e.g. ['b'], status failed) and 1 was never
    trained (e.g. ['z'])"`` for the keys ``unseen`` (one value each for one
    ``by`` column, else tuples) of the run(s) ``store`` predicts with
    (``run``); ``""`` where the run's keys are other columns than ``by``."""
    statuses = store._keys_without_model(run)
    if list(by) != list(run_keys):  # a selection's groups: the run's keys projected
        if not set(by) <= set(run_keys):
            return ""
        where = [run_keys.index(name) for name in by]
        statuses = {encode_key(tuple(decode_key(text)[i] for i in where)): status
                    for text, status in statuses.items()}
    typed = TypedKeys(statuses)
    failed: list[tuple[Any, str]] = []
    never: list[Any] = []
    for key in unseen:
        status = typed.find((key,) if len(by) == 1 else tuple(key))
        if status is None:
            never.append(key)
        else:
            failed.append((key, status))
    said = []
    if failed:
        kinds = sorted({status for _, status in failed})
        said.append(f"{len(failed)} failed in training (e.g. "
                    f"{[key for key, _ in failed[:SHOWN]]!r}, status {', '.join(kinds)}: "
                    "see Store.results())")
    if never:
        said.append(f"{len(never)} {'was' if len(never) == 1 else 'were'} never trained, "
                    f"their keys in no task of the run (e.g. {never[:SHOWN]!r})")
    return " and ".join(said)
