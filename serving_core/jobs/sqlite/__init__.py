"""The SQLite job queue: one WAL file at SERVING_JOBS_PATH, shared by one machine's processes."""
