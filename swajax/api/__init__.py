"""The library's entry layer: building engines from a checkpoint or a model, and running them.
Everything above it (the simulator, trace record / replay, the conformance kit, the CLI) and
every script builds engines through here; `LLM` is the front door for inference scripts."""

from swajax.api.engine_spec import (
    EngineSpec as EngineSpec,
    engine_for as engine_for,
    load_model as load_model,
    make_engine as make_engine,
)
from swajax.api.generation import (
    generate as generate,
    teacher_forced_logits as teacher_forced_logits,
)
from swajax.api.llm import (
    LLM as LLM,
    CompletionOutput as CompletionOutput,
    RequestOutput as RequestOutput,
    StreamEvent as StreamEvent,
)
