"""Asynchronous jobs: the record and queue types, the SQLite and Redis queues, liveness."""
