"""The shared workload of the benchmarks: short English sentences, as an embedding service sees."""

from __future__ import annotations

import itertools

_SUBJECTS = [
    "Paris",
    "The new library",
    "A small transformer",
    "Our support team",
    "The quarterly report",
    "This recipe",
    "The river near the old mill",
    "Every request to the service",
]
_PREDICATES = [
    "is the capital of France.",
    "opens at nine in the morning on weekdays.",
    "turns each sentence into a vector of 384 numbers.",
    "answers most questions within a day.",
    "shows revenue growing faster than costs this year.",
    "needs two eggs, flour, butter and a pinch of salt.",
    "floods almost every spring after the snow melts.",
    "is answered in a few milliseconds when the cache is warm.",
]

SENTENCES = [f"{s} {p}" for s, p in itertools.product(_SUBJECTS, _PREDICATES)]
