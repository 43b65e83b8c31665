"""A snapshot is checked before it is trusted: every index and size of a saved running engine
(request rows, lengths, slots, token ids, statuses, locks, queues, free rows, the next id, the
tree's parents, slots and lists) set to an impossible value is refused at restore with an error
naming the field, and the engine is left as it was (fresh: it then serves exactly as a new
one). A save to a read-only folder or one a second saver holds is one clear error."""

import json
import shutil
import threading

import numpy as np
import pytest
from helpers import FIXTURES
from helpers.engine_checks import check_clean
from helpers.turns import FIRST, OTHER, PARAMS, SETUP, run

from swajax.api import make_engine
from swajax.api.state import HEADER, REQUESTS, restore_state, save_state
from swajax.errors import InputError
from swajax.models import load_decoder

HUGE = 10**9


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A running engine (two requests mid-way, one holding a lock on the tree), saved; and what
    a fresh engine gives for FIRST."""
    decoder = load_decoder(FIXTURES / "gpt_oss")
    engine = make_engine(decoder, SETUP)
    run(engine, OTHER)  # a tree to lock into
    for prompt in (FIRST, OTHER):
        engine.add_request(prompt, PARAMS)
    while len(engine.scheduler.running) < 2:  # both admitted, before a decode round ends them
        engine.step()
    folder = tmp_path_factory.mktemp("state") / "snap"
    save_state(engine, folder)
    return decoder, folder, run(make_engine(decoder, SETUP), FIRST)[0]


def _edit_header(path, edit):
    header = json.loads(path.read_text())
    edit(header)
    path.write_text(json.dumps(header))


def _locked(h):
    return next(r for r in h["engine"]["requests"] if r["handle"] is not None)


def _running(h):
    return next(r for r in h["engine"]["requests"] if r["row"] is not None)


CASES = {
    "requests[i].row": lambda h: _running(h).update(row=HUGE),
    "requests[i].kv_len": lambda h: _running(h).update(kv_len=-1),
    "requests[i].prompt": lambda h: _running(h)["prompt"].__setitem__(0, HUGE),
    "requests[i].output": lambda h: _running(h)["output"].append(-4),
    "requests[i].cache_protected_len": lambda h: _running(h).update(cache_protected_len=HUGE),
    "requests[i].swa_evicted_seqlen": lambda h: _running(h).update(swa_evicted_seqlen=-3),
    "requests[i].swa_evict_floor": lambda h: _running(h).update(swa_evict_floor=HUGE),
    "requests[i].status": lambda h: _running(h).update(status="zombie"),
    "requests[i].handle node": lambda h: _locked(h)["handle"].__setitem__(0, HUGE),
    "requests[i].rid": lambda h: _running(h).update(rid="x"),
    "requests[i].retractions": lambda h: _running(h).update(retractions=-1),
    "running": lambda h: h["engine"]["running"].append(HUGE),
    "waiting": lambda h: h["engine"]["waiting"].append(HUGE),
    "free_rows": lambda h: h["engine"]["free_rows"].append(HUGE),
    "next_id": lambda h: h["engine"].update(next_id=0),
    "tree.nodes[0].parent": lambda h: h["tree"]["nodes"][0].update(parent=5),
    "tree.nodes[0].value": lambda h: h["tree"]["nodes"][0]["value"].__setitem__(0, HUGE),
    "tree.full_lru": lambda h: h["tree"]["full_lru"].append(HUGE),
    "tree.swa_lru": lambda h: h["tree"]["swa_lru"].append(-1),
    "tree.locks": lambda h: h["tree"]["locks"].append([HUGE, 1, 1, [], []]),
}


@pytest.mark.parametrize("field", list(CASES) + ["slots_", "header"])
def test_an_impossible_value_is_refused_and_the_engine_stays_fresh(saved, field, tmp_path):
    decoder, folder, fresh = saved
    copy = tmp_path / "snap"
    shutil.copytree(folder, copy)
    if field == "slots_":  # a request's full slots past the pool
        with np.load(copy / REQUESTS) as arrays:
            arrays = dict(arrays)
        name = next(k for k, v in arrays.items() if k.startswith("slots_") and v.size)
        arrays[name] = arrays[name] + HUGE
        np.savez(copy / REQUESTS, **arrays)
    elif field == "header":
        (copy / HEADER).write_text('{"format": 1, "of": ')
        field = "not a snapshot header"
    else:
        _edit_header(copy / HEADER, CASES[field])
        field = field.replace("[i]", "[").split("[")[0] if "[i]" in field else field
    engine = make_engine(decoder, SETUP)
    with pytest.raises(InputError, match=field.replace("[", r"\[").replace("]", r"\]")):
        restore_state(engine, copy)
    assert run(engine, FIRST)[0] == fresh
    check_clean(engine)


def test_the_untouched_snapshot_restores(saved):
    """The control: the same snapshot unedited restores and its requests finish."""
    decoder, folder, _ = saved
    engine = make_engine(decoder, SETUP)
    assert restore_state(engine, folder)["requests"] == 2
    engine.run()
    check_clean(engine)


def test_a_save_with_nowhere_to_go_is_one_clear_error(saved):
    """A folder no one may write into (even root: /proc): the error names the destination."""
    decoder, _, _ = saved
    engine = make_engine(decoder, SETUP)
    run(engine, FIRST)
    with pytest.raises(InputError, match="cannot write /proc/swajax-snap"):
        save_state(engine, "/proc/swajax-snap")


def test_two_savers_to_one_folder_take_turns(saved, tmp_path):
    """Two saves at once into the same folder: both succeed, one after the other (a lock on
    the parent folder), and the folder holds a whole snapshot."""
    decoder, _, _ = saved
    engines = [make_engine(decoder, SETUP) for _ in range(2)]
    for e in engines:
        run(e, FIRST)
    errors = []

    def save(e):
        try:
            for _ in range(3):
                save_state(e, tmp_path / "snap", force=True)
        except Exception as error:  # noqa: BLE001 - collected for the assertion
            errors.append(error)

    threads = [threading.Thread(target=save, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    fresh = make_engine(decoder, SETUP)
    assert restore_state(fresh, tmp_path / "snap")["nodes"] > 0
