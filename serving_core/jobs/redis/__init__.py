"""The Redis Streams job queue (a ``redis://``, ``rediss://`` or ``unix://`` SERVING_JOBS_URL)."""
