"""Multi-turn evaluation: BFCL v4 multi-turn questions played through the training's own agent loop.

The loop is :class:`recipe.mrtpo.agent.bfcl_loop.BFCLMultiTurnAgentLoop`, the one verl's rollout runs in
training, built as verl's ``AgentLoopWorker`` builds it (its knobs read from the same
``recipe/mrtpo/config/bfcl_agent_loop.yaml``), one instance per trajectory. What verl's server manager
gives it (``await server_manager.generate(request_id, prompt_ids=..., sampling_params=...)`` returning a
``TokenOutput``) is given here by :class:`BatchingServer` over the evaluation's generator
(:mod:`.generation`'s ``generate_ids``: transformers or vLLM): the requests of the trajectories that run
at once are gathered into one batch, so vLLM sees as many prompts as are waiting.

Per question the loop plays every user turn (tool results fed back, the next turn and miss_func's
held-out functions injected, BFCL's step limit), and the record it writes
(``extra_fields["bfcl_trajectory"]``) is scored by the multi-turn task's verifier
(:func:`recipe.mrtpo.tasks.multi_turn.verifier.score`: BFCL's checker, run on fresh backends).

Settings that differ from training, each for BFCL's evaluation protocol:

- ``on_decode_error`` is ``end_turn`` by default (``--on-decode-error``): a step that opens a
  ``<tool_call>`` that does not decode ends the turn, as BFCL's inference does; training's ``feedback``
  (an error message back to the model) is selectable;
- neither the prompt (verl's ``prompt_length``) nor tool results are cut (verl's ``max_tool_response_length`` set past any output): BFCL cuts nothing,
  and long_context's outputs are long by design;
- ``--response-length`` is the budget of the whole trajectory (model tokens, tool results and injected
  turns together; verl's ``rollout.response_length``), ``--max-new-tokens`` the budget of one generation
  (the loop's ``max_step_tokens``).

Public names: :data:`LOOP_YAML`, :func:`loop_knobs`, :class:`BatchingServer`, :class:`MultiTurnRunner`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional

from recipe.mrtpo.step.dump import SPANS_KEY  # the loop's spans, as the trainer's dumps read them
from recipe.mrtpo.tools.eval.generation import Generation
from recipe.mrtpo.tools.eval.items import EvalError, Item

__all__ = ["LOOP_YAML", "NO_TOOL_CUT", "ON_DECODE_ERROR", "DEFAULT_RESPONSE_LENGTH", "loop_knobs", "model_type",
           "BatchingServer", "MultiTurnRunner"]

#: the agent-loop file training passes to verl (``rollout.agent.agent_loop_config_path``)
LOOP_YAML = Path(__file__).resolve().parents[2] / "config" / "bfcl_agent_loop.yaml"
#: verl's max_tool_response_length and prompt_length in the evaluation: past any length (BFCL cuts nothing)
NO_TOOL_CUT = 1 << 40
#: the loop's choices for a step whose call does not decode (``bfcl_loop.ON_DECODE_ERROR``, restated so the
#: command line does not import verl; a test checks they agree)
ON_DECODE_ERROR = ("feedback", "end_turn")
DEFAULT_RESPONSE_LENGTH = 16384  # tokens of a whole trajectory; long_context's tool outputs need room
#: how long the oldest request waits for the other running trajectories' requests before its batch goes anyway
#: (a batch goes at once when every running trajectory is waiting); only a slow tool call makes it act
_WAIT_S = 1.0


def loop_knobs(on_decode_error: str, max_step_tokens: Optional[int]) -> dict:
    """The loop's knobs of :data:`LOOP_YAML`'s ``bfcl_multi_turn`` entry, with the evaluation's two."""
    from omegaconf import OmegaConf

    from recipe.mrtpo.agent.bfcl_env import AGENT_NAME

    entries = [e for e in OmegaConf.to_container(OmegaConf.load(LOOP_YAML)) if e.get("name") == AGENT_NAME]
    if len(entries) != 1:
        raise EvalError(f"{LOOP_YAML}: expected one entry named {AGENT_NAME!r}")
    knobs = {k: v for k, v in entries[0].items() if k not in ("name", "_target_")}
    knobs.update(on_decode_error=on_decode_error, max_step_tokens=max_step_tokens)
    return knobs


def model_type(model: str) -> Optional[str]:
    """The root ``model_type`` of the model's config (verl picks the loop's Continuous Token builder by it)."""
    import json

    config = Path(model).expanduser() / "config.json"
    if config.is_file():
        return json.loads(config.read_text(encoding="utf-8")).get("model_type")
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model).model_type


class BatchingServer:
    """verl's server manager as the loop calls it, over a token-level generator.

    ``generate`` queues the request; a batch goes to ``generate_ids(prompts, max_tokens)`` (run in one
    worker thread, so tool calls of other trajectories go on meanwhile) as soon as every running
    trajectory has a request waiting (``running()``), ``batch_size`` are waiting, or the first has waited
    ``wait_s``. A generator error fails the requests of its batch (the trajectory's ``run`` raises it).
    """

    def __init__(self, generate_ids: Callable[[list, list], list], batch_size: int, running: Callable[[], int],
                 wait_s: Optional[float] = None):
        self.generate_ids, self.batch_size, self.running = generate_ids, batch_size, running
        self.wait_s = _WAIT_S if wait_s is None else wait_s
        self.pending: list[tuple[list[int], int, asyncio.Future]] = []
        self.batches: list[int] = []  # sizes of the batches sent (tests and the result's stats read them)
        self._timer: Optional[asyncio.TimerHandle] = None
        self._tasks: set = set()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eval-generate")

    async def generate(self, request_id: str, *, prompt_ids: Sequence[int], sampling_params: dict, **_: Any):
        from verl.workers.rollout.replica import TokenOutput

        fut = asyncio.get_running_loop().create_future()
        self.pending.append((list(prompt_ids), int(sampling_params["max_tokens"]), fut))
        self.poke()
        return TokenOutput(token_ids=await fut)

    def poke(self) -> None:
        """Send a batch if one is due, else make sure the oldest request's wait is timed (also called when a
        trajectory ends: one fewer to wait for)."""
        if not self.pending:
            return
        if len(self.pending) >= min(self.batch_size, max(1, self.running())):
            self._flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.wait_s, self._flush)

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self.pending = self.pending[: self.batch_size], self.pending[self.batch_size:]
        if batch:
            task = asyncio.ensure_future(self._send(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self.poke()

    async def _send(self, batch: list) -> None:
        self.batches.append(len(batch))
        prompts, limits = [b[0] for b in batch], [b[1] for b in batch]
        try:
            outs = await asyncio.get_running_loop().run_in_executor(self._pool, self.generate_ids, prompts, limits)
            if len(outs) != len(batch):
                raise RuntimeError(f"generator returned {len(outs)} generations for {len(batch)} prompts")
        except Exception as e:  # noqa: BLE001 - handed to every waiting trajectory
            for *_, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
            return
        for (*_, fut), ids in zip(batch, outs):
            if not fut.done():
                fut.set_result(list(ids))

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class MultiTurnRunner:
    """Plays items through the agent loop (module docstring); ``generate_items`` is the evaluation's
    per-batch call, as a generator's ``generate`` is for one-turn tasks."""

    def __init__(self, generator, response_length: int, max_step_tokens: Optional[int], on_decode_error: str,
                 template_kwargs: Optional[dict] = None, model_type: Optional[str] = None):
        if getattr(getattr(generator, "sampling", None), "n", 1) != 1:
            raise EvalError("bfcl_multi_turn plays one trajectory per question (--n must be 1)")
        self.generator = generator
        self.response_length = response_length
        self.knobs = loop_knobs(on_decode_error, max_step_tokens)
        self.template_kwargs = dict(template_kwargs or {})
        self.model_type = model_type
        self.batches: list[int] = []

    def _config(self):
        from omegaconf import OmegaConf

        return OmegaConf.create({
            "actor_rollout_ref": {"rollout": {
                # no cut of the first turn's prompt (verl left-truncates past prompt_length): the model's context
                # is the limit, which the backend enforces
                "prompt_length": NO_TOOL_CUT, "response_length": self.response_length, "full_determinism": False,
                "multi_turn": {"max_assistant_turns": None, "max_tool_response_length": NO_TOOL_CUT,
                               "tool_response_truncate_side": "middle"}}},
            "data": {"apply_chat_template_kwargs": self.template_kwargs},
        })

    def _make_loop(self, server: BatchingServer, cfg):
        from verl.experimental.agent_loop.agent_loop import DictConfigWrap

        from recipe.mrtpo.agent.bfcl_loop import BFCLMultiTurnAgentLoop

        return BFCLMultiTurnAgentLoop(trainer_config=DictConfigWrap(cfg), server_manager=server,
                                      tokenizer=self.generator.tok, processor=None, dataset_cls=None,
                                      data_config=DictConfigWrap(cfg.data), hf_model_type=self.model_type,
                                      tools=None, **self.knobs)

    def generate_items(self, items: Sequence[Item]) -> list[list[Generation]]:
        """One trajectory per item, all of them running at once; ``[[Generation]]`` in the items' order."""
        return asyncio.run(self._run_all(list(items)))

    async def _run_all(self, items: list[Item]) -> list[list[Generation]]:
        running = [len(items)]
        server = BatchingServer(self.generator.generate_ids, max(1, len(items)), lambda: running[0])
        cfg = self._config()

        async def one(item: Item):
            try:
                loop = self._make_loop(server, cfg)
                return await loop.run({}, raw_prompt=item.messages, extra_info=item.extra_info)
            finally:
                running[0] -= 1
                server.poke()

        try:
            outs = await asyncio.gather(*(one(it) for it in items), return_exceptions=True)
        finally:
            server.close()
        self.batches.extend(server.batches)
        gens = []
        for item, out in zip(items, outs):
            if isinstance(out, ValueError):  # the row (BFCLEntryError) or the chat template (no tools section)
                raise EvalError(f"item {item.id}: {out}") from out
            if isinstance(out, BaseException):
                raise out
            gens.append([self._generation(out)])
        return gens

    def _generation(self, out) -> Generation:
        extra = out.extra_fields
        loop_info = dict(extra["bfcl_loop"])
        loop_info.pop("config", None)  # the knobs are in the result's config once
        # the whole response as the model saw it (tool results and injected turns included) for reading;
        # the verifier reads the trajectory record, never this text
        text = self.generator.tok.decode(out.response_ids, skip_special_tokens=False)
        return Generation(text=text, n_tokens=int(sum(out.response_mask)), finished=loop_info["end"] == "completed",
                          trajectory=extra["bfcl_trajectory"], loop={**loop_info, "spans": extra[SPANS_KEY]})
