"""Prometheus metrics, correct across gunicorn workers.

- ``metrics``: the service's metrics (``Metrics``), the batcher's and the cache's observer;
- ``tally``: the model thread's histograms, added up in memory between writes;
- ``directory``: prometheus-client's multiprocess mode, the files every process
  writes and ``/metrics`` sums;
- ``archive``: a dead worker's counts folded into one file, so they stay counted;
- ``stream``: `serving-core stream`'s counts (consumed, published, dead letters) and lag.
"""
