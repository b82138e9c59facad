"""The run, the last step of the flow: what ``mm.train`` wires.

The runner (:mod:`.runner`) validates the options, plans, hashes, opens the
store's run, starts the backend and hands the plan to the scheduler; the
:class:`~.results.Run` is what comes back; prediction (:mod:`.prediction`)
runs its own jobs through the runner; and the public ``mm.Store``
(:mod:`.store`) adds prediction and linear runs to the store below.
"""
