"""Snapshots of an engine at rest (`swajax.api.state`): a fresh engine restored from one serves
a later turn from the saved prefix cache, reading the very KV bytes that were saved (logits bit
for bit those of the engine that was never stopped), with its tombstones and recency lists as
they were, and a host tier with its bytes; random turns go on the same after a restore as
without one; a draft's KV is kept (its proposals are accepted as before); a snapshot of another
layout or other weights is refused by name; an unrelated folder is never replaced. (A running
engine's snapshots: test_resume.py.)"""

import dataclasses

import numpy as np
import pytest
from helpers import FIXTURES
from helpers.engine_checks import check_clean
from helpers.turns import FIRST, OTHER, PARAMS, SECOND, SETUP, SHARED, run as _run

from swajax.api import make_engine
from swajax.api.state import restore_state, save_state
from swajax.errors import InputError
from swajax.models import load_decoder
from swajax.prefix_cache import check_invariants


def _shape(cache):
    """The tree as data: each node's path and slots, its tombstones, both recency orders."""

    def path(node):
        return tuple(n.key for n in reversed(list(node.path_to_root())))

    nodes = {path(n): (n.swa_live, n.value.tolist()) for n in cache.nodes()}
    return nodes, [path(n) for n in cache.full_lru], [path(n) for n in cache.swa_lru]


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """An engine after two turns sharing SHARED, saved; and what it then gives for SECOND."""
    decoder = load_decoder(FIXTURES / "gpt_oss")
    engine = make_engine(decoder, SETUP)
    _run(engine, FIRST)
    _run(engine, OTHER)
    folder = tmp_path_factory.mktemp("state") / "snap"
    save_state(engine, folder)
    shape = _shape(engine.cache)
    assert not all(live for live, _ in shape[0].values())  # a tombstone is among what is saved
    return decoder, folder, shape, _run(engine, SECOND)


def test_a_restored_engine_serves_from_the_saved_cache(warm):
    decoder, folder, shape, (tokens, logits, cached) = warm
    engine = make_engine(decoder, SETUP)
    report = restore_state(engine, folder)
    assert report["nodes"] > 0 and report["tokens"] >= len(SHARED)
    assert _shape(engine.cache) == shape
    check_invariants(engine.cache)
    got_tokens, got_logits, got_cached = _run(engine, SECOND)
    assert got_cached == cached == len(SHARED)
    assert got_tokens == tokens
    assert np.array_equal(got_logits, logits)  # the same KV bytes
    check_invariants(engine.cache)
    check_clean(engine)


def test_another_layout_is_refused_by_name(warm):
    decoder, folder, _, _ = warm
    with pytest.raises(InputError, match="another engine: .*pools"):
        restore_state(make_engine(decoder, SETUP.replace(page_size=8)), folder)
    with pytest.raises(InputError, match="another engine: .*request_table"):
        restore_state(make_engine(decoder, SETUP.replace(max_context=512)), folder)
    other = load_decoder(FIXTURES / "gpt_oss")
    other.embed[...] = other.embed[...] * 2  # the same shapes, other weights
    with pytest.raises(InputError, match="another engine: weights"):
        restore_state(make_engine(other, SETUP), folder)
    with pytest.raises(InputError, match="holds no swajax snapshot"):
        restore_state(make_engine(decoder, SETUP), folder.parent)


def test_nothing_a_save_did_not_write_is_overwritten(warm, tmp_path):
    decoder, folder, _, _ = warm
    engine = make_engine(decoder, SETUP)
    engine.add_request(FIRST, PARAMS)
    engine.run()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(InputError):
        save_state(engine, mine, force=True)  # not a folder a save wrote
    assert (mine / "notes.txt").read_text() == "keep"
    save_state(engine, folder, force=True)  # an earlier save's folder: replaced
    assert (folder / "swajax_state.json").is_file()


def test_the_llm_saves_and_restores(tmp_path):
    import swajax

    params = swajax.SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    llm = swajax.LLM(str(FIXTURES / "gpt_oss"), max_model_len=256, kv_budget_gib=0.001)
    llm.generate([FIRST], params)
    llm.save_state(str(tmp_path / "snap"))
    expected = llm.generate([SECOND], params)[0]
    again = swajax.LLM(
        str(FIXTURES / "gpt_oss"),
        max_model_len=256,
        kv_budget_gib=0.001,
        restore_from=str(tmp_path / "snap"),
    )
    got = again.generate([SECOND], params)[0]
    assert got.num_cached_tokens == expected.num_cached_tokens > 0
    assert got.outputs[0].token_ids == expected.outputs[0].token_ids


def test_a_host_tier_is_saved_with_its_bytes(tmp_path):
    """The shared prefix evicted to the host tier (full KV and windows), saved; the restored
    engine loads it back for the next turn, the same bytes."""
    decoder = load_decoder(FIXTURES / "gpt_oss")
    spec = SETUP.replace(host_cache_gib=0.001)
    engine = make_engine(decoder, spec)
    _run(engine, FIRST)
    _run(engine, OTHER)
    engine.cache.evict(10**9, 10**9)
    assert engine.cache.tier.full.used > 0
    save_state(engine, tmp_path / "snap")
    expected = _run(engine, SECOND)
    restored = make_engine(decoder, spec)
    restore_state(restored, tmp_path / "snap")
    check_invariants(restored.cache)
    got = _run(restored, SECOND)
    assert restored.cache.tier.loaded[0] > 0 and got[2] == expected[2] == len(SHARED)
    assert got[0] == expected[0] and np.array_equal(got[1], expected[1])
    check_invariants(restored.cache)
    check_clean(restored)


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_random_turns_go_on_the_same_after_a_restore(seed, tmp_path):
    """Random conversations under a tight budget (evictions, tombstones, splits), saved at rest
    and restored; then the same random next turns on the saved engine and on the restored one:
    the same tokens, the same hits, the same tree."""
    rng = np.random.default_rng(seed)
    decoder = load_decoder(FIXTURES / "gpt_oss")
    spec = SETUP.replace(kv_budget_gib=0.0004)
    stems = [rng.integers(1, 120, int(rng.integers(20, 60))).tolist() for _ in range(3)]

    def turn():
        stem = stems[int(rng.integers(len(stems)))]
        return stem[: int(rng.integers(8, len(stem) + 1))] + rng.integers(1, 120, 6).tolist()

    engine = make_engine(decoder, spec)
    for _ in range(6):
        _run(engine, turn())
    save_state(engine, tmp_path / "snap")
    restored = make_engine(decoder, spec)
    restore_state(restored, tmp_path / "snap")
    for _ in range(4):
        prompt = turn()
        a, b = _run(engine, prompt), _run(restored, prompt)
        assert a[0] == b[0] and a[2] == b[2] and np.array_equal(a[1], b[1])
        assert _shape(engine.cache) == _shape(restored.cache)
    check_invariants(restored.cache)
    check_clean(restored)


@pytest.mark.slow  # a draft's state restores in tests/serving/test_mtp_engine.py too
def test_a_speculative_engine_keeps_its_drafts_kv(tmp_path):
    """With a draft model its pools are saved too: the restored engine drafts over the
    restored prefix as the saved one does; and saved in the middle of a request's speculative
    rounds, it finishes that request with the same tokens as the saved engine."""
    decoder = load_decoder(FIXTURES / "gpt_oss")
    draft = load_decoder(FIXTURES / "gpt_oss")
    spec = SETUP.replace(num_speculative_tokens=2)

    def run(engine, prompt):  # speculative rounds keep no logits
        rid = engine.add_request(prompt, PARAMS)
        engine.run()
        return engine.requests[rid].output, engine.requests[rid].cached_tokens

    engine = make_engine(decoder, spec, draft)
    run(engine, FIRST)
    save_state(engine, tmp_path / "snap")
    restored = make_engine(decoder, spec, draft)
    restore_state(restored, tmp_path / "snap")
    before = engine.scheduler.accepted_tokens
    a, b = run(engine, SECOND), run(restored, SECOND)
    assert a == b and a[1] > 0
    # The drafts read the restored draft KV: as many proposals accepted (the draft is the
    # target itself, so a wrong draft KV would show as rejections); the count is restored too.
    assert restored.scheduler.accepted_tokens == engine.scheduler.accepted_tokens > before

    # Saved mid-request (the test_resume workload's speculative case runs with -m slow).
    rid = engine.add_request(OTHER, dataclasses.replace(PARAMS, max_tokens=12))
    while not engine.requests[rid].output:
        engine.step()
    engine.step()
    assert not engine.requests[rid].done and engine.requests[rid].output
    save_state(engine, tmp_path / "mid")
    resumed = make_engine(decoder, spec, draft)
    restore_state(resumed, tmp_path / "mid")
    engine.run()
    resumed.run()
    assert resumed.requests[rid].output == engine.requests[rid].output
    assert resumed.scheduler.accepted_tokens == engine.scheduler.accepted_tokens
    check_clean(resumed)


def test_the_weights_fingerprint_holds_however_they_are_split():
    """Integer sums: the same weights over one device and split over two give one
    fingerprint (a snapshot from one layout restores into the other)."""
    from swajax.api.state import identity

    decoder = load_decoder(FIXTURES / "gpt_oss")
    one = identity(make_engine(decoder, SETUP))["weights"]
    two = identity(make_engine(decoder, SETUP.replace(tensor_parallel=2)))["weights"]
    assert one == two


def test_the_weights_fingerprint_reads_little_at_published_shapes():
    """gpt-oss-20b's embedding (vocab 201,088 x 2,880, bf16) and its packed MXFP4 experts: the
    fingerprint's program holds a few sampled values per tensor, not a widened copy (reading
    every value took 14 GiB of temporaries: XLA:CPU fuses no integer reduction)."""
    import jax
    import jax.numpy as jnp

    from swajax.api.state import _sums

    shapes = [
        jax.ShapeDtypeStruct((201_088, 2_880), jnp.bfloat16),
        jax.ShapeDtypeStruct((24, 32, 5_760, 90, 16), jnp.uint8),
        jax.ShapeDtypeStruct((2_880,), jnp.float32),
    ]
    memory = _sums.lower(shapes).compile().memory_analysis()
    assert memory.temp_size_in_bytes < 2**20
