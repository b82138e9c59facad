"""Why a group of the table to predict has no model: it failed in training
(its task is in the run, and kept no model) or it was never trained (no
task of the run has its key). ``Store.predict`` (``Store.forecast``, an
mm.linear run's predict alike) says which of its groups are which, with
counts and a few keys of each, so that a NaN is traced to a failure to
look into or to a group the run never saw; and which of the groups a
fallback model answered had failed in training (a group never trained
going to the fallback is what a fallback is for: not said)."""

from __future__ import annotations

from typing import Any

from ..inputs.keys import TypedKeys, decode_key, encode_key

#: How many keys of each kind a message names.
SHOWN = 3


def failed_statuses(store: Any, run: int | None, by: list[str], run_keys: list[str]
                    ) -> dict[str, str] | None:
    """Encoded key (of the ``by`` columns) -> status of the groups of the
    run(s) ``store`` predicts with (``run``) whose task kept no model; None
    where the run's keys are other columns than ``by``."""
    statuses = store._keys_without_model(run)
    if list(by) != list(run_keys):  # a selection's groups: the run's keys projected
        if not set(by) <= set(run_keys):
            return None
        where = [run_keys.index(name) for name in by]
        statuses = {encode_key(tuple(decode_key(text)[i] for i in where)): status
                    for text, status in statuses.items()}
    return statuses


def failed_or_never(store: Any, run: int | None, by: list[str], run_keys: list[str],
                    unseen: list[Any]) -> tuple[list[tuple[Any, str]], list[Any]] | None:
    """The keys ``unseen`` (one value each for one ``by`` column, else
    tuples) with no model of the run(s) ``store`` predicts with (``run``),
    parted into those that failed in training, each with its task's status,
    and those never trained; None where the run's keys are other columns
    than ``by``. Reads the run's task blocks: call it only with keys."""
    statuses = failed_statuses(store, run, by, run_keys)
    if statuses is None:
        return None
    typed = TypedKeys(statuses)
    failed: list[tuple[Any, str]] = []
    never: list[Any] = []
    for key in unseen:
        status = typed.find((key,) if len(by) == 1 else tuple(key))
        if status is None:
            never.append(key)
        else:
            failed.append((key, status))
    return failed, never


def said_failed(failed: list[tuple[Any, str]]) -> str:
    """``"e.g. ['b'], status failed: see Store.results()"``."""
    kinds = sorted({status for _, status in failed})
    return (f"e.g. {[key for key, _ in failed[:SHOWN]]!r}, status {', '.join(kinds)}: "
            "see Store.results()")


def said_without_model(failed: list[tuple[Any, str]], never: list[Any]) -> str:
    """``"2 failed in training (e.g. ['b'], status failed: see
    Store.results()) and 1 was never trained, its key in no task of the run
    (e.g. ['z'])"``; ``""`` for no keys."""
    said = []
    if failed:
        said.append(f"{len(failed)} failed in training ({said_failed(failed)})")
    if never:
        said.append(f"{len(never)} {'was' if len(never) == 1 else 'were'} never trained, "
                    f"their keys in no task of the run (e.g. {never[:SHOWN]!r})")
    return " and ".join(said)


def without_model(store: Any, run: int | None, by: list[str], run_keys: list[str],
                  unseen: list[Any]) -> str:
    """``"2 failed in training (e.g. ['b'], status failed) and 1 was never
    trained (e.g. ['z'])"`` for the keys ``unseen`` (:func:`failed_or_never`);
    ``""`` where the run's keys are other columns than ``by``."""
    parted = failed_or_never(store, run, by, run_keys, unseen)
    return "" if parted is None else said_without_model(*parted)


def answered_by_fallback(store: Any, run: int | None, by: list[str], run_keys: list[str],
                         fallen: list[Any]) -> str:
    """``"3 groups failed in training and are answered by the fallback
    model: e.g. ['b', 'c', 'd'], status failed: see Store.results()"`` for
    those of the keys ``fallen`` (the groups whose rows the fallback model
    predicted) that failed in training, ``""`` where none did (a group never
    trained going to the fallback is what a fallback is for)."""
    parted = failed_or_never(store, run, by, run_keys, fallen) if fallen else None
    if not parted or not parted[0]:
        return ""
    return said_by_fallback(parted[0])


def said_by_fallback(failed: list[tuple[Any, str]], where: str = "") -> str:
    """``"3 groups failed in training and are answered by the fallback
    model: e.g. [...], status failed: see Store.results()"`` (``where``: a
    condition said after "answered", ``" where the table has rows of
    theirs"``)."""
    one = len(failed) == 1
    return (f"{len(failed)} group{'' if one else 's'} failed in training and "
            f"{'is' if one else 'are'} answered by the fallback model{where}: "
            f"{said_failed(failed)}")


def failed_to_fallback(store: Any, run: int | None, by: list[str], run_keys: list[str],
                       artifacts: dict[str, str]) -> str:
    """:func:`answered_by_fallback` for a table whose groups are not known
    before it is predicted (an engine's, run lazily): each group of the run
    that failed in training and has no model in ``artifacts`` (encoded key
    -> digest), said as answered where the table has rows of it; ``""``
    where none."""
    statuses = failed_statuses(store, run, by, run_keys)
    if not statuses:
        return ""
    modelled = TypedKeys(artifacts)
    failed = []
    for text, status in statuses.items():
        parts = decode_key(text)
        if modelled.find(parts) is None:
            failed.append((parts[0] if len(parts) == 1 else parts, status))
    return said_by_fallback(failed, " where the table has rows of theirs") if failed else ""

