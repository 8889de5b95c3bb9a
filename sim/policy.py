"""Scheduling policies of the engine profiles: what one step of an instance may carry.

Engines differ less in their kernels than in how they mix prefill and decode work:

* ``v1-chunked`` (vLLM V1, Sarathi-style): every step carries the running decodes first,
  then prefill chunks up to the token budget; a long prompt is split across steps, so a
  new prompt slows the decodes of that step but never stops them.
* ``v0-prefill-first`` (vLLM V0 without chunked prefill, the default up to 0.6 for
  context lengths up to 32K): when requests are waiting, the step is a prefill-only step
  of whole prompts and every running stream stalls for it. With multi-step scheduling
  (``scheduler_steps`` > 1, vLLM 0.6 ``--num-scheduler-steps``) a prefill can only start
  after the current run of decode steps.
* ``sglang-prefill-first`` (SGLang's default scheduler, mixed chunks off): a waiting
  request gets a prefill ("extend") step that stalls the decodes, but prompts longer than
  the chunk size are split, and a split prompt continues in the next prefill step.
* ``tgi-waiting-ratio`` (TGI v2 router): a new prefill batch joins a running batch only
  when the waiting requests number at least ``waiting_served_ratio`` x the running ones,
  or after ``max_waiting_steps`` decode steps; prompts are prefilled whole and the running
  batch stalls for it.

New engine behaviours (e.g. TGI re-queueing long generations in segments) belong here as
a field of ``SchedulingPolicy`` read by ``sim.scheduler.Instance`` (``prefill_turn`` and
the step planner), so the cost model and the backends stay untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

POLICY_NAMES = ("v1-chunked", "v0-prefill-first", "sglang-prefill-first", "tgi-waiting-ratio")


@dataclass(frozen=True, slots=True)
class SchedulingPolicy:
    name: str
    #: decodes ride along with prefill chunks in one step (False: a prefill step stalls them)
    mixed: bool
    #: a prompt longer than the step's token budget is split across steps (False: prefilled whole)
    chunked: bool
    #: decode steps in a row before a prefill may start while requests run (multi-step)
    scheduler_steps: int = 1
    #: TGI: prefill while a batch runs only when waiting >= ratio x running ...
    waiting_served_ratio: float = 0.0
    #: ... or once this many decode steps have passed since the last prefill (0: no such rule)
    max_waiting_steps: int = 0

    def prefill_turn(self, waiting: int, running: int, in_prefill: int, decode_steps: int) -> bool:
        """Whether a non-mixed policy runs a prefill step now.

        ``waiting``: requests ready to be admitted; ``running``: requests holding a slot;
        ``in_prefill``: running requests whose (chunked) prompt is not finished;
        ``decode_steps``: decode steps since the last prefill step.
        """
        if in_prefill:
            return True
        if not waiting:
            return False
        decoding = running - in_prefill
        if decoding <= 0:
            return True
        if decode_steps % self.scheduler_steps:
            return False  # inside a multi-step run: prefills start at run boundaries
        if self.waiting_served_ratio <= 0:
            return True
        if self.max_waiting_steps and decode_steps >= self.max_waiting_steps:
            return True
        return waiting >= int(decoding * self.waiting_served_ratio)


def make_policy(name: str, scheduler_steps: int = 1, waiting_served_ratio: float = 1.2,
                max_waiting_steps: int = 20) -> SchedulingPolicy:
    """The policy ``name`` with the profile's knobs (TGI defaults: ratio 1.2, 20 steps)."""
    if name == "v1-chunked":
        return SchedulingPolicy(name, mixed=True, chunked=True)
    if name == "v0-prefill-first":
        return SchedulingPolicy(name, mixed=False, chunked=False, scheduler_steps=max(1, scheduler_steps))
    if name == "sglang-prefill-first":
        return SchedulingPolicy(name, mixed=False, chunked=True)
    if name == "tgi-waiting-ratio":
        return SchedulingPolicy(name, mixed=False, chunked=False, waiting_served_ratio=waiting_served_ratio,
                                max_waiting_steps=max_waiting_steps)
    raise ValueError(f"unknown scheduling policy {name!r}; known: {', '.join(POLICY_NAMES)}")
