"""The chart fixture for every module here (tests/deploy/chart.py loads it)."""

from __future__ import annotations

from tests.deploy.chart import chart

__all__ = ["chart"]
