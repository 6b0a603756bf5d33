"""Render a row's prompt exactly as verl 0.9.1's rollout rendered it: the same chat-template arguments and tools.

verl's agent loops build the rollout prompt with ``verl.utils.tokenizer.chat_template.apply_chat_template(
tokenizer, messages, tokenize=True, add_generation_prompt=True, tools=tools, **data.apply_chat_template_kwargs)``
(``ContinuousTokenBuilder._render_tokens``), where ``tools`` is

- for a row run by the tool agent loop (the row's ``agent_name`` is ``tool_agent``, or the row has none and
  ``actor_rollout_ref.rollout.agent.default_agent_loop`` is): the schemas of the tools loaded from
  ``actor_rollout_ref.rollout.multi_turn.tool_config_path`` / ``function_tool_path``
  (``verl.tools.tool_registry.load_all_tools``), filtered by the row's ``extra_info.tool_selection`` when it has
  one, in the selection's order (``ToolAgentLoop.run``);
- for a row run by the BFCL multi-turn loop (``agent_name`` ``bfcl_multi_turn``,
  :mod:`recipe.mrtpo.agent.bfcl_loop`): the row's own function specs, ``extra_info["tools"]``
  (:func:`recipe.mrtpo.agent.bfcl_env.tools_of_row`);
- for any other row (the single-turn loop): none.

and ``actor_rollout_ref.model.custom_chat_template`` replaces the tokenizer's template when set. The replay's
P_all and variants are rendered with the same (:class:`RolloutRender`), so that P_all is the rollout prompt
for tool datasets too, in both of the trainer's renders (whole prompts, and the planner's text + pieces).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Optional

from recipe.mrtpo.core.render_cache import CachedRender, PieceEncoder
from recipe.mrtpo.methods.types import get_key  # config.a.b.c or a default (standard library only)

TOOL_AGENT = "tool_agent"
BFCL_AGENT = "bfcl_multi_turn"  # recipe.mrtpo.agent.bfcl_env.AGENT_NAME (a test checks they agree)


def _plain(x):
    """OmegaConf / numpy containers as plain Python (what ``json`` and the chat template take)."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(x, (DictConfig, ListConfig)):
            return OmegaConf.to_container(x, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    if hasattr(x, "tolist") and not isinstance(x, (str, bytes)):
        return x.tolist()
    return x


class RolloutRender:
    """The chat-template arguments and per-row tools of verl's rollout render (module docstring)."""

    def __init__(self, config, tool_schemas: Optional[list[dict]] = None):
        self.kwargs: dict[str, Any] = dict(_plain(get_key(config, "data.apply_chat_template_kwargs", None)) or {})
        custom = get_key(config, "actor_rollout_ref.model.custom_chat_template", None)
        if custom:
            self.kwargs["chat_template"] = str(custom)
        self.default_agent = str(get_key(config, "actor_rollout_ref.rollout.agent.default_agent_loop", "") or "")
        self.tool_config_path = get_key(config, "actor_rollout_ref.rollout.multi_turn.tool_config_path", None)
        self.function_tool_path = get_key(config, "actor_rollout_ref.rollout.multi_turn.function_tool_path", None)
        self.agent_loop_config_path = get_key(config, "actor_rollout_ref.rollout.agent.agent_loop_config_path", None)
        self._schemas = tool_schemas

    @property
    def has_tools(self) -> bool:
        """Whether any row can have been rendered with tools (a tool config, schemas given, or an agent-loop file
        or default loop that can run the BFCL loop, whose rows carry their tools)."""
        return (self._schemas is not None or bool(self.tool_config_path or self.function_tool_path)
                or bool(self.agent_loop_config_path) or self.default_agent == BFCL_AGENT)

    def schemas(self) -> list[dict]:
        """The loaded tools' schemas, as the agent loop worker loads them (once)."""
        if self._schemas is None:
            if not (self.tool_config_path or self.function_tool_path):
                self._schemas = []
            else:
                from verl.tools.tool_registry import load_all_tools
                from verl.utils.import_utils import resolve_config_path

                tools = load_all_tools(
                    tool_config_path=resolve_config_path(self.tool_config_path) if self.tool_config_path else None,
                    function_tool_path=resolve_config_path(self.function_tool_path) if self.function_tool_path else None,
                )
                self._schemas = [t.tool_schema.model_dump(exclude_unset=True, exclude_none=True) for t in tools]
        return self._schemas

    def tools_of(self, agent_name: Optional[str] = None, extra_info: Optional[dict] = None) -> Optional[list[dict]]:
        """The ``tools=`` a row was rendered with: None unless the tool agent loop or the BFCL loop ran it
        (module docstring)."""
        agent = str(agent_name or self.default_agent or "")
        if agent == BFCL_AGENT:
            from recipe.mrtpo.agent.bfcl_env import tools_of_row

            return tools_of_row(_plain(extra_info) or {})
        if agent != TOOL_AGENT:
            return None
        schemas = self.schemas()
        selection = (_plain(extra_info) or {}).get("tool_selection") if extra_info is not None else None
        if selection and schemas:  # verl: {name: tool for name in tool_selection if name in tools}, in that order
            by_name = {_schema_name(s): s for s in schemas}
            return list({n: by_name[n] for n in selection if n in by_name}.values())
        return schemas or None

    def render_ids(self, tokenizer, messages: list[dict], tools: Optional[list[dict]] = None) -> list[int]:
        """The prompt ids, as verl's rollout renders them."""
        from verl.utils.tokenizer.chat_template import apply_chat_template

        out = apply_chat_template(tokenizer, messages, tokenize=True, add_generation_prompt=True, tools=tools, **self.kwargs)
        if isinstance(out, dict) or hasattr(out, "keys"):
            out = out["input_ids"]
        if len(out) and isinstance(out[0], list):
            out = out[0]
        return list(out)

    def render_text(self, tokenizer, messages: list[dict], tools: Optional[list[dict]] = None) -> str:
        """The prompt's text (tokenize=False) with the same arguments (the planner's pieces encode it)."""
        from verl.utils.tokenizer.chat_template import apply_chat_template

        return apply_chat_template(tokenizer, messages, tokenize=False, add_generation_prompt=True, tools=tools, **self.kwargs)

    def planner_renders(self, tokenizer, tools: Optional[list]):
        """``(render, row_render, encoder)``: the replay planner's CachedRender (its text through verl's
        chat-template call with the rollout's arguments), one per distinct tool list, all tokenizing their pieces
        through one PieceEncoder (``encoder``: a tool's documentation is tokenized once for every list holding
        it; its ``mismatches``): ``render`` without tools, ``row_render`` (sample -> its render; None where
        ``tools`` is None)."""
        renders: dict[str, CachedRender] = {}
        encoder = PieceEncoder(lambda texts: tokenizer(texts, add_special_tokens=False)["input_ids"])

        def make(t):
            return CachedRender(render_text=lambda m: self.render_text(tokenizer, m, t), encoder=encoder)

        def of(t):
            key = tools_key(t)
            if key not in renders:
                renders[key] = make(t)
            return renders[key]

        render = of(None)
        row_render = (lambda i: of(tools[i])) if tools is not None else None
        return render, row_render, encoder


def _schema_name(schema: dict) -> str:
    fn = schema.get("function", schema) if isinstance(schema, dict) else {}
    return str(fn.get("name", "")) if isinstance(fn, dict) else ""


def tools_key(tools: Optional[Sequence[dict]]) -> str:
    """A hashable key of a tool list (rows rendered with the same tools share a render cache)."""
    return "" if tools is None else json.dumps(list(tools), sort_keys=True, default=str)
