"""Serving: every group's model of a store behind one HTTP endpoint.

It sits at the top of the flow, beside ``api``, ``transforms`` and
``sklearn``, above ``run``: it reads the store as ``Store.predict`` does
(:mod:`manymodels.run.prediction` routes each row,
:mod:`manymodels.run.grouppredictor` calls each model),
and answers requests side by side: a quick one inline on the event loop, the
others in Starlette's thread pool, each pinning the models it was checked
against. ``catalog`` says which model answers each key, read from the store
once per run that ends (its keys and model locators in Arrow columns,
``keytable``); ``cache`` holds the models in use, loaded on first use and
bounded by count and bytes; ``predictor`` takes a request's rows through
them; ``requests`` reads and writes the bodies (JSON, Arrow IPC, whose
decoded size ``ipcsize`` reads before decoding); ``state`` swaps in a new
catalog when a run ends; ``metrics`` is ``/metrics``; ``app`` is the
Starlette application (``mm.serve_app``) that ``manymodels serve`` runs
under uvicorn, with the predict route answered in raw ASGI ahead of its
routing (``fastpath``); ``ray`` is a Ray Serve deployment with the same
models.
"""
