"""Weight bytes have one source, the decoder's own abstract parameters (`models.footprint`):
the presets' published configs give the parameter counts their model cards state, and
`swajax plan --accelerator` budgets what the weights as loaded leave of the device."""

import json

import pytest

from swajax.models.footprint import config_footprint
from swajax.presets import hf_preset

# Model cards (total, active parameters in billions). Llama 4 Scout's and Gemma 3's totals
# include their vision towers, which the text model does not load; gpt-oss's active counts
# leave out the unembedding (0.58 B), so they are compared with it added.
CARDS = {
    "gpt-oss-20b": (20.9, 3.61 + 0.58),
    "gpt-oss-120b": (116.8, 5.13 + 0.58),
    "mimo-v2-flash": (309, 15),
    "llama-4-scout": (109, 17),
    "gemma-3-27b": (27.4, None),
    "gemma-4-31b": (30.7, None),
    "step-3.5-flash": (196, 11),
}


@pytest.mark.parametrize("name", sorted(CARDS))
def test_presets_count_what_the_model_cards_state(name):
    total, active = CARDS[name]
    f = config_footprint(hf_preset(name))
    assert f.params / 1e9 == pytest.approx(total, rel=0.02)
    if active is not None:
        assert f.active_params / 1e9 == pytest.approx(active, rel=0.1)


def test_quantized_presets_hold_their_published_bytes():
    """gpt-oss-120b in MXFP4 fits one 80 GB device, as its peers serve it; dequantized it is
    ~234 GB. MiMo-V2-Flash keeps one byte per weight in block FP8."""
    kept = config_footprint(hf_preset("gpt-oss-120b")).weight_bytes
    assert 60e9 < kept < 0.9 * 80e9
    assert config_footprint(hf_preset("gpt-oss-120b"), dequantize_weights=True).weight_bytes > 230e9
    mimo = config_footprint(hf_preset("mimo-v2-flash"))
    assert mimo.weight_bytes == pytest.approx(mimo.params, rel=0.02)


def test_plan_budgets_what_the_weights_leave(cli):
    runs = {}
    for kv in ("bf16", "fp8_e4m3"):
        code, out, err = cli(
            "plan", "--preset", "gpt-oss-120b", "--accelerator", "h100", "--dtype", kv, "--json"
        )
        assert code == 0, err
        runs[kv] = json.loads(out)
    weights = config_footprint(hf_preset("gpt-oss-120b")).weight_bytes
    assert runs["bf16"]["weight_bytes"] == weights
    assert runs["bf16"]["budget_bytes"] == int(0.9 * 80e9 - weights)
    assert runs["fp8_e4m3"]["full_tokens"] == pytest.approx(2 * runs["bf16"]["full_tokens"], 1e-3)
    code, _, err = cli("plan", "--preset", "mimo-v2-flash", "--accelerator", "h200")
    assert code == 2 and "310.2 GB" in err and "--devices" in err
    code, out, _ = cli(
        "plan", "--preset", "mimo-v2-flash", "--accelerator", "h200", "--devices", "4"
    )
    assert code == 0 and "4 x H200 / 310.2 GB" in out
