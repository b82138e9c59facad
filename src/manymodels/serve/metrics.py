"""``GET /metrics``: the server's counters in the Prometheus text format
(version 0.0.4), kept by hand (a few counters need no client library).
Each server process keeps its own: with ``--workers W`` a scrape reads the
process that answered it."""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict
from typing import Any

#: Latency buckets, in seconds (the histogram's ``le``).
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
#: A cold load's buckets: a small packed model loads in tens of microseconds.
LOAD_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1,
                1.0, 10.0)


class _Histogram:
    def __init__(self, buckets: tuple[float, ...] = BUCKETS) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, seconds)] += 1
        self.total += seconds

    def lines(self, name: str, labels: str) -> list[str]:
        out, running = [], 0
        for bound, count in zip((*map(str, self.buckets), "+Inf"), self.counts):
            running += count
            out.append(f'{name}_bucket{{{labels}{"," if labels else ""}le="{bound}"}} '
                       f"{running}")
        braces = f"{{{labels}}}" if labels else ""
        out.append(f"{name}_sum{braces} {self.total:.6f}")
        out.append(f"{name}_count{braces} {running}")
        return out


class Metrics:
    """Requests and errors by route, latency, model loads and reloads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = defaultdict(int)
        self.latency: dict[str, _Histogram] = defaultdict(_Histogram)
        self.loads = _Histogram(LOAD_BUCKETS)
        self.reloads = self.reload_errors = 0

    def request(self, route: str, status: int, seconds: float) -> None:
        with self._lock:
            self.requests[(route, status)] += 1
            self.latency[route].observe(seconds)

    def load(self, seconds: float) -> None:
        with self._lock:
            self.loads.observe(seconds)

    def text(self, cache: dict[str, int], catalog: Any) -> str:
        """The exposition: ``cache`` is :meth:`ModelCache.stats`, ``catalog``
        the one served."""
        lines = ["# HELP manymodels_serve_requests_total Requests answered, by route and "
                 "status code.", "# TYPE manymodels_serve_requests_total counter"]
        with self._lock:
            requests = sorted(self.requests.items())
            latency = sorted(self.latency.items())
            errors: dict[str, int] = defaultdict(int)
            for (route, status), count in requests:
                lines.append(f'manymodels_serve_requests_total{{route="{route}",'
                             f'code="{status}"}} {count}')
                if status >= 400:
                    errors[route] += count
            lines += ["# HELP manymodels_serve_errors_total Requests answered with a status "
                      "of 400 or more, by route.", "# TYPE manymodels_serve_errors_total counter"]
            lines += [f'manymodels_serve_errors_total{{route="{route}"}} {count}'
                      for route, count in sorted(errors.items())]
            lines += ["# HELP manymodels_serve_request_seconds Time to answer a request.",
                      "# TYPE manymodels_serve_request_seconds histogram"]
            for route, histogram in latency:
                lines += histogram.lines("manymodels_serve_request_seconds", f'route="{route}"')
            lines += ["# HELP manymodels_serve_model_load_seconds Time to read, check and "
                      "unpickle a model on its first use (a cold load).",
                      "# TYPE manymodels_serve_model_load_seconds histogram",
                      *self.loads.lines("manymodels_serve_model_load_seconds", "")]
            reloads, reload_errors = self.reloads, self.reload_errors
        counters = [("cache_hits_total", "counter", "Requests for a model found in the cache.",
                     cache["hits"]),
                    ("cache_misses_total", "counter", "Models loaded from the store.",
                     cache["misses"]),
                    ("cache_evictions_total", "counter", "Models dropped from the cache.",
                     cache["evictions"]),
                    ("models_held", "gauge", "Models in the cache.", cache["models"]),
                    ("bytes_held", "gauge", "Stored bytes of the models in the cache.",
                     cache["bytes"]),
                    ("models_served", "gauge", "Groups with a model in the run served.",
                     catalog.models),
                    ("catalog_bytes", "gauge", "Bytes of the catalog of group key -> model.",
                     catalog.keys.nbytes if catalog.keys is not None else 0),
                    ("run_id", "gauge", "The run served (the latest that has ended, or --run).",
                     catalog.run_id),
                    ("reloads_total", "counter", "Times a new state of the store was served.",
                     reloads),
                    ("reload_errors_total", "counter", "Reloads that failed (the previous "
                     "models kept serving).", reload_errors)]
        for name, kind, help_text, value in counters:
            lines += [f"# HELP manymodels_serve_{name} {help_text}",
                      f"# TYPE manymodels_serve_{name} {kind}", f"manymodels_serve_{name} {value}"]
        return "\n".join(lines) + "\n"
