"""How one worker runs the model for its requests, chosen once when the worker starts.

- ``local``: the worker's own model thread, fed by its batcher (the default);
- ``shared``: the shared model process of its GPU, over a Unix socket
  (``SERVING_MODEL_PROCESS=shared``);
- ``concurrent``: in the request itself, at most ``SERVING_MAX_QUEUE`` at once
  (a handler that says ``concurrent = True``, such as a pipeline).

``base`` says what the service asks of each (``Runner``); ``queued`` is what the
first two share: a queue in front of the model, and a request that waits on
its future until its deadline.
"""
