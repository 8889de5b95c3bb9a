"""Is a parallel layout valid for this model and this engine: the one home of the rule.

Two questions, each answered with reasons that name the sizes (empty: valid):

* ``ep_problems``: the expert-parallel group as each engine builds it. EP never adds GPUs;
  it spreads the experts over GPUs the layout already has.

  - vLLM 0.32 (``--enable-expert-parallel`` is a switch): the MoE group spans TP x PCP x DP
    (``model_executor/layers/fused_moe/config.py``, ``flatten_tp_across_dp_and_pcp``), so
    ``ep`` is 1 or tp x pcp x dp.
  - SGLang 0.4.10-0.5.23: the EP group lies inside the TP group; each scheduler's EP rank is
    ``tp_rank // (tp_size // ep_size)`` (``entrypoints/engine.py``), the rest of the TP group
    shards each expert (``moe_tp_size = tp_size // ep_size``): ``ep`` divides ``tp``
    (``ep < tp`` is SGLang's hybrid EP+TP; docs ``advanced_features/expert_parallelism.md``).
  - the simulated engine lays experts out as vLLM does (and as SGLang does with DP
    attention, which it models as dp): over every GPU of the instance, tp x pcp x dp.
  - TGI has no expert parallelism.

* ``shape_problems``: the sizes a model's shape can take, where the shape is known (the
  simulated engine's presets). Attention heads are split over TP ranks (vLLM
  ``ModelConfig.verify_with_parallel_config``: heads divisible by tp); KV heads are split,
  or replicated when tp exceeds them (vLLM ``QKVParallelLinear``: one divides the other);
  pipeline stages each need a layer; EP ranks each need an expert, and a dense model has
  none to spread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class ModelShape(Protocol):
    """What a layout check reads of a model (the simulated engine's ``ModelSpec`` has it)."""

    @property
    def name(self) -> str: ...
    @property
    def heads(self) -> int: ...
    @property
    def kv_heads(self) -> int: ...
    @property
    def layers(self) -> int: ...
    @property
    def experts(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Layout:
    """The integer parallel sizes of one configuration (``launch.config.ParallelConfig``'s axes)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    dcp: int = 1
    pcp: int = 1

    @property
    def moe_group(self) -> int:
        """GPUs of one pipeline stage that the MoE layers may spread experts over (tp x pcp x dp)."""
        return self.tp * self.pcp * self.dp


#: How messages name an engine.
_LABEL = {"vllm": "vLLM", "sglang": "SGLang", "sim": "the simulated engine", "tgi": "TGI"}


def ep_problems(engine: str, layout: Layout) -> list[str]:
    """Why ``engine`` cannot build ``layout``'s EP group (empty: it can, or ep is 1)."""
    ep = layout.ep
    if ep <= 1:
        return []
    if engine == "tgi":
        return [f"TGI has no expert parallelism: ep={ep}"]
    if engine == "sglang":
        tp = layout.tp
        if tp % ep == 0:
            return []
        head = f"ep={ep} needs {ep} GPUs, the TP group has {tp}" if ep > tp else f"ep={ep} does not divide tp={tp}"
        return [f"{head}: SGLang's EP group lies within the TP group, so ep must divide tp"]
    rule = {
        "vllm": "vLLM's expert parallelism is a switch whose width is tp×pcp×dp",
        "sim": "the simulated engine spreads experts over every GPU of an instance, tp×pcp×dp",
    }.get(engine)
    group = layout.moe_group
    if rule is None or ep == group:
        return []
    head = (f"ep={ep} needs {ep} GPUs, the layout has {group} (tp×pcp×dp)" if ep > group
            else f"ep={ep} does not span the layout's {group} GPUs (tp×pcp×dp)")  # fmt: skip
    allowed = f"ep must be 1 or {group}" if group > 1 else "ep must be 1 here"
    return [f"{head}: {rule} ({group}), so {allowed}"]


def shape_problems(layout: Layout, shape: ModelShape) -> list[str]:
    """Why ``shape`` cannot be split as ``layout`` says (empty: it can)."""
    out: list[str] = []
    name, tp = shape.name, layout.tp
    if shape.heads and shape.heads % tp:
        out.append(f"{name} has {shape.heads} attention heads: tp must divide them, not {tp}")
    kv = shape.kv_heads
    if kv and not shape.heads % tp and (kv % tp if tp <= kv else tp % kv):
        out.append(f"{name} has {kv} KV heads: tp={tp} must divide them or be a multiple of them")
    if layout.pp > shape.layers:
        out.append(f"{name} has {shape.layers} layers: pp={layout.pp} would leave stages without one")
    if layout.ep > 1:
        if not shape.experts:
            out.append(f"{name} is not a mixture of experts: ep must be 1, not {layout.ep}")
        elif layout.ep > shape.experts:
            out.append(f"{name} has {shape.experts} experts: ep={layout.ep} would leave GPUs without one")
    return out


def layout_problems(engine: str, layout: Layout, shape: ModelShape | None = None) -> list[str]:
    """Every reason ``engine`` cannot run ``layout`` of ``shape`` (None: shape unknown, not checked)."""
    return ep_problems(engine, layout) + (shape_problems(layout, shape) if shape is not None else [])


def engine_label(engine: str) -> str:
    return _LABEL.get(engine, engine)
