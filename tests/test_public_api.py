"""The public API, used only through `import swajax`, as an inference script would."""

import json
import pathlib
import subprocess
import sys
import tomllib

import pytest

import swajax

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "gpt_oss"
CASE = json.loads((FIXTURE / "greedy.json").read_text())


@pytest.fixture(scope="module")
def llm():
    return swajax.LLM(str(FIXTURE), max_model_len=256)


def test_generate_matches_transformers_greedy(llm):
    (result,) = llm.generate(
        [CASE["prompt"]], swajax.SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    )
    assert isinstance(result, swajax.RequestOutput) and result.finished
    (out,) = result.outputs
    assert isinstance(out, swajax.CompletionOutput)
    assert out.token_ids == CASE["greedy"] and out.finish_reason == "length"
    assert result.prompt_token_ids == CASE["prompt"] and len(out.token_logprobs) == 8
    assert out.cumulative_logprob == pytest.approx(sum(out.token_logprobs))
    assert out.logprobs is None and out.stop_reason is None
    assert out.text is None and result.prompt is None  # the fixture has no tokenizer.json


def test_a_batch_keeps_its_order_and_a_repeat_hits_the_prefix_cache(llm):
    a, b = CASE["prompt"], CASE["prompt"][:9] + [3, 4]
    outs = llm.generate(
        [a, b, a], swajax.SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    )
    assert [o.prompt_token_ids for o in outs] == [a, b, a]
    assert outs[0].outputs[0].token_ids == CASE["greedy"][:3]
    again = llm.generate(
        a, swajax.SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    )  # one prompt, not a list
    assert again[0].outputs[0].token_ids == outs[0].outputs[0].token_ids
    assert again[0].num_cached_tokens > 0


def test_stream_yields_the_tokens_generate_gives():
    llm = swajax.LLM("tiny")
    params = swajax.SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    (expected,) = llm.generate("def fibonacci(n):", params)[0].outputs
    events = list(llm.stream(["def fibonacci(n):", "import os"], params))
    mine = [e for e in events if e.index == 0]
    assert [e.token_id for e in mine] == expected.token_ids
    assert "".join(e.text for e in mine) == expected.text
    assert [e.finish_reason for e in mine] == [None] * 11 + ["length"]
    assert {e.index for e in events} == {0, 1}
    assert all(isinstance(e, swajax.StreamEvent) for e in events)


def test_bad_input_is_one_error_type():
    llm = swajax.LLM("tiny")
    for prompts in ([], [[1.5]], None):
        with pytest.raises(swajax.InputError):
            llm.generate(prompts)
    with pytest.raises(swajax.InputError, match="not in the local Hugging Face cache"):
        swajax.LLM("no/such-folder")
    with pytest.raises(swajax.InputError, match="must be 'tiny', a checkpoint folder or a hub"):
        swajax.LLM("./no/such/folder")


def test_every_public_name_resolves_and_has_a_docstring():
    for name in swajax.__all__:
        value = getattr(swajax, name)
        assert value.__doc__, name
    assert set(swajax.__all__) <= set(dir(swajax))
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        swajax.Nope  # noqa: B018


def test_import_swajax_is_cheap_and_typed():
    code = "import sys, swajax; assert 'jax' not in sys.modules, 'jax imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
    assert (ROOT / "swajax" / "py.typed").exists()
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert swajax.__version__ == version


def test_version_and_bare_usage(cli):
    assert cli("--version")[0] == 0
    code, out, _ = cli()
    assert code == 2 and "usage: swajax" in out and "generate" in out


def test_summary_reports_the_parameters_device_bytes(llm):
    from swajax.models.checkpoint import Checkpoint
    from swajax.models.loading import checkpoint_files

    ckpt = Checkpoint(checkpoint_files(FIXTURE))
    checkpoint = sum(ckpt.array(n).nbytes for n in ckpt.names())  # float32, as loaded
    assert llm.summary()["weight_bytes"] == checkpoint
