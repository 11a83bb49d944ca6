"""The master's preload before fork, the one every preloading command runs.

``serve``, ``worker`` and ``batch`` each set the handler up once in their
master and fork workers that share the loaded model. All three run the same
steps, in this order, after the handler's module is imported:

1. cap torch at one thread: a handler that imports torch at module level
   (``handlers/minilm``) computes in ``setup()`` on one thread, so no OpenMP
   pool exists at fork (a forked child hangs on its first parallel
   operation on its main thread; ``serving_core.threads``);
2. ``setup()``: the model is loaded once;
3. cap torch again: a handler may import torch only in ``setup()``, or a
   library may raise its threads there;
4. ``gc.collect()``: the garbage ``setup()`` left is freed now, instead of
   frozen (and kept) for the life of every process;
5. ``gc.freeze()``: the loaded objects are never freed, so the collector in
   each forked process must not touch (and so copy) their pages.

The import itself is the caller's (``serving_core.loading``): each command
reports a broken handler as a configuration error before its own checks, and
``batch`` opens its output before a model loads. Capping before the import
would change nothing, since torch is not imported yet.
"""

from __future__ import annotations

import gc

from serving_core.handler import Handler
from serving_core.threads import limit_master_threads


def preload(handler: Handler) -> None:
    """Set ``handler`` up in this (master) process, ready to be shared by forked workers.

    Raises whatever ``setup()`` raises; each command says so with the handler's file.
    """
    limit_master_threads()
    handler.setup()
    limit_master_threads()
    gc.collect()
    gc.freeze()
