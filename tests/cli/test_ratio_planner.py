"""`swajax plan --workload`: the sweep (with injected runs, fast) and, with the null-model engine
and the step-time model, the planned ratio against one pool on the built-in workloads (slow)."""

import json

import pytest

from swajax import sizing
from swajax.cli.args import model_cost
from swajax.presets import hf_preset, load_preset
from swajax.simulator import ratio_planner
from swajax.simulator.ratio_planner import Candidate, corrected_min_ratio, mean_sequence_length
from swajax.simulator.step_time import ACCELERATORS, StepTimeModel
from swajax.simulator.workloads import make_workload

BUDGET = sizing.gib_to_bytes(16)


def _timer(preset):
    return StepTimeModel(load_preset(preset), model_cost(hf_preset(preset)), ACCELERATORS["h200"])


def test_sweep_starts_at_the_corrected_minimum_and_picks_the_fastest():
    cfg = load_preset("gpt-oss-120b")
    factory = lambda: make_workload("long-context", 8, 0)  # noqa: E731
    seen = []

    def fake(ratio, chunk):  # throughput peaks at 0.3; one pool is slowest
        seen.append((ratio, chunk))
        speed = 50.0 if ratio is None else 100 - 100 * abs(ratio - 0.3)
        return Candidate(ratio, chunk, speed, 1.0, 0.01, 4, 100)

    p = ratio_planner.plan(
        cfg, BUDGET, factory, _timer("gpt-oss-120b"), chunks=(2048, 8192), run_fn=fake
    )
    floor = max(
        corrected_min_ratio(
            cfg, BUDGET, mean_len=mean_sequence_length(factory()), chunk=c, page_size=16
        )
        for c in (2048, 8192)
    )
    assert p.min_ratio == floor
    hybrid = [r for r, _ in seen if r is not None]
    assert min(hybrid) >= floor and 1.0 in hybrid and 0.3 in hybrid
    assert (p.best.ratio, p.single.ratio, p.sglang_default.ratio) == (0.3, None, 0.8)
    assert {c for _, c in seen} == {2048, 8192}
    text = ratio_planner.format_plan(p)
    assert "planned ratio 0.3" in text and "2.00x one pool" in text


def test_a_closed_loop_plan_picks_by_throughput_up_to_the_last_send():
    """`loaded`: the plan maximises throughput up to the last request sent (the drain after it
    dilutes every ratio alike), and says so; without it, over the whole run."""
    cfg = load_preset("gpt-oss-120b")
    factory = lambda: make_workload("reasoning", 8, 0)  # noqa: E731

    def fake(ratio, chunk):  # whole-run throughput peaks at 0.8, loaded at 0.2
        whole = 50.0 if ratio is None else 100 - 10 * abs(ratio - 0.8)
        loaded = 40.0 if ratio is None else 200 - 100 * abs(ratio - 0.2)
        return Candidate(ratio, chunk, whole, 1.0, 0.01, 4, 100, loaded)

    timer = _timer("gpt-oss-120b")
    assert ratio_planner.plan(cfg, BUDGET, factory, timer, run_fn=fake).best.ratio == 0.8
    p = ratio_planner.plan(cfg, BUDGET, factory, timer, run_fn=fake, loaded=True)
    assert p.best.ratio == 0.2 and p.by == "loaded_tokens_per_s"
    text = ratio_planner.format_plan(p)
    assert "loaded tokens/s" in text and "5.00x one pool" in text


def test_plan_cli_with_clients_runs_a_closed_loop(cli):
    code, out, _ = cli(
        "plan",
        "--preset",
        "tiny-hybrid",
        "--kv-budget-gib",
        "0.002",
        "--workload",
        "shared-prefix",
        "--requests",
        "8",
        "--clients",
        "2",
        "--accelerator",
        "h200",
        "--page-size",
        "4",
        "--json",
    )
    assert code == 0
    p = json.loads(out)
    assert p["by"] == "loaded_tokens_per_s"
    for c in (*p["candidates"], p["single"]):
        assert c["peak_concurrency"] == 2 and c["loaded_tokens_per_s"] > 0


def test_plan_cli_names_what_it_needs(cli, tmp_path):
    code, _, err = cli(
        "plan", "--preset", "gpt-oss-120b", "--kv-budget-gib", "16", "--workload", "multi-turn"
    )
    assert code == 2 and "give --accelerator" in err
    unbuilt = tmp_path / "config.json"  # attention fields plan reads, of no family swajax builds
    unbuilt.write_text(
        json.dumps(
            {
                "model_type": "hybrid_x",
                "num_hidden_layers": 2,
                "hidden_size": 64,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "sliding_window": 8,
                "layer_types": ["sliding_attention", "full_attention"],
            }
        )
    )
    code, _, err = cli(
        "plan",
        "--hf-config",
        str(unbuilt),
        "--kv-budget-gib",
        "1",
        "--workload",
        "multi-turn",
        "--accelerator",
        "h200",
    )
    assert code == 2 and "weight bytes need a model swajax builds" in err
    code, _, err = cli(
        "plan",
        "--preset",
        "gpt-oss-120b",
        "--kv-budget-gib",
        "16",
        "--workload",
        "nowhere.jsonl",
        "--accelerator",
        "h200",
    )
    assert code == 2 and "JSON-lines file" in err


PRESETS = ["gpt-oss-20b", "gpt-oss-120b", "mimo-v2-flash", "llama-4-scout", "gemma-3-27b"]


@pytest.mark.slow
@pytest.mark.parametrize("workload", ["long-context", "multi-turn", "mixed"])
@pytest.mark.parametrize("preset", PRESETS)
def test_planned_ratio_never_loses_to_one_pool(cli, preset, workload):
    code, out, _ = cli(
        "plan",
        "--preset",
        preset,
        "--kv-budget-gib",
        "16",
        "--workload",
        workload,
        "--requests",
        "12",
        "--accelerator",
        "h200",
        "--ratios",
        "0.1,0.3,1",
        "--json",
    )
    assert code == 0
    p = json.loads(out)
    assert p["best"]["tokens_per_s"] >= p["single"]["tokens_per_s"] * (1 - 1e-9)
    assert p["best"]["ratio"] >= p["min_ratio"]
    assert all(c["ratio"] >= p["min_ratio"] for c in p["candidates"])
