"""``Forecast``: when a generation that waits to join would have its first chunk, from
what the decoder has measured. Admission refuses a request whose first chunk it
predicts past the request's deadline."""

from __future__ import annotations

# How fast the measured step and hold times follow a change (an EWMA's weight).
LEARN = 0.2


class Forecast:
    def __init__(self, max_running: int) -> None:
        self.max_running = max_running
        self.step_s = 0.0  # a step's measured duration
        self.held_s = 0.0  # how long a generation holds its place, measured

    def stepped(self, took_s: float) -> None:
        self.step_s = _learn(self.step_s, took_s)

    def held(self, held_s: float) -> None:
        self.held_s = _learn(self.held_s, held_s)

    def first_chunk_s(self, place: int, running: int) -> float:
        """When the ``place``-th waiting generation would have its first chunk, with
        ``running`` generations in the steps: a step if a place is free for it, else
        when enough of those are predicted to end."""
        free = self.max_running - running
        if place <= free:
            return self.step_s
        behind = place - max(free, 0)
        return behind * self.held_s / self.max_running + self.step_s


def _learn(mean: float, sample: float) -> float:
    return sample if mean == 0.0 else mean + LEARN * (sample - mean)
