"""The inference cache: its key, its store (memory or Redis) and the cache over a handler."""
