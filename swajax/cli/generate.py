"""Generation through the engine: the library side of `swajax generate` and `swajax logits`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
from flax import nnx

from swajax import sizing
from swajax.models import HybridLM, load_decoder
from swajax.models.decoder import Decoder
from swajax.models.spec import model_spec
from swajax.serving.engine import Engine, EngineOptions
from swajax.serving.request import SamplingParams

# The embedded default: a tiny hybrid model (sliding / full layers, GQA, sinks) whose vocabulary
# is the 256 byte values, so text goes in and out without a tokenizer. Weights are fixed random.
TINY_CONFIG = {
    "model_type": "gpt_oss",
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "sliding_window": 8,
    "layer_types": ["sliding_attention", "full_attention"] * 2,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "attention_bias": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


def tiny_decoder(seed: int = 0) -> Decoder:
    decoder = Decoder(model_spec(TINY_CONFIG))
    rng = np.random.default_rng(seed)
    graphdef, state = nnx.split(decoder)
    state = nnx.map_state(lambda _, x: np.asarray(rng.normal(0, 0.3, x.shape), np.float32), state)
    return nnx.merge(graphdef, state)


class Tokenizer:
    """tokenizer.json through the `tokenizers` package, or bytes for the embedded model."""

    def __init__(self, path: Path | None):
        self.hf = None
        self.missing = None  # a checkpoint folder without tokenizer.json: ids only
        if path is not None and (path / "tokenizer.json").exists():
            try:
                from tokenizers import Tokenizer as HFTokenizer
            except ImportError as e:
                raise RuntimeError("text prompts need `pip install tokenizers`") from e
            self.hf = HFTokenizer.from_file(str(path / "tokenizer.json"))
        elif path is not None:
            self.missing = path

    def encode(self, text: str) -> list[int]:
        if self.hf is not None:
            return self.hf.encode(text).ids
        if self.missing is not None:
            raise ValueError(f"{self.missing} has no tokenizer.json: use --prompt-ids")
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str | None:
        if self.hf is not None:
            return self.hf.decode(ids)
        if self.missing is not None:
            return None
        return bytes(ids).decode("utf-8", errors="replace")


@dataclasses.dataclass(frozen=True)
class Setup:
    kv_budget_gib: float = 0.004
    ratio: float = 0.5
    page_size: int = 4
    hybrid_memory: bool = True
    prefix_cache: bool = True
    attention: str = "xla"
    chunk_size: int | None = 64
    eviction_interval: int = 16  # small models, short generations: show the SWA KV going back
    max_running: int = 16
    max_context: int = 2048


def load(model: str) -> tuple[Decoder, Tokenizer]:
    """`tiny` (embedded), or a checkpoint directory."""
    if model == "tiny":
        return tiny_decoder(), Tokenizer(None)
    path = Path(model)
    if not path.is_dir():
        raise ValueError(f"--model must be 'tiny' or a checkpoint directory, got {model!r}")
    return load_decoder(path), Tokenizer(path)


def make_engine(decoder: Decoder, setup: Setup) -> Engine:
    cfg = decoder.spec.hybrid
    budget = sizing.gib_to_bytes(setup.kv_budget_gib)
    if setup.hybrid_memory and cfg.layer_mix != "full_only":
        sizes = sizing.size_hybrid(
            cfg, budget, ratio=setup.ratio, page_size=setup.page_size, dtype="fp32"
        )
    else:
        sizes = sizing.size_single_pool(cfg, budget, page_size=setup.page_size, dtype="fp32")
    model = HybridLM(decoder, implementation=setup.attention, interpret=setup.attention == "pallas")
    options = EngineOptions(
        max_running=setup.max_running,
        max_context=setup.max_context,
        chunk_size=setup.chunk_size,
        prefix_cache=setup.prefix_cache,
        eviction_interval=setup.eviction_interval,
    )
    return Engine(cfg, model, sizes, options)


def generate(engine: Engine, prompts: list[list[int]], params: SamplingParams):
    """Run all prompts together; returns the finished requests (in order) and a summary."""
    rids = [engine.add_request(p, params) for p in prompts]
    engine.run()
    m = engine.metrics
    summary = dict(
        steps=len(m),
        peak_full_used=max((x.full_used for x in m), default=0),
        peak_swa_used=max((x.swa_used for x in m), default=0),
        full_tokens=engine.sizes.full_tokens,
        swa_tokens=engine.sizes.swa_tokens,
        prefix_hit_tokens=engine.scheduler.hit_tokens,
        swa_freed_tokens=engine.scheduler.swa_freed_tokens,
        retractions=engine.scheduler.retractions,
    )
    return [engine.requests[r] for r in rids], summary


def teacher_forced_logits(engine: Engine, prompt: list[int]) -> np.ndarray:
    """Logits [len(prompt), vocab]: position i predicts token i + 1 (paged, hybrid memory on)."""
    rid = engine.add_request(prompt, SamplingParams(max_new_tokens=1), keep_logits=True)
    engine.run()
    return np.stack(engine.requests[rid].logits[: len(prompt)])


def read_prompts_file(path: str, tokenizer: Tokenizer) -> list[list[int]]:
    prompts = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        item = json.loads(line)
        if "prompt_ids" in item:
            prompts.append([int(t) for t in item["prompt_ids"]])
        elif "prompt" in item:
            prompts.append(tokenizer.encode(item["prompt"]))
        else:
            raise ValueError(f"{path}:{n}: each line needs 'prompt' or 'prompt_ids'")
    return prompts
