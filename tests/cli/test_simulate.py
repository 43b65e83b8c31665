"""`swajax simulate`: both runs complete every accepted request; output fields; bad input."""

import json

import pytest


@pytest.mark.parametrize("workload", ["multi-turn", "mixed"])
def test_simulate_json_loses_nothing(cli, workload):
    code, out, _ = cli(
        "simulate",
        "--preset",
        "tiny-hybrid",
        "--kv-budget-gib",
        "0.002",
        "--swa-full-tokens-ratio",
        "0.3",
        "--page-size",
        "4",
        "--workload",
        workload,
        "--requests",
        "12",
        "--json",
    )
    assert code == 0
    report = json.loads(out)
    for name in ("hybrid", "single"):
        r = report[name]
        assert r["lost"] == 0 and r["finished"] + r["rejected"] >= 1
        assert r["peak_concurrency"] >= 1 and r["compilations"] == 0  # a host-only run
        assert 0 <= r["prefix_hit_rate"] <= 1
    assert report["hybrid"]["mode"] == "hybrid" and report["single"]["mode"] == "single"
    expected = report["hybrid"]["peak_concurrency"] / report["single"]["peak_concurrency"]
    assert report["peak_concurrency_ratio"] == pytest.approx(expected)


def test_simulate_table_and_plot(cli, tmp_path):
    plot = tmp_path / "occupancy.png"
    code, out, _ = cli(
        "simulate",
        "--preset",
        "tiny-hybrid",
        "--kv-budget-gib",
        "0.002",
        "--swa-full-tokens-ratio",
        "0.3",
        "--page-size",
        "4",
        "--workload",
        "multi-turn",
        "--requests",
        "8",
        "--plot",
        str(plot),
    )
    assert code == 0 and "peak concurrency hybrid / single" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--requests", "0"], "--requests"),
        (["--clients", "0"], "--clients"),
        (["--swa-full-tokens-ratio", "2"], "got 2"),
        (["--preset", "nope"], "nope"),
    ],
)
def test_simulate_bad_arguments(cli, argv, needle):
    base = [
        "simulate",
        "--preset",
        "tiny-hybrid",
        "--kv-budget-gib",
        "0.002",
        "--workload",
        "multi-turn",
    ]
    args = base[:]
    for i in range(0, len(argv), 2):
        if argv[i] in args:
            args[args.index(argv[i]) + 1] = argv[i + 1]
        else:
            args += argv[i : i + 2]
    code, out, err = cli(*args)
    assert code != 0 and needle in err and len(err.strip().splitlines()) == 1


def test_simulate_models_time_on_an_accelerator(cli, tmp_path):
    """A workload file with timed arrivals, on H200: both runs report modeled throughput and
    latencies, and the clock waits for the late arrival."""
    path = tmp_path / "w.jsonl"
    rows = [{"prompt_len": 600, "output_len": 20, "prefix_id": "sys"}] * 3 + [
        {"prompt_len": 900, "output_len": 20, "prefix_id": "sys", "arrival": 30.0}
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, _ = cli(
        "simulate",
        "--preset",
        "gpt-oss-20b",
        "--kv-budget-gib",
        "1",
        "--workload",
        str(path),
        "--accelerator",
        "h200",
        "--json",
    )
    assert code == 0
    report = json.loads(out)
    for name in ("hybrid", "single"):
        r = report[name]
        assert r["finished"] == 4 and r["lost"] == 0
        assert r["modeled_seconds"] > 30 and r["tokens_per_s"] > 0
        assert 0 < r["ttft_s"] < 5 and 0 < r["itl_s"] < 1
    assert report["hybrid"]["prefix_hit_rate"] > 0  # the three share the stream's first 600


def test_simulate_with_an_emulated_draft_and_no_tail_rebuild(cli):
    """A draft in the cell shrinks the pools; its emulated rounds lose nothing."""
    base = [
        "simulate",
        "--preset",
        "tiny-hybrid",
        "--kv-budget-gib",
        "0.002",
        "--swa-full-tokens-ratio",
        "0.3",
        "--page-size",
        "4",
        "--workload",
        "multi-turn",
        "--requests",
        "4",
        "--json",
    ]
    reports = []
    for extra in (
        [],
        [
            "--draft-preset",
            "tiny-hybrid",
            "--num-speculative-tokens",
            "3",
            "--acceptance",
            "0.5",
            "--no-tail-rebuild",
        ],
    ):
        code, out, _ = cli(*base, *extra)
        assert code == 0
        reports.append(json.loads(out))
    plain, spec = reports
    for name in ("hybrid", "single"):
        assert spec[name]["lost"] == 0 and spec[name]["rebuilt_tokens"] == 0
        assert spec[name]["full_tokens"] < plain[name]["full_tokens"]  # the draft's layers
        assert spec[name]["steps"] < plain[name]["steps"]  # several tokens per decode step


def test_simulate_sizes_fp8_pools_at_one_byte(cli):
    """--dtype fp8_e4m3: the same budget holds twice the tokens of bf16, in both pools."""
    sizes = {}
    for dtype in ("bf16", "fp8_e4m3"):
        code, out, _ = cli(
            "simulate",
            "--preset",
            "tiny-hybrid",
            "--kv-budget-gib",
            "0.002",
            "--workload",
            "multi-turn",
            "--requests",
            "4",
            "--dtype",
            dtype,
            "--json",
        )
        assert code == 0
        hybrid = json.loads(out)["hybrid"]
        sizes[dtype] = (hybrid["full_tokens"], hybrid["swa_tokens"])
    for bf16, fp8 in zip(sizes["bf16"], sizes["fp8_e4m3"]):
        assert fp8 == pytest.approx(2 * bf16, rel=0.01)


def test_reasoning_workload_is_short_prompts_and_long_generations():
    from swajax.simulator.workloads import make_workload

    w = make_workload("reasoning", 40, seed=3)
    assert w.total == len(w.initial) == 40
    assert all(128 <= len(a.prompt) <= 1024 for a in w.initial)
    assert all(8_192 <= a.params.max_tokens <= 32_768 for a in w.initial)
    assert w.follow_up(w.initial[0], [1, 2]) is None
    assert len({a.params.max_tokens for a in w.initial}) > 20  # spread over the range


def test_simulate_and_plan_report_a_host_tier(cli):
    """`--host-cache-gib`: the hybrid run gets the tier (one pool has no second lifetime), and
    its capacity and traffic are reported; `plan` prints the stores' tokens."""
    code, out, _ = cli(
        "simulate",
        "--preset",
        "tiny-hybrid",
        "--kv-budget-gib",
        "0.001",
        "--swa-full-tokens-ratio",
        "0.3",
        "--page-size",
        "4",
        "--workload",
        "multi-turn",
        "--requests",
        "8",
        "--host-cache-gib",
        "0.004",
        "--accelerator",
        "h200",
        "--json",
    )
    assert code == 0
    report = json.loads(out)
    hybrid, single = report["hybrid"], report["single"]
    assert hybrid["host_tokens"][0] > 0 and hybrid["host_tokens"][1] > 0
    assert single["host_tokens"] == [0, 0] and hybrid["lost"] == 0
    assert sum(hybrid["host_saved_tokens"]) > 0  # the device evicted to the host
    code, out, _ = cli(
        "plan",
        "--preset",
        "gpt-oss-120b",
        "--kv-budget-gib",
        "40",
        "--swa-full-tokens-ratio",
        "0.1",
        "--host-cache-gib",
        "160",
    )
    assert code == 0 and "host tier tokens full|SWA" in out


def test_closed_loop_keeps_n_requests_outstanding_and_sends_each_once():
    """`closed_loop`: the first N arrive at once, each finished request is followed by its own
    next turn if it has one, else by the next unsent request; every request is sent once."""
    from swajax.simulator.workloads import closed_loop, make_workload

    plain = make_workload("reasoning", 7, seed=1)
    lengths = [a.params.max_tokens for a in plain.initial]
    loop = closed_loop(make_workload("reasoning", 7, seed=1), 3)
    assert loop.total == 7 and [a.params.max_tokens for a in loop.initial] == lengths[:3]
    sent = list(loop.initial)
    while (nxt := loop.follow_up(sent[len(sent) - 3], [1])) is not None:
        sent.append(nxt)
    assert [a.params.max_tokens for a in sent] == lengths
    chats = closed_loop(make_workload("multi-turn", 8, seed=1), 1)  # two 4-turn chats
    first = chats.initial[0]
    turn = chats.follow_up(first, [5, 6])
    assert turn.conversation == first.conversation  # its own chat goes on before another starts
    assert turn.prompt[: len(first.prompt) + 2] == first.prompt + [5, 6]
    with pytest.raises(ValueError, match="clients must be >= 1, got 0"):
        closed_loop(plain, 0)


def test_simulate_with_clients_never_runs_more_than_them(cli):
    """`--clients 3` over 10 requests: at most 3 run at once in either run, all finish, and the
    throughput up to the last send is reported (0 for a workload that all arrives at once)."""
    base = [
        "simulate",
        "--preset",
        "tiny-hybrid",
        "--kv-budget-gib",
        "0.002",
        "--swa-full-tokens-ratio",
        "0.3",
        "--page-size",
        "4",
        "--workload",
        "shared-prefix",
        "--requests",
        "10",
        "--accelerator",
        "h200",
        "--json",
    ]
    code, out, _ = cli(*base, "--clients", "3")
    assert code == 0
    report = json.loads(out)
    for name in ("hybrid", "single"):
        r = report[name]
        assert r["peak_concurrency"] == 3 and r["finished"] == 10 and r["lost"] == 0
        assert 0 < r["loaded_tokens_per_s"]
    loaded = [report[name]["loaded_tokens_per_s"] for name in ("hybrid", "single")]
    assert report["loaded_tokens_per_s_ratio"] == pytest.approx(loaded[0] / loaded[1])
    code, out, _ = cli(*base[:-1], "--clients", "3")  # the table names the ratios
    assert code == 0 and "loaded tokens/s hybrid / single" in out
    assert "modeled tokens/s hybrid / single" in out
    code, out, _ = cli(*base)
    assert code == 0
    report = json.loads(out)
    assert report["hybrid"]["peak_concurrency"] > 3
    assert report["hybrid"]["loaded_tokens_per_s"] == 0  # all sent at time 0: no loaded phase


def test_a_closed_loop_client_goes_on_after_a_refused_request(cli, tmp_path):
    """A request the engine refuses (longer than the context) frees its client: the next one
    is sent, so every acceptable request still runs, one at a time with `--clients 1`."""
    path = tmp_path / "w.jsonl"
    rows = [{"prompt_len": 50, "output_len": 8}] * 5
    rows[0] = rows[2] = {"prompt_len": 200_000, "output_len": 8}
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, _ = cli(
        "simulate",
        "--preset",
        "tiny-hybrid",
        "--kv-budget-gib",
        "0.002",
        "--swa-full-tokens-ratio",
        "0.3",
        "--page-size",
        "4",
        "--workload",
        str(path),
        "--clients",
        "1",
        "--json",
    )
    assert code == 0
    for name in ("hybrid", "single"):
        r = json.loads(out)[name]
        assert (r["finished"], r["rejected"], r["lost"]) == (3, 2, 0)
        assert r["peak_concurrency"] == 1
