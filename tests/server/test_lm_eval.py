"""An evaluation harness no one here wrote: `lm-eval` (its `local-completions` model, which asks
/v1/completions for echoed prompt logprobs) runs a small multiple-choice task file written
here against the server, and gets the loglikelihoods the Python API gives.

Outside the default suite (lm-eval brings torch): make the fixture environment
(tools/make_fixtures.py), `.hfenv/bin/pip install 'lm-eval[api]'`, then

    SWAJAX_LM_EVAL=.hfenv/bin/lm_eval .venv/bin/python -m pytest -m slow \
        tests/server/test_lm_eval.py
"""

import json
import os
import subprocess

import numpy as np
import pytest

import swajax
from swajax.api.generation import teacher_forced_logits

pytestmark = pytest.mark.slow

ITEMS = [
    ("def add(a, b):\n    return", [" a + b", " a - b", " None"]),
    ("import numpy as", [" np", " pd", " tf"]),
    ("for i in range(", ["10):", "'x'):", "None"]),
    ("class Stack:\n    def", [" push(self, x):", " __init__(self):", " pop"]),
    ("x = [1, 2, 3]\nprint(len(", ["x))", "y))", "1)"]),
    ("while True:\n    ", ["break", "pass", "return"]),
] * 4  # 24 items, 72 loglikelihood requests

TASK = """task: swajax_tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""


def test_lm_eval_gets_the_python_apis_loglikelihoods(server, model, tmp_path):
    harness = os.environ.get("SWAJAX_LM_EVAL")
    if not harness or not os.path.exists(harness):
        pytest.skip("set SWAJAX_LM_EVAL to an lm_eval executable (see the module docstring)")
    data = tmp_path / "items.jsonl"
    data.write_text(
        "".join(json.dumps(dict(question=q, choices=c, answer=0)) + "\n" for q, c in ITEMS)
    )
    (tmp_path / "task.yaml").write_text(TASK.format(data=data))
    args = (
        f"base_url={server}/v1/completions,tokenizer={model},"
        "tokenizer_backend=huggingface,num_concurrent=4,max_retries=1"
    )
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    subprocess.run(
        [
            harness,
            "--model",
            "local-completions",
            "--model_args",
            args,
            "--tasks",
            "swajax_tiny_mc",
            "--include_path",
            str(tmp_path),
            "--output_path",
            str(tmp_path / "out"),
            "--log_samples",
        ],
        check=True,
        env=env,
        capture_output=True,
        timeout=600,
    )
    (samples,) = (tmp_path / "out").rglob("samples_*.jsonl")
    llm = swajax.LLM(str(model), max_model_len=512)
    checked = 0
    for line in samples.read_text().splitlines():
        sample = json.loads(line)
        for args, resp in zip(sample["arguments"].values(), sample["resps"]):
            context, continuation = args["arg_0"], args["arg_1"]
            # lm-eval's rule: a context's trailing whitespace belongs to the continuation.
            spaces = len(context) - len(context.rstrip())
            if spaces:
                context, continuation = context[:-spaces], context[-spaces:] + continuation
            ids = llm.tokenizer.encode(context + continuation)
            n = len(llm.tokenizer.encode(continuation))
            logits = teacher_forced_logits(llm.engine, ids).astype(np.float64)
            logits -= logits.max(-1, keepdims=True)
            lp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
            rows = np.arange(len(ids) - n - 1, len(ids) - 1)
            expected = lp[rows, ids[len(ids) - n :]].sum()
            assert float(resp[0][0]) == pytest.approx(expected, abs=1e-4)
            checked += 1
    assert checked == 3 * len(ITEMS)
