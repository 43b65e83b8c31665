"""Does a model compile and fit on a TPU chip, before anyone rents one (`swajax compile-check`).

The decoder is built as shapes only (no weight is read or made) and the engine schedules a
prompt and a batch of decoding requests as usual while each step program it launches is
recorded instead of run (`runner.program_store.recording`). The memory fraction of the chip's
HBM holds the weights, the pools and the steps' temporaries: a first compile with small pools
measures the temporaries, and the pools are sized (the ratio, the context) for what is left,
then everything is compiled again at that size.
Each program is then compiled by the TPU compiler for that chip (`swajax.tpu`): Mosaic
compiles the kernels, XLA the program, and the executable says what it needs
(`memory_analysis`: compiled here) and what XLA's TPU cost model thinks it costs
(`cost_analysis`: modeled, never measured).
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np
from flax import nnx

from swajax import platform, tpu
from swajax.errors import InputError
from swajax.sizing import SizingError

PROMPT = 40  # tokens of the prompt each recorded request brings


@dataclasses.dataclass(frozen=True)
class ProgramCost:
    """One compiled step program: bytes compiled here, cost modeled by XLA."""

    name: str  # prefill, decode; a warm-up's: "warm-up decode (8 tokens)"
    rows: int  # requests in the step
    argument_bytes: int
    output_bytes: int
    alias_bytes: int  # outputs that reuse an argument's buffer (the donated state)
    temp_bytes: int
    compile_seconds: float
    flops: float  # modeled
    bytes_accessed: float  # modeled (a kernel's from its `pl.CostEstimate`)
    # XLA's own modeled time, where it gives one: for whole step programs libtpu 0.0.42's is
    # negative (no model), so None; the bytes it models at the chip's bandwidth are below.
    xla_seconds: float | None
    bandwidth_seconds: float  # bytes_accessed at the chip's HBM bandwidth

    @property
    def peak_bytes(self) -> int:
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes


@dataclasses.dataclass(frozen=True)
class CompileReport:
    model: str
    slice: str
    device_kind: str
    hbm_bytes: int
    hbm_bytes_per_s: float
    memory_fraction: float
    weight_bytes: int
    full_tokens: int
    swa_tokens: int
    chips: int  # the program is split over this many (tensor parallel); figures are per chip
    pool_bytes: int  # both pools on one chip, as compiled (the programs' pool arguments)
    page_size: int
    max_context: int
    programs: tuple[ProgramCost, ...]

    @property
    def peak_bytes(self) -> int:
        return max(p.peak_bytes for p in self.programs)

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.hbm_bytes

    def roofline_seconds(self, rows: int) -> float:
        """Every weight of a chip read once at its HBM bandwidth: a dense model's decode floor
        at `rows` requests (the KV each reads comes on top); a mixture of experts reads only
        its routed experts, so XLA's modeled bytes can be fewer (gpt-oss-20b on a v6e chip:
        3.35 GB modeled against 12.8 GiB of weights)."""
        del rows  # the weights are read once whatever the batch
        return self.weight_bytes / self.hbm_bytes_per_s

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out.update(peak_bytes=self.peak_bytes, fits=self.fits)
        for program, row in zip(self.programs, out["programs"]):
            row["peak_bytes"] = program.peak_bytes
            if program.name == "decode":
                row["roofline_seconds"] = self.roofline_seconds(program.rows)
        out["figures"] = {"bytes": "compiled here", "seconds": "modeled by XLA's TPU cost model"}
        return out


TEMP_MARGIN = 1.05  # over the first pass's temporaries, for what larger pools add


class DoesNotFit(InputError):
    """The model's weights or its step programs exceed the chip's memory."""


def _positive(value) -> float | None:
    return float(value) if value is not None and float(value) > 0 else None


def _chip_bytes(tree) -> int:
    """Bytes of `tree` on one chip: a leaf split over a mesh counts its shard."""
    total = 0
    for x in jax.tree.leaves(tree):
        if not hasattr(x, "dtype"):
            continue
        sharding = getattr(x, "sharding", None)
        shape = x.shape if sharding is None else sharding.shard_shape(x.shape)
        total += int(np.prod(shape, dtype=np.int64)) * x.dtype.itemsize
    return total


def compile_check(
    hf_config: dict,
    slice_name: str,
    *,
    name: str = "model",
    memory_fraction: float = 0.9,
    ratio: float | None = None,
    max_context: int = 32768,
    page_size: int | None = None,
    kv_dtype: str | None = None,
    batch: int = 64,
    dtype: str = "bfloat16",
    hybrid_memory: bool = True,
    temporaries: int | None = None,
    warm_up: bool = False,
) -> CompileReport:
    """Size, record and compile `hf_config`'s prefill and decode programs (decode at one request
    and at `batch`) for `slice_name`: one chip, or split over its chips. `temporaries`: bytes a
    chip keeps for the steps' temporaries (None: measured by a first compile). `warm_up`: also
    every step program a server's warm-up makes at these sizes (each fixed shape the scheduler
    can reach), in the final compile."""
    from swajax.models.decoder import decoder_for
    from swajax.models.loading import decoder_spec

    chip = tpu.parse_slice(slice_name)
    if not 0 < memory_fraction <= 1:
        raise InputError(f"memory fraction {memory_fraction} must be in (0, 1]")
    missing = tpu.libtpu_missing()
    if missing:
        raise InputError(missing)
    devices = tpu.devices(chip)
    device, gen = devices[0], chip.generation
    mesh = None
    if chip.chips > 1:  # split over the slice's chips as the engine splits (KV heads, MLP)
        from jax.sharding import Mesh

        from swajax.memory.mesh_axis import AXIS

        mesh = Mesh(np.array(devices), (AXIS,))
    with platform.lowering_for("tpu"):
        spec = decoder_spec(dict(hf_config), dtype=dtype)
        decoder = nnx.eval_shape(lambda: decoder_for(spec))
    state = nnx.state(decoder)
    if mesh is not None:
        from swajax.models import sharding

        sharding.check_divisible(spec, mesh)
        state = sharding.shard_state(state, mesh)
    weights = _chip_bytes(state)
    usable = int(gen.hbm_bytes * memory_fraction)
    where = f"one {gen.name} chip" if mesh is None else f"each of {chip.chips} {gen.name} chips"
    if weights >= usable:
        raise DoesNotFit(
            f"{name}'s weights take {weights / 2**30:.2f} GiB a chip, more than the "
            f"{usable / 2**30:.2f} GiB usable on {where} ({memory_fraction:g} of "
            f"{gen.hbm_bytes / 2**30:g} GiB): it needs a larger chip or more of them"
        )
    # The pools split over the chips by KV head (DeepSeek-V4's one shared head: replicated).
    split = chip.chips if mesh is not None and spec.v4 is None else 1
    fits = dict(name=name, where=where, usable=usable, memory_fraction=memory_fraction)
    build = dict(
        decoder=decoder,
        mesh=mesh,
        device=device,
        gen=gen,
        batch=batch,
        spec=dict(
            max_context=max_context,
            ratio=ratio,
            page_size=page_size,
            kv_dtype=kv_dtype,
            max_running=max(batch, 1),
            hybrid_memory=hybrid_memory,
            chunk_size=64,
            decode_steps=1,
        ),
    )
    # First pass: the programs' temporaries with a quarter of the room as pools (they hardly
    # depend on the pools' size); second: the pools get what the weights and those
    # temporaries leave, and everything is compiled again at that size.
    room = usable - weights
    temps = temporaries
    if temps is None:
        try:
            _, probe = _compiled(kv_bytes=split * room // 4, fits=fits, **build)
        except SizingError:  # a quarter holds no request (a long window): the whole room
            _, probe = _compiled(kv_bytes=split * room, fits=fits, **build)
        temps = int(max(p.temp_bytes for p in probe) * TEMP_MARGIN)
    if temps >= room:
        raise DoesNotFit(
            f"{name}'s step programs need {temps / 2**30:.2f} GiB of temporaries a chip beside "
            f"{weights / 2**30:.2f} GiB of weights: more than the {usable / 2**30:.2f} GiB usable "
            f"on {where} ({memory_fraction:g} of {gen.hbm_bytes / 2**30:g} GiB)"
        )
    engine, programs = _compiled(
        kv_bytes=split * (room - temps), fits=fits, warm_up=warm_up, **build
    )
    runner = engine.runner
    return CompileReport(
        model=name,
        slice=chip.name,
        device_kind=device.device_kind,
        hbm_bytes=gen.hbm_bytes,
        hbm_bytes_per_s=gen.hbm_bytes_per_s,
        memory_fraction=memory_fraction,
        weight_bytes=weights,
        chips=chip.chips,
        full_tokens=engine.sizes.full_tokens,
        swa_tokens=engine.sizes.swa_tokens,
        pool_bytes=_chip_bytes(runner.pools),
        page_size=engine.sizes.page_size,
        max_context=max_context,
        programs=programs,
    )


def _compiled(*, decoder, mesh, device, gen, batch, spec, kv_bytes, fits, warm_up=False):
    """Record the engine's prefill and decode (at 1 and `batch` requests), and with `warm_up`
    every program a warm-up makes, with `kv_bytes` of pools, and compile each for the slice:
    (the engine, its `ProgramCost`s)."""
    from swajax.api.engine_spec import EngineSpec, make_engine
    from swajax.runner import program_store
    from swajax.serving.sampling_params import SamplingParams

    engine_spec = EngineSpec.of(kv_budget_gib=kv_bytes / 2**30, **spec)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    recorded = {}
    with platform.lowering_for("tpu"):
        for rows in sorted({1, batch}):
            calls: list = []
            with program_store.recording(calls):
                engine = make_engine(decoder, engine_spec, mesh=mesh)
                for r in range(rows):
                    engine.add_request([3 + (r + i) % 97 for i in range(PROMPT)], params)
                engine.run()
            steps = [c for c in calls if c.fn.__name__ == "fused_step"]
            if rows == 1:
                recorded[("prefill", 1)] = steps[0]
            recorded[("decode", rows)] = steps[-1]
        if warm_up:
            calls = []
            with program_store.recording(calls):
                warm = make_engine(decoder, engine_spec.replace(warmup=True), mesh=mesh)
                warm.warm_up()
            for call in calls:  # variants of one shape (the step's optional parts) numbered
                name, rows = _warm_up_name(call)
                same = sum(n.startswith(name) and r == rows for n, r in recorded)
                recorded[(f"{name} #{same + 1}", rows)] = call
    programs = []
    for (kind, rows), call in recorded.items():
        start = time.perf_counter()
        try:
            if mesh is None:
                compiled = tpu.compile_on(device, call.fn, *call.args, **call.statics)
            else:
                compiled = tpu.compile_on_mesh(mesh, call.fn, *call.args, **call.statics)
        except jax.errors.JaxRuntimeError as e:
            if "RESOURCE_EXHAUSTED" not in str(e):
                raise
            said = str(e).split("RESOURCE_EXHAUSTED:", 1)[1].strip().splitlines()[0]
            raise DoesNotFit(
                f"{fits['name']}'s {kind} program ({rows} request{'s' * (rows > 1)}) does not "
                f"fit {fits['where']} with {fits['usable'] / 2**30:.2f} GiB for weights, pools "
                f"and temporaries (--memory-fraction {fits['memory_fraction']:g}): the TPU "
                f"compiler says: {said}"
            ) from None
        seconds = time.perf_counter() - start
        memory = compiled.memory_analysis()
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        programs.append(
            ProgramCost(
                name=kind,
                rows=rows,
                argument_bytes=memory.argument_size_in_bytes,
                output_bytes=memory.output_size_in_bytes,
                alias_bytes=memory.alias_size_in_bytes,
                temp_bytes=memory.temp_size_in_bytes,
                compile_seconds=seconds,
                flops=float(cost.get("flops", 0.0)),
                bytes_accessed=float(cost.get("bytes accessed", 0.0)),
                xla_seconds=_positive(cost.get("optimal_seconds")),
                bandwidth_seconds=float(cost.get("bytes accessed", 0.0)) / gen.hbm_bytes_per_s,
            )
        )
    return engine, tuple(programs)


def _warm_up_name(call) -> tuple[str, int]:
    """A warm-up program's (name, requests): its kind and tokens, from its static layout."""
    statics = call.statics
    kind = "round" if call.fn.__name__ == "fused_round" else "prefill"
    if kind == "prefill" and statics.get("decode"):
        kind = "decode"
    rows = dict((name, shape) for name, shape, _ in statics["layout"])["rows"][0]
    return f"warm-up {kind} ({statics['meta_shape'].num_tokens} tokens)", rows
