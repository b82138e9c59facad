"""Every candidate's model of one group, kept by ``mm.halving(..., keep="all")``.

Successive halving runs a group's candidates in one task, whose one model
is, by default, the winner's. With ``keep="all"`` that model is a
:class:`Candidates`: each candidate fitted on all the group's rows (for an
ensemble, a second opinion, or a look at the losers), its setting and its
mean score, and which one won. It predicts (and a forecaster forecasts:
:func:`~manymodels.evaluation.horizons.horizon_call`) as its winner does,
so the store, ``Store.predict``, ``run.predict`` and ``run.forecast`` use
it unchanged.
"""

from __future__ import annotations

from typing import Any

#: The attributes a :class:`Candidates` holds itself (never the winner's).
_OWN = frozenset({"settings", "models", "scores", "winner", "metric"})


class Candidates:
    """One group's candidates, each fitted on all its rows, in the grid's order
    (of the run that trained them: a re-run of the grid reordered reuses them).

    ``settings[i]`` is candidate ``i``'s setting, ``models[i]`` its model
    (None where the candidate raised and left the race), ``scores[i]`` its
    mean ``metric`` over the windows it was scored on (NaN if none: halving
    with ``eta > 1`` drops candidates early, so the losers' means cover
    fewer windows than the winner's), ``winner`` the winner's index.
    ``predict`` and ``predict_proba`` are the winner's, and so is any other
    attribute read (``classes_``, ``coef_``...)."""

    def __init__(self, settings: list[dict[str, Any]], models: list[Any],
                 scores: list[float], winner: int, metric: str) -> None:
        self.settings, self.models, self.scores = settings, models, scores
        self.winner, self.metric = winner, metric

    @property
    def best(self) -> Any:
        """The winner's model."""
        return self.models[self.winner]

    def model(self, **setting: Any) -> Any:
        """The model of the candidate whose setting is ``setting``
        (``candidates.model(alpha=0.1)``); KeyError naming the settings
        there are when none is."""
        for i, own in enumerate(self.settings):
            if own == setting:
                return self.models[i]
        raise KeyError(f"no candidate has the setting {setting}; the settings are "
                       f"{self.settings}")

    def predict(self, *args: Any, **kwargs: Any) -> Any:
        return self.best.predict(*args, **kwargs)

    def predict_proba(self, *args: Any, **kwargs: Any) -> Any:
        return self.best.predict_proba(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # only what the instance lacks; never its own fields (not yet set
        # while it is unpickled) nor Python's protocol names
        if name in _OWN or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.best, name)

    def __repr__(self) -> str:
        return (f"Candidates({len(self.models)} candidates, winner "
                f"{self.settings[self.winner]} by {self.metric}: "
                f"{self.scores[self.winner]:.6g})")
