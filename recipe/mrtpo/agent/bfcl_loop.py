"""BFCL v4 multi-turn as a verl 0.9.1 agent loop, registered as ``bfcl_multi_turn`` (a row's ``agent_name``).

Protocol (BFCL's ``base_handler.inference_multi_turn_*``, inside verl's Continuous Token rollout)
    The prompt is the row's ``raw_prompt`` (its first turn) rendered with ``tools=`` the row's function
    specs (``extra_info["tools"]``, :mod:`.bfcl_env`), as verl's ``ToolAgentLoop`` renders its tools. Each user
    turn runs steps: the model generates; a text with no ``<tool_call>`` ends the turn (BFCL: an empty
    decode proceeds to the next turn); otherwise every call of the step is executed in order against the
    trajectory's own backends (:class:`.bfcl_env.BFCLEnv`) and each result comes back as a ``tool`` message
    (verl's tool turn through the chat template); then the model generates again. The next turn's user
    messages are appended as ``user`` messages; at a miss_func turn the held-out specs come in that message,
    before BFCL's "I have updated some more functions ..." (:func:`.bfcl_env.injected_turn`).
    A step that opened a ``<tool_call>`` but does not decode (:func:`.bfcl_env.decode_step`) is, by
    ``on_decode_error``, an error message back to the model as a tool message (``feedback``, the default)
    or the end of the turn (``end_turn``, BFCL's own protocol, for evaluations comparable to BFCL's).

Bounds (every one counted in ``extra_fields["bfcl_loop"]["reasons"]`` when it acts)
    ``max_steps_per_turn`` (BFCL's ``MAXIMUM_STEP_LIMIT`` = 20: past it BFCL force-quits the whole
    entry, and so does this loop; reason ``step_limit``); the generations of a trajectory at most verl's
    ``multi_turn.max_assistant_turns`` (when set; else turns x ``max_steps_per_turn`` bounds them;
    ``total_step_limit``); ``max_calls_per_step`` (more is a decode error, ``too_many_calls``);
    ``call_timeout_s`` per call (``call_timeout``: the backends' child process is killed and the trajectory
    ends; ``env_lost`` when the child dies, e.g. at its memory cap ``memory_limit_mb``); ``trajectory_timeout_s`` on the wall clock (``trajectory_timeout``); each generation's
    ``max_tokens`` is the response budget left (at most ``max_step_tokens``), a context that would fill the
    budget is not appended (``response_length``) so the response never exceeds ``rollout.response_length``;
    a tool result longer than verl's ``multi_turn.max_tool_response_length`` is cut on verl's
    ``tool_response_truncate_side`` (``tool_output_truncated``; BFCL cuts nothing: long_context needs a
    large value).

Masks and spans
    ``response_mask`` is 1 exactly on the model's generated tokens; tool results, injected user turns and
    the template's boundary tokens Continuous Token inserts are 0 (verl's ``align_response_metadata``).
    ``extra_fields["bfcl_spans"]``: ``[kind, start, end, turn, step]`` over response positions, kind
    ``model`` (mask 1), ``tool`` (results and error feedback), ``user`` (injected turns, step -1) or
    ``boundary`` (template tokens a Continuous Token builder inserts before a generation; none with Qwen's);
    the spans tile the response.

Record
    ``extra_fields["bfcl_trajectory"]``: :class:`recipe.mrtpo.tasks.multi_turn.trajectory.Trajectory` as a dict
    (per turn reached, per step the model's text, its BFCL call strings, its decode error);
    ``extra_fields["bfcl_loop"]``: ``end`` (``completed`` or the bound that ended it), ``reasons``
    (reason -> count), ``steps``, ``calls``, ``turns`` (of the entry), ``force_quit`` (BFCL's flag: the
    checker fails such an entry). verl turns every ``extra_fields`` key into a ``non_tensor_batch`` entry.

Knobs: keyword arguments of the loop, set in ``recipe/mrtpo/config/bfcl_agent_loop.yaml`` (verl's
``rollout.agent.agent_loop_config_path`` file), typed and checked by :class:`BFCLLoopConfig`.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Optional
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, _agent_loop_registry, register
from verl.utils.profiler import simple_timer

from recipe.mrtpo.agent.bfcl_env import AGENT_NAME, BFCLEnv, decode_step, injected_turn, parse_entry
from recipe.mrtpo.core.seeding import generation_seed
from recipe.mrtpo.tasks.multi_turn.trajectory import Step, Trajectory, Turn

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))

ON_DECODE_ERROR = ("feedback", "end_turn")
ISOLATIONS = ("process", "thread")
TRUNCATE_SIDES = ("left", "right", "middle")  # verl's multi_turn.tool_response_truncate_side values


@dataclass(frozen=True)
class BFCLLoopConfig:
    """The loop's knobs (documented in ``bfcl_agent_loop.yaml``); refuses values it cannot run."""

    max_steps_per_turn: int = 20  # BFCL's MAXIMUM_STEP_LIMIT; past it the trajectory is force-quit
    max_calls_per_step: int = 64  # calls one generation may make (at most tool_json.MAX_CALLS; BFCL's gold: up to 34)
    call_timeout_s: float = 10.0  # wall clock of one backend call
    trajectory_timeout_s: float = 900.0  # wall clock of the trajectory, generation included
    max_step_tokens: Optional[int] = None  # tokens one generation may take; None = the response budget left
    on_decode_error: str = "feedback"  # feedback (error message to the model) | end_turn (BFCL's protocol)
    isolation: str = "process"  # process (backends in a child process, killable) | thread (in the worker; tests)
    memory_limit_mb: int = 4096  # address space of the backends' child process (isolation: process)

    def __post_init__(self):
        from recipe.mrtpo.tasks.tool_json import MAX_CALLS

        for name in ("max_steps_per_turn", "max_calls_per_step"):
            v = getattr(self, name)
            if type(v) is not int or v < 1:
                raise ValueError(f"{AGENT_NAME}.{name} must be an int >= 1, got {v!r}")
        if self.max_calls_per_step > MAX_CALLS:
            raise ValueError(f"{AGENT_NAME}.max_calls_per_step must be <= {MAX_CALLS} (blocks the reader reads)")
        for name in ("call_timeout_s", "trajectory_timeout_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"{AGENT_NAME}.{name} must be a number > 0, got {v!r}")
        if self.max_step_tokens is not None and (type(self.max_step_tokens) is not int or self.max_step_tokens < 1):
            raise ValueError(f"{AGENT_NAME}.max_step_tokens must be null or an int >= 1, got {self.max_step_tokens!r}")
        if self.isolation not in ISOLATIONS:
            raise ValueError(f"{AGENT_NAME}.isolation must be one of {ISOLATIONS}, got {self.isolation!r}")
        if type(self.memory_limit_mb) is not int or self.memory_limit_mb < 256:
            raise ValueError(f"{AGENT_NAME}.memory_limit_mb must be an int >= 256, got {self.memory_limit_mb!r}")
        if self.isolation == "thread" and self.memory_limit_mb != 4096:  # a thread shares the worker's memory
            raise ValueError(f"{AGENT_NAME}.memory_limit_mb applies to isolation: process only")
        if self.on_decode_error not in ON_DECODE_ERROR:
            raise ValueError(f"{AGENT_NAME}.on_decode_error must be one of {ON_DECODE_ERROR}, got {self.on_decode_error!r}")


#: the keyword arguments verl's AgentLoopWorker passes to every agent loop (``_run_agent_loop``), and the
#: ``name`` key of an agent_loop_config_path entry (Hydra passes it with the knobs)
_VERL_KWARGS = frozenset({"trainer_config", "server_manager", "tokenizer", "processor", "hf_model_type",
                          "dataset_cls", "data_config", "name"})
_TEMPLATE_RENDERS_TOOLS: dict[tuple, bool] = {}


def truncate_tool_text(text: str, limit: int, side: str) -> str:
    """verl's ``ToolAgentLoop._call_tool`` cut of a long tool response (restated: it is inline there)."""
    if len(text) <= limit:
        return text
    if side == "left":
        return "(truncated)..." + text[-limit:]
    if side == "right":
        return text[:limit] + "...(truncated)"
    half = limit // 2
    return text[:half] + "...(truncated)..." + text[-half:]


@dataclass
class _State:
    """One trajectory's running state."""

    messages: list
    tools: list
    ids: list = field(default_factory=list)  # prompt + response so far
    mask: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    spans: list = field(default_factory=list)
    turns: list = field(default_factory=list)  # list of lists of Step
    reasons: Counter = field(default_factory=Counter)
    steps: int = 0
    calls: int = 0
    end: str = "completed"
    server_extra: dict = field(default_factory=dict)  # the server's extra fields, merged as verl's ToolAgentLoop does


class _Stop(Exception):
    """Ends the trajectory with a reason (a bound acted)."""

    def __init__(self, reason: str, counted: bool = False):
        super().__init__(reason)
        self.reason, self.counted = reason, counted  # counted: the event was counted where it happened


class BFCLMultiTurnAgentLoop(AgentLoopBase):
    """BFCL v4 multi-turn's inference protocol as a verl agent loop (module docstring)."""

    def __init__(self, *args, tools=None, **kwargs):
        knobs = {f.name for f in fields(BFCLLoopConfig)}
        unknown = set(kwargs) - knobs - _VERL_KWARGS
        if unknown:  # a mistyped knob in the agent-loop YAML would otherwise do nothing
            raise TypeError(f"{AGENT_NAME}: unknown knob(s) {sorted(unknown)}; knobs: {sorted(knobs)}")
        self.loop_config = BFCLLoopConfig(**{k: kwargs.pop(k) for k in list(kwargs) if k in knobs})
        kwargs.pop("name", None)
        # verl's worker passes its loaded tools to every loop; a BFCL row's tools are its entry's docs
        super().__init__(*args, **kwargs)
        mt = self.rollout_config.multi_turn
        self.response_length = int(self.rollout_config.response_length)
        self.max_assistant_turns = mt.get("max_assistant_turns")  # verl's defaults (rollout.yaml) when unset
        self.max_tool_response_length = int(mt.get("max_tool_response_length", 256))
        side = mt.get("tool_response_truncate_side", "middle")
        if side not in TRUNCATE_SIDES:
            raise ValueError(f"multi_turn.tool_response_truncate_side must be one of {TRUNCATE_SIDES}, got {side!r}")
        self.truncate_side = side

    # ------------------------------------------------------------------ verl's entry point

    async def run(self, sampling_params: dict[str, Any], priority: int = 0, **kwargs) -> AgentLoopOutput:
        extra_info = kwargs.get("extra_info") or {}
        entry = parse_entry(extra_info)
        st = _State(messages=[dict(m) for m in kwargs["raw_prompt"]], tools=[dict(t) for t in entry.tools])
        env = await self.loop.run_in_executor(None, self.make_env, entry)
        try:
            return await self._run(entry, env, st, sampling_params, priority)
        finally:
            env.close()

    async def _run(self, entry, env, st: _State, sampling_params, priority) -> AgentLoopOutput:
        cfg = self.loop_config
        metrics: dict[str, Any] = {}
        full_det = bool(getattr(self.rollout_config, "full_determinism", False))
        request_id = f"det-{int(priority)}" if full_det else uuid4().hex
        deadline = time.monotonic() + cfg.trajectory_timeout_s
        max_gens = self.max_assistant_turns or len(entry.turns) * cfg.max_steps_per_turn

        st.ids = await self.ct_build_initial_tokens(st.messages, tools=st.tools)
        await self._check_template_renders_tools(st)
        prompt_len = len(st.ids)
        try:
            for turn in range(len(entry.turns)):
                if turn > 0:
                    msgs = injected_turn(entry, turn)
                    if not await self._append_context(st, msgs, "user", turn, -1):
                        raise _Stop("response_length")
                st.turns.append([])
                await self._run_turn(st, env, turn, sampling_params, request_id, metrics, deadline, max_gens)
        except _Stop as stop:
            st.end = stop.reason
            if not stop.counted:
                st.reasons[stop.reason] += 1

        response_ids = st.ids[prompt_len:]
        if len(st.mask) > self.response_length:  # only a builder inserting tokens at an assistant merge gets here
            st.reasons["response_truncated"] += 1  # cut as verl's loops cut (response_ids[:response_length])
            n = self.response_length
            response_ids, st.mask, st.logprobs = response_ids[:n], st.mask[:n], st.logprobs[:n]
            st.spans = [[k, a, min(b, n), t, i] for k, a, b, t, i in st.spans if a < n]
        record = Trajectory(turns=tuple(Turn(steps=tuple(t)) for t in st.turns))
        extra = {
            # the server's fields first (min/max_global_steps: verl's v1 trainer reads them from every output)
            **st.server_extra,
            "bfcl_trajectory": record.to_dict(),
            "bfcl_spans": st.spans,
            "bfcl_loop": {"end": st.end, "reasons": dict(st.reasons), "steps": st.steps, "calls": st.calls,
                          "turns": len(entry.turns), "force_quit": st.end == "step_limit", "id": entry.id,
                          "config": asdict(cfg)},
            "turn_scores": [], "tool_rewards": [],  # the keys verl's own loops always set
        }
        return AgentLoopOutput(
            prompt_ids=st.ids[:prompt_len],
            response_ids=response_ids,
            response_mask=st.mask,
            response_logprobs=st.logprobs if st.logprobs else None,
            multi_modal_data={},
            num_turns=1 + sum(len(t) for t in st.turns) + max(0, len(st.turns) - 1),
            metrics=metrics,
            extra_fields=extra,
        )

    def make_env(self, entry):
        """The trajectory's own backends: fresh instances, in a child process (``isolation: process``,
        :class:`.bfcl_process.ProcessEnv`) or in this process (``thread``). Tests wrap this to inspect them."""
        if self.loop_config.isolation == "thread":
            return BFCLEnv(entry)
        from recipe.mrtpo.agent.bfcl_process import ProcessEnv

        return ProcessEnv(entry, memory_limit_bytes=self.loop_config.memory_limit_mb << 20)

    # ------------------------------------------------------------------ one user turn

    async def _run_turn(self, st: _State, env: BFCLEnv, turn: int, sampling_params, request_id, metrics,
                        deadline: float, max_gens: int) -> None:
        cfg = self.loop_config
        steps_here = 0
        while True:
            if st.steps >= max_gens:
                raise _Stop("total_step_limit")
            if time.monotonic() >= deadline:
                raise _Stop("trajectory_timeout")
            text = await self._generate(st, sampling_params, request_id, metrics, turn, len(st.turns[turn]))
            st.steps += 1
            dec = decode_step(text, cfg.max_calls_per_step)
            if not dec.attempted:  # the model answered without a call: the turn is over
                st.turns[turn].append(Step(text=text))
                return
            if dec.error is not None:
                st.reasons[dec.reason] += 1
                st.turns[turn].append(Step(text=text, error=dec.error))
                if cfg.on_decode_error == "end_turn":
                    return
                results = [f"Error: the tool call could not be decoded: {dec.error}"]
            else:
                st.turns[turn].append(Step(text=text, calls=dec.strings))
                st.calls += len(dec.calls)
                results = await self._execute(st, env, dec.calls, deadline, metrics)
            msgs = [{"role": "tool", "content": r} for r in results]
            if not await self._append_context(st, msgs, "tool", turn, len(st.turns[turn]) - 1):
                raise _Stop("response_length")
            if env.poisoned:  # a call timed out or the backends' process ended: they cannot be trusted
                raise _Stop(env.stop_reason or "call_timeout", counted=True)
            steps_here += 1
            if steps_here > cfg.max_steps_per_turn:  # BFCL: count > MAXIMUM_STEP_LIMIT -> force quit
                raise _Stop("step_limit")

    async def _generate(self, st: _State, sampling_params, request_id, metrics, turn: int, step: int) -> str:
        budget = self.response_length - len(st.mask)
        if budget <= 0:
            raise _Stop("response_length")
        max_tokens = min(budget, self.loop_config.max_step_tokens or budget)
        params = {**sampling_params, "max_tokens": max_tokens}
        if params.get("seed") is not None:  # a seeded request (recipe.mrtpo.rollout.rollout_seed): a stream per generation
            params["seed"] = generation_seed(int(params["seed"]), st.steps)
        with simple_timer("generate_sequences", metrics):
            out = await self.server_manager.generate(request_id=request_id, prompt_ids=st.ids, sampling_params=params)
        token_ids = list(out.token_ids)[:max_tokens]  # a server that ignores max_tokens cannot overrun the budget
        merge_server_extra(st.server_extra, dict(getattr(out, "extra_fields", None) or {}))
        log_probs = list(out.log_probs)[: len(token_ids)] if out.log_probs else None
        if metrics.get("num_preempted") is None:
            metrics["num_preempted"] = out.num_preempted if out.num_preempted is not None else -1
        start = len(st.mask)
        merge, mask, lps = await self.ct_merge_assistant_token(
            st.ids, token_ids, st.mask, st.logprobs if (st.logprobs or log_probs) else None,
            assistant_logprobs=log_probs)
        st.ids, st.mask = merge.token_ids, mask
        if lps is not None:
            st.logprobs = lps
        start -= merge.removed_prefix_token_count
        if merge.inserted_token_ids:  # template tokens the builder inserts before the generation (none for Qwen's)
            st.spans.append(["boundary", start, start + len(merge.inserted_token_ids), turn, step])
            start += len(merge.inserted_token_ids)
        st.spans.append(["model", start, len(mask), turn, step])
        # the text without the end-of-turn token(s), special tokens inside kept: a tokenizer may mark <tool_call>
        # special, and verl's tool parsers decode with skip_special_tokens=False too
        end = len(token_ids)
        special = set(getattr(self.tokenizer, "all_special_ids", None) or ())
        while end and token_ids[end - 1] in special:
            end -= 1
        text = self.tokenizer.decode(token_ids[:end], skip_special_tokens=False)
        st.messages.append({"role": "assistant", "content": text})
        return text

    async def _execute(self, st: _State, env: BFCLEnv, calls, deadline: float, metrics) -> list[str]:
        cfg = self.loop_config
        results = []
        with simple_timer("tool_calls", metrics):
            for call in calls:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _Stop("trajectory_timeout")
                if call["name"] in _held_out_later(env, len(st.turns) - 1):
                    st.reasons["held_out_called_early"] += 1  # BFCL executes it too; counted to be seen
                res = await self.loop.run_in_executor(
                    None, env.execute, call["name"], call["arguments"], min(cfg.call_timeout_s, left))
                if res.reason:
                    st.reasons[res.reason] += 1
                text = res.text
                if len(text) > self.max_tool_response_length:
                    st.reasons["tool_output_truncated"] += 1
                    text = truncate_tool_text(text, self.max_tool_response_length, self.truncate_side)
                results.append(text)
                if env.poisoned:
                    break
        return results

    async def _append_context(self, st: _State, msgs: list, kind: str, turn: int, step: int) -> bool:
        """Append tool / user messages (mask 0) if they leave room for a generation; False if not."""
        updated = st.messages + msgs
        merge, mask, lps = await self.ct_merge_context_msg(
            st.messages, updated, st.ids, st.mask, st.logprobs if st.logprobs else None, tools=st.tools)
        if len(mask) >= self.response_length:
            return False
        st.spans.append([kind, len(st.mask) - merge.removed_prefix_token_count, len(mask), turn, step])
        st.ids, st.mask, st.messages = merge.token_ids, mask, updated
        if st.logprobs:
            st.logprobs = lps or []
        return True

    async def _check_template_renders_tools(self, st: _State) -> None:
        """Refuse a chat template that ignores ``tools=``: the model would never see the functions."""
        template = getattr(self.tokenizer, "chat_template", None)
        key = (id(self.tokenizer), str(template), repr(sorted(self.apply_chat_template_kwargs.items())))
        if key not in _TEMPLATE_RENDERS_TOOLS:
            bare = await self.ct_build_initial_tokens(st.messages, tools=None)
            _TEMPLATE_RENDERS_TOOLS[key] = list(bare) != list(st.ids)
        if not _TEMPLATE_RENDERS_TOOLS[key]:
            raise ValueError(f"{AGENT_NAME}: the chat template renders nothing for tools=; the model would not see "
                             "BFCL's functions (use a template with a tools section, e.g. Qwen2.5's)")


def register_unless_configured(registry: dict, name: str, cls) -> None:
    """Register ``cls`` under ``name`` in verl's agent-loop registry unless an entry is already there.

    verl's worker puts the ``agent_loop_config_path`` entries (with their knobs) in the registry, then imports
    this module inside the first trajectory's ``hydra.utils.instantiate``; a plain ``@register`` here would then
    overwrite the YAML's entry with a knob-less one, and every later trajectory would run on the defaults (found
    by the multi-turn e2e run: ``max_step_tokens`` acted on the first trajectory only)."""
    if name not in registry:
        register(name)(cls)


def merge_server_extra(acc: dict, new: dict) -> None:
    """verl's ``ToolAgentLoop`` merge of each generation's ``TokenOutput.extra_fields`` (restated: it is inline
    there): the first generation's fields whole (``min_global_steps``, ``global_steps``), later ones update
    ``max_global_steps`` and add up the speculative-decoding counts. verl's v1 trainer reads min/max_global_steps
    of every output (``_compute_metrics``); a loop that drops them fails the step."""
    from verl.experimental.agent_loop.tool_agent_loop import SPEC_DECODE_EXTRA_KEYS

    if not acc:
        acc.update(new)
        return
    if new.get("max_global_steps", None):
        acc["max_global_steps"] = new["max_global_steps"]
    for key in SPEC_DECODE_EXTRA_KEYS:
        if key in new and key in acc:
            acc[key] = int(acc[key]) + int(new[key])


def _held_out_later(env: BFCLEnv, turn: int) -> set:
    """Names of functions held out until a turn after ``turn`` (miss_func)."""
    return {d["function"]["name"] for t, specs in env.entry.held_out.items() if t > turn for d in specs}


register_unless_configured(_agent_loop_registry, AGENT_NAME, BFCLMultiTurnAgentLoop)
