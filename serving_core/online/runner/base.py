"""What the service asks of the way its worker runs the model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from serving_core.context import Context
from serving_core.engine.watchdog import Watched
from serving_core.errors import NotReady


@dataclass(frozen=True)
class ClientWatch:
    """A waiting request's watch on its client (the gevent worker's): ``stop`` ends
    it; ``gone_now`` asks the connection, now, whether the client has hung up."""

    stop: Callable[[], None]
    gone_now: Callable[[], bool]


class Computed(NamedTuple):
    """An item's output and the size of the batch it ran in, for the access line (None:
    no batch to tell of, as a concurrent handler's call). A runner's holds the model's
    output; ``Service.compute``'s, the finished answer."""

    output: Any
    batch_size: int | None


# Given what withdraws a waiting request, starts watching its client (for a hang-up).
WatchGone = Callable[[Callable[[], None]], ClientWatch]


class Runner(Protocol):
    """Runs the model on one request's prepared item; the service does the rest
    (admission by deadline, validation, pre- and postprocessing, the cache)."""

    def start(self, warm_up: Callable[[], object] | None) -> None:
        """After fork. ``warm_up`` runs the handler's sample through the service,
        for a runner whose model runs in this worker; the others ignore it."""

    def stop(self, timeout_s: float) -> bool:
        """Refuse new requests and finish those in hand; False if they did not
        finish within ``timeout_s``."""

    def admit(self, deadline: float) -> None:
        """Raise now what ``run`` would raise at once for a request due by
        ``deadline`` (``Overloaded``, ``NotReady``); queues nothing."""

    def run(self, item: Any, ctx: Context, *, arrival: float, watch: WatchGone | None) -> Computed:
        """The model's output for ``item``, by ``ctx.deadline``; raises a ``ServingError``."""

    @property
    def started(self) -> bool:
        """Whether it takes requests (``start`` has run): until then the service
        answers that the model is not loaded yet."""

    @property
    def ready(self) -> bool:
        """Whether it can serve now (/readyz)."""

    @property
    def fault(self) -> str | None:
        """Why the model was given up in this worker (it hung or died), or None."""

    @property
    def model_thread(self) -> Watched | None:
        """The model thread the watchdog watches, where this worker has one."""

    def describe(self) -> dict[str, Any]:
        """What ``/metadata`` shows of the batching, beside the settings."""


class Unstarted:
    """The runner of a service whose worker has not started yet: it serves nothing."""

    started = False
    ready = False
    fault = None
    model_thread = None

    def start(self, warm_up: Callable[[], object] | None) -> None:
        raise RuntimeError("the service chooses a runner in start(); this one never starts")

    def stop(self, timeout_s: float) -> bool:
        return True

    def admit(self, deadline: float) -> None:
        raise not_loaded()

    def run(self, item: Any, ctx: Context, *, arrival: float, watch: WatchGone | None) -> Computed:
        raise not_loaded()

    def describe(self) -> dict[str, Any]:
        return {}


def not_loaded() -> NotReady:
    return NotReady("the model is not loaded yet; retry after /readyz answers 200")
