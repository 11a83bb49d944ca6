"""Processes: the gunicorn app and its hooks, workers, drain and recycle, the job-worker master."""
