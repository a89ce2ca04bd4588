"""The node's store: one SQLite file of rounds, evals, rollouts, peers and sources.

    store   Store: reads and writes (StoreError when refused)
    schema  its tables, columns and migrations
"""

from engine.store.store import PHASES, ROUND_METRICS, SOURCE_METRICS, Store, StoreError

__all__ = ["PHASES", "ROUND_METRICS", "SOURCE_METRICS", "Store", "StoreError"]
