"""The lab: benchmarks (`lab.bench`) and experiments (`lab.experiment`) that measure the product.

It lives beside `engine/` and `app/` and never ships: the bundle collects only those two. Benches use the
engine's public surface, and above all the node's own round step (`engine.sapo.step`), so each result
measures the code a contributor runs. `sapo bench` and `sapo experiment` appear in a source checkout.
"""

from __future__ import annotations

from engine.paths import REPO_ROOT

BENCH_DIR = REPO_ROOT / "bench"  # results: JSON + markdown + plot per bench, committed
