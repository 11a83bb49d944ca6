"""The shared model process: one process owns the model (and the GPU); every worker feeds it.

    master   preload: import the handler, ``setup()`` (weights on the CPU, shared by
             fork; nothing touches CUDA here) → fork the HTTP workers, and
             ``supervisor.ModelProcess`` forks the model process; a watcher thread
             forks it again whenever it dies
    model    ``main.run_model_process``: ``setup_worker()`` (the handler moves its
             model to the device: CUDA is initialised here only) → a ``Batcher``
             over the ``Engine``, with the same policy, admission and deadlines as a
             worker's → the sample as warm-up → listen on a Unix socket: one I/O
             thread (``server``) reads and writes every worker's connection
    worker   validate and ``preprocess`` (tokenising) in the request, as always →
             ``client.RemoteBatcher.submit`` queues the prepared item on a
             ``link.Link``, which sends what is queued as one frame → its reader
             resolves the request's future with the model's output →
             ``postprocess`` here

SERVING_MODEL_PROCESS=shared. Per-worker (the default on CPU) gives each worker
its own model thread; on a GPU that means a CUDA context and a model copy per
worker, time-slicing the card into small, slow batches. Here one batcher sees
every worker's requests, so batches are as large as the load allows.

``protocol`` is what crosses the socket. Why not gunicorn's dirty arbiter
(gunicorn 25+, a process pool for models): its client runs one call at a time
per connection, through the arbiter process and then a dirty worker (two
hops), so a worker could not keep the many requests in flight that batching
across workers needs.

If the model process dies, each worker fails its requests in flight with 503
``not_ready``, its ``/readyz`` turns 503, and it reconnects when the watcher
has forked a new one. A layer of its own, between the request paths that use
it (``online``; the process layer starts it) and the ``engine`` it runs:
nothing here imports Flask, gunicorn or gevent (``runtime`` says how to wait).
"""
