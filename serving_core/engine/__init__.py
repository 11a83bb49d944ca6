"""The handler over items, the batcher that feeds it, its policy, cost model and watchdog."""
