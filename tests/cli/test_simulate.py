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
        "--ratio",
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
        assert r["peak_concurrency"] >= 1 and r["compilations"] >= 1
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
        "--ratio",
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
        (["--ratio", "2"], "got 2"),
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
