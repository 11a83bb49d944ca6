"""The consumers' loops: what a forked consumer of ``serving-core worker`` or ``stream`` runs.

``jobs`` (``JobLoop``: take jobs, run, store), ``stream`` (``StreamLoop``: take
messages, run, publish, then ack; ``inflight``: its ends and batches in hand),
``leases`` (``LeaseRenewer``: a job consumer's renewals) and ``isolation`` (a model
failure's items run again alone, for both).
``process`` forks the consumers; these run in them, over the engine, a job queue
or a broker's ends. Imports no Flask, gunicorn or gevent.
"""
