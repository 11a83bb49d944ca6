"""Processes: the gunicorn app and its hooks, workers, drain and recycle; the masters
of ``worker`` and ``stream``, whose forked consumers run a loop of ``loops``."""
