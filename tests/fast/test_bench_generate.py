"""`sapo bench generate` on the shipped seed model: HF and llama.cpp side by side, the table and JSON."""

from __future__ import annotations

import json
from pathlib import Path

from lab.bench import generate


def test_generate_bench_runs_both_generators_on_the_seed(tmp_path: Path) -> None:
    result = generate.run(out_dir=tmp_path, models=("seed",), repeats=2, e2e_rounds=0)
    g = result["models"]["seed"]["generate"]
    assert result["models"]["seed"]["weights"] == "f32"  # full fine-tuning: exact copies of torch's weights
    for name in ("hf", "llamacpp"):
        assert len(g[name]["runs"]) == 2 and g[name]["tokens_per_s"] > 0
    assert g["llamacpp"]["speedup"] > 0 and {r["kv_layout"] for r in g["llamacpp"]["runs"]} <= {"split", "unified"}
    assert g["llamacpp"]["logprob_agreement"]["mean_abs"] < 0.01  # f32 weights: llama.cpp samples torch's policy
    assert set(g["llamacpp"]["layout_tokens_per_s"]) == {"split@4", "split@64", "unified@64"}  # warm-up, 2 repeats
    saved = json.loads((tmp_path / "generate.json").read_text())
    assert saved["models"]["seed"]["generate"]["llamacpp"]["speedup"] == g["llamacpp"]["speedup"]
    table = (tmp_path / "generate.md").read_text()
    assert "| seed | 48 | HF generate |" in table and "| seed | 48 | llama.cpp | f32," in table


def test_cpu_round_bench_trains_every_completion_in_each_configuration(tmp_path: Path) -> None:
    from lab.bench import cpu_round

    result = cpu_round.run(out_dir=tmp_path, model="seed", rounds=1, max_new_tokens=16)
    assert set(result["configs"]) == {"hf-fp32", "llamacpp-fp32", "llamacpp-bf16"}
    for c in result["configs"].values():
        assert c["rounds"][0]["rows_trained"] == 64 and c["median"]["update"] > 0  # alternating rewards
    table = (tmp_path / "cpu_round.md").read_text()
    assert "| llamacpp-bf16 |" in table and "1.00x" in table
