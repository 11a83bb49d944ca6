"""Payload logging: a sampled copy of requests and their answers, sent as CloudEvents to a
sink (a broker or an HTTP endpoint) from one thread per worker, never in a request's way."""
