"""The flags that join other processes are checked before anything connects: one error line
naming the flag and the limit (the joins themselves: tests/multihost/)."""

import json

import pytest

from swajax.cluster import Cluster


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--num-processes", "2"], "--num-processes and --process-id need --coordinator"),
        (
            ["--coordinator", "nohost", "--num-processes", "2", "--process-id", "0"],
            "--coordinator must be HOST:PORT, got 'nohost'",
        ),
        (
            ["--coordinator", "h:70000", "--num-processes", "2", "--process-id", "0"],
            "--coordinator must be HOST:PORT",
        ),
        (["--coordinator", "h:1234"], "--coordinator needs --num-processes N and --process-id I"),
        (
            ["--coordinator", "h:1234", "--num-processes", "2", "--process-id", "2"],
            "--process-id must be in [0, 2) for --num-processes 2, got 2",
        ),
        (["--distributed", "--process-id", "1"], "--distributed auto takes the coordinator"),
    ],
)
def test_bad_cluster_flags_are_one_line(cli, flags, message):
    code, out, err = cli("generate", *flags)
    assert code == 2 and out == ""
    assert err.startswith("swajax generate: error: ") and message in err
    assert len(err.strip().splitlines()) == 1


def test_no_flags_is_one_process():
    assert not Cluster().requested
    Cluster().check()  # nothing to join, nothing to complain about


def test_launch_local_needs_a_joinable_command(cli):
    code, _, err = cli("launch-local", "--num-processes", "2", "--", "plan")
    assert code == 2 and "launch-local runs one of generate, logits" in err
    code, _, err = cli(
        "launch-local", "--num-processes", "2", "--", "generate", "--process-id", "1"
    )
    assert code == 2 and "launch-local sets --coordinator" in err


def test_tensor_parallel_beyond_the_visible_devices_is_one_line(cli):
    code, out, err = cli("generate", "--tp-size", "8", "--max-tokens", "1")
    assert code == 2 and out == ""
    assert "tensor_parallel=8 needs that many devices; 4 are visible" in err


def test_the_demo_splits_over_two_devices(cli):
    """`--tp-size 2` on the embedded demo (2 KV heads): the same tokens as one device."""
    argv = ("generate", "--prompt-ids", "100,101,32,102", "--max-tokens", "4", "--json")
    _, one, _ = cli(*argv)
    code, two, err = cli(*argv, "--tp-size", "2")
    assert code == 0, err
    assert json.loads(two.splitlines()[0])["tokens"] == json.loads(one.splitlines()[0])["tokens"]
