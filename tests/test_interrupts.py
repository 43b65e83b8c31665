"""A KeyboardInterrupt (or any exception) at any instant of a call leaves the `LLM` usable and
right: injected at each stage of a step (before a program runs, after it took its donated
inputs and before the runner holds its outputs, in the read, in the scheduler's bookkeeping,
in a release), then by a timer at many delays in a process of its own, whose exit status is
checked at the end. After each, the next call gives a fresh LLM's tokens and nothing leaks."""

import subprocess
import sys
import textwrap

import pytest
from helpers.engine_checks import check_clean

import swajax
from swajax import SamplingParams

PROMPTS = ["def f(x):", "import os"]
PARAMS = SamplingParams(max_tokens=24, temperature=0.7, seed=1, n=2)


@pytest.fixture(scope="module")
def llm():
    return swajax.LLM("tiny", max_model_len=256, dtype="float32")


@pytest.fixture(scope="module")
def fresh(llm):
    return tokens(llm)


def tokens(llm):
    return [[o.token_ids for o in r.outputs] for r in llm.generate(PROMPTS, PARAMS, use_tqdm=False)]


def _once(real, at: int, error: BaseException, *, after: bool = False):
    """`real`, raising `error` on its `at`-th call (before it runs, or `after` it ran)."""
    calls = [0]

    def hooked(*args, **kwargs):
        calls[0] += 1
        if calls[0] == at and not after:
            raise error
        out = real(*args, **kwargs)
        if calls[0] == at:
            raise error
        return out

    return hooked


# (object path from the engine, attribute, raise after the real call ran)
STAGES = [
    ("runner.programs", "call", False),  # before the program: nothing donated yet
    ("runner.programs", "call", True),  # inputs donated, outputs dropped: the old wedge
    ("runner", "collect", False),
    ("runner", "apply_releases", False),
    ("scheduler", "schedule", False),
    ("scheduler", "postprocess", False),
    ("scheduler", "postprocess", True),  # the step's tokens taken, the rest of the call not
]


@pytest.mark.parametrize("error", [KeyboardInterrupt(), RuntimeError("planted")], ids=repr)
@pytest.mark.parametrize("where, name, after", STAGES)
def test_a_fault_at_each_stage_of_a_step(llm, fresh, where, name, after, error):
    engine = llm.engine
    owner = engine
    for part in where.split("."):
        owner = getattr(owner, part)
    real = getattr(owner, name)
    setattr(owner, name, _once(real, 3, error, after=after))
    try:
        if isinstance(error, KeyboardInterrupt):
            with pytest.raises(KeyboardInterrupt):
                tokens(llm)
        else:  # the engine's own handling: its step's requests retried alone, or the call fails
            try:
                tokens(llm)
            except RuntimeError as e:
                assert "planted" in str(e)
    finally:
        setattr(owner, name, real)
        if name in vars(type(owner)):  # an instance attribute shadowed the method: gone again
            delattr(owner, name)
    assert llm._holder is None
    assert tokens(llm) == fresh
    check_clean(llm.engine)


def test_timed_interrupts_then_a_clean_exit(tmp_path):
    """Ctrl-C as a notebook user sends it: `interrupt_main` at delays over a call's whole
    length; every following call is right, and the interpreter exits with status 0."""
    script = tmp_path / "interrupts.py"
    script.write_text(
        textwrap.dedent(
            """
            import _thread, threading, time
            import swajax
            from swajax import SamplingParams
            from swajax.serving.engine import Engine

            recovered = [0]
            real = Engine.recover

            def counting(self, *args, **kwargs):
                recovered[0] += 1
                return real(self, *args, **kwargs)

            Engine.recover = counting
            llm = swajax.LLM("tiny", max_model_len=256)
            params = SamplingParams(max_tokens=40, temperature=0.7, seed=1, n=2)

            def run():
                out = llm.generate(["def f(x):", "import os"], params, use_tqdm=False)
                return [[o.token_ids for o in r.outputs] for r in out]

            want, interrupted = run(), 0
            for i in range(24):
                timer = threading.Timer((i % 12) * 0.025, _thread.interrupt_main)
                try:
                    try:
                        timer.start()
                        run()
                    finally:
                        timer.cancel()
                        timer.join()
                        time.sleep(0.005)
                except KeyboardInterrupt:
                    interrupted += 1
                assert run() == want, i
            print(f"interrupted {interrupted}, recovered {recovered[0]}", flush=True)
            """
        )
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    line = done.stdout.strip().splitlines()[-1]
    interrupted = int(line.split()[1].rstrip(","))
    assert interrupted > 0, line  # the timer did land inside calls
