"""The library's entry layer: building engines from a checkpoint or a model, and running them.
Everything above it (the simulator, trace record / replay, the conformance kit, the CLI) and
every script builds engines through here."""

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
