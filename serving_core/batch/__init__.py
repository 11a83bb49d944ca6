"""``serving-core batch``: records in (files or SQL), the handler over them in a pool, out."""
