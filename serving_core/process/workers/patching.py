"""gevent's monkey-patching of a worker, with the ``ssl`` names taken before it.

A worker is patched after fork, and the master imported what the app needs
before it: redis-py and urllib3 (a pipeline's stages, the payload log's HTTP
sink) among them. Those import ``ssl``, and urllib3 and ``redis.asyncio`` bind
``SSLContext`` by name (``from ssl import SSLContext``). Patching replaces the
``ssl`` module's attributes only, so those names kept the blocking class: an
HTTPS call from a request greenlet would block the whole worker while it
waits, and gevent warns of it at every worker start (``MonkeyPatchWarning:
Monkey-patching ssl after ssl has already been imported``). So the names
bound before the patch are bound again to gevent's, and the warning, whose
hazard is then gone, is not shown.
"""

from __future__ import annotations

import sys
import warnings
from types import ModuleType
from typing import Any

from gevent import monkey

# The ssl names a module may have taken with ``from ssl import ...``.
_NAMES = ("SSLContext", "SSLSocket", "SSLObject", "create_default_context", "wrap_socket")


def patch_worker() -> None:
    """``monkey.patch_all`` as the gevent worker wants it (``threading`` left native:
    ``green`` says why), then the ssl names bound before it rebound."""
    ssl: ModuleType | None = sys.modules.get("ssl")
    before = {name: getattr(ssl, name) for name in _NAMES if hasattr(ssl, name)}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Monkey-patching ssl after ssl")
        monkey.patch_all(thread=False, subprocess=False)
    if ssl is not None:
        _rebind(before, {name: getattr(ssl, name) for name in before})


def _rebind(before: dict[str, Any], after: dict[str, Any]) -> None:
    stale = {id(old): after[name] for name, old in before.items() if after[name] is not old}
    if not stale:
        return
    for module in list(sys.modules.values()):
        # sys.modules may hold objects that are not modules (Cython puts its
        # ``cython.parallel`` stand-in there, with no ``__name__``): only modules bind.
        if not isinstance(module, ModuleType):
            continue
        if str(getattr(module, "__name__", "")).startswith(("ssl", "gevent")):
            continue
        for attribute, value in list(vars(module).items()):
            patched = stale.get(id(value))
            if patched is not None:
                setattr(module, attribute, patched)
