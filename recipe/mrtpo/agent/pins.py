"""The pins of the BFCL agent loop: the verl 0.9.1 pieces :mod:`.bfcl_loop` builds on and the bfcl-eval functions
:mod:`.bfcl_env` restates, by name -> sha256 of the dedented source (:mod:`recipe.mrtpo.seams.source_pins`).

Guarded by ``tests/integration/test_verl_seam.py`` (:func:`check_agent_loop_sources`) and
``tests/unit/test_bfcl_loop.py`` (:func:`check_bfcl_sources`). Standard library only: importing it imports
neither verl nor bfcl-eval.
"""

from __future__ import annotations

from recipe.mrtpo.seams.source_pins import changed_sources

#: verl 0.9.1 pieces the BFCL agent loop (``recipe.mrtpo.agent.bfcl_loop``) builds on or restates, by
#: ``module:qualname`` -> sha256 of the dedented source: the registry it registers with; the keyword arguments
#: the worker passes to a loop (``_VERL_KWARGS``); the Continuous Token calls that build the prompt and append
#: assistant / context tokens, and the mask rule they apply (assistant 1, context and inserted boundary 0);
#: the tool loop's cut of a long tool response (``truncate_tool_text``).
AGENT_LOOP_SOURCES = {
    "verl.experimental.agent_loop.agent_loop:register": "d4713a91cdbbbe838a94a77d7089c113f63b95b0d635796db0b24c5fb25389bb",
    "verl.experimental.agent_loop.agent_loop:AgentLoopWorker._run_agent_loop": "afb90a4a12333ee027a1d2d20a6a39e9cec9cd63418d5215ffe2f8364cc41267",
    "verl.experimental.agent_loop.agent_loop:AgentLoopBase.ct_build_initial_tokens": "03e5d1170097a843a4b05dabf195020d8e407d37bce3231998bcd865b36d9dc8",
    "verl.experimental.agent_loop.agent_loop:AgentLoopBase.ct_merge_context_msg": "a72fe5cc792fa5f87d9efb6f879b042beaa6a431b37b20e60c039aaa00aff595",
    "verl.experimental.agent_loop.agent_loop:AgentLoopBase.ct_merge_assistant_token": "91c7a99fc40779a1594684d0530da262ec4017adc7580192333abdcffe0798c7",
    "verl.utils.tokenizer.continuous_token:ContinuousTokenBuilder.align_response_metadata": "eb906d3082c9c27bf4780c759b080eeeb36c867742c08f406f9c9cdef95d0677",
    "verl.experimental.agent_loop.tool_agent_loop:ToolAgentLoop._call_tool": "571416855e7616759ce5b9f4e9ae6ea52274c6dd37147c9bf7689fa747dfd7dd",
}


def check_agent_loop_sources() -> list[str]:
    """The :data:`AGENT_LOOP_SOURCES` whose installed source is not the pinned one (empty: all as in 0.9.1)."""
    return changed_sources(AGENT_LOOP_SOURCES)


#: the bfcl-eval 2026.3.23 functions the BFCL agent loop's environment (``recipe.mrtpo.agent.bfcl_env``)
#: restates or follows, ``file:qualname`` (relative to the package) -> sha256 of the dedented source, read with
#: ``ast`` (:func:`recipe.mrtpo.seams.source_pins.named_source` with ``package="bfcl_eval"``); :func:`check_bfcl_sources` lists those that
#: differ (tests/unit/test_bfcl_loop.py)
BFCL_SOURCES = {
    # the protocol: steps until an empty decode, held-out functions at their turn, MAXIMUM_STEP_LIMIT
    "model_handler/base_handler.py:BaseHandler.inference_multi_turn_FC": "031e178d94ffbbad94bcda40483931ad1a465c6485850f5e08b4b3aa0370fe9f",
    "model_handler/base_handler.py:BaseHandler.inference_multi_turn_prompting": "a6a0c35fbc673652a0f592c5a400ff24b811cafa03c3824fd6fa1ce3421a73d4",
    # the call strings (bfcl_env.call_string) and Qwen FC's decoding into them
    "model_handler/utils.py:convert_to_function_call": "ccf0ea0cc6893051e8ef9b013e7d8373bc9acc5834729812d08cea35418007ed",
    "model_handler/local_inference/qwen_fc.py:QwenFCHandler.decode_execute": "0a77fce82e77981752ae00ae6126711e2017abcfad269e648edb516927018c7a",
    # instances, result strings, refused names (bfcl_env.BFCLEnv)
    "eval_checker/multi_turn_eval/multi_turn_utils.py:execute_multi_turn_func_call": "bbfe4e02aa0a977184f9b0998b6c92937f4a7aa662a220295d03cd0aa25955f1",
}


def check_bfcl_sources() -> list[str]:
    """The :data:`BFCL_SOURCES` whose installed source is not the pinned one (empty: bfcl-eval as pinned)."""
    return changed_sources(BFCL_SOURCES, package="bfcl_eval")
