"""Compilation stays bounded: bucketed shapes and one program per step kind, not per length."""

from swajax.demo import demo_decoder
from swajax.models import HybridLM
from swajax.serving.sampling_params import SamplingParams


def test_a_600_token_generation_compiles_a_bounded_number_of_programs(tiny_engine):
    # 600 tokens outgrow the page-table buckets of 256 and 512 tokens, the second in the second
    # half of the generation.
    engine = tiny_engine(
        full=1024, ps=4, chunk=64, model=HybridLM(demo_decoder()), max_context=700, max_running=2
    )
    rid = engine.add_request(list(range(10, 30)), SamplingParams(temperature=0.0, max_tokens=600))
    engine.run()
    assert len(engine.requests[rid].output) == 600
    compiled = [m.compilations for m in engine.metrics]
    # Decode programs differ only by the bucket of the full page table (powers of two), so the
    # count grows with log(context), never with the number of steps.
    assert compiled[-1] <= 24, compiled[-1]
    assert compiled[-1] - compiled[len(compiled) // 2] <= 4
