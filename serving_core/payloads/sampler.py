"""Which exchanges are logged: a fraction picked by request id, and every error.

The pick is a function of the request id alone (the first 8 bytes of its
SHA-256 as a fraction of 2**64, logged when under the rate), not a coin toss:
every worker, every replica and a test pick the same ids, and a request that
a client retries with its ``X-Request-ID`` is logged every time or never.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

_SPAN = float(1 << 64)


def fraction(request_id: str) -> float:
    """Where ``request_id`` falls in [0, 1), uniformly over ids."""
    digest = hashlib.sha256(request_id.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") / _SPAN


@dataclass(frozen=True, slots=True)
class Sampler:
    rate: float  # SERVING_PAYLOAD_LOG_RATE: 0 logs no answer, 1 every one
    errors: bool = True  # SERVING_PAYLOAD_LOG_ERRORS: every error, whatever the rate

    def picks(self, request_id: str, *, failed: bool = False) -> bool:
        if failed and self.errors:
            return True
        if self.rate >= 1.0:
            return True
        return self.rate > 0.0 and fraction(request_id) < self.rate
