"""Sleeps ``sleep_s`` seconds, then answers: the nginx tests make the app answer 503 and 504."""

from __future__ import annotations

import time
from typing import Any

from serving_core import Handler


class Sleeper(Handler):
    name = "nginx-slow"

    def predict(self, params: dict[str, Any]) -> dict[str, Any]:
        sleep_s = float(params.get("sleep_s", 0))
        time.sleep(sleep_s)
        return {"slept_s": sleep_s}
