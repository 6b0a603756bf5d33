"""Generators of the evaluation: ``transformers`` (:class:`HFGenerator`) and vLLM (:class:`VLLMGenerator`).

Every prompt is rendered with the tokenizer's chat template (``add_generation_prompt``, extra template
variables from ``--chat-template-kwargs``). Both backends use exactly the given sampling settings
(:class:`SamplingConfig`) and never the model's ``generation_config`` sampling defaults, only its stop
tokens; responses are decoded without special tokens.

``generate_ids`` is the token-level entry the multi-turn evaluation uses (:mod:`.multi_turn`: the agent
loop renders its own context and asks for one generation per request, as from verl's server manager):
prompt token ids in, generated token ids out (the stop token kept, as vLLM returns it), each request
with its own ``max_tokens``, one sample each.

Public names: :class:`Generation`, :class:`SamplingConfig`, :class:`HFGenerator`, :class:`VLLMGenerator`,
:func:`choose_backend`, :func:`make_generator`.
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from recipe.mrtpo.tools.eval.items import EvalError

__all__ = ["Generation", "SamplingConfig", "HFGenerator", "VLLMGenerator", "choose_backend", "make_generator"]


@dataclass
class Generation:
    """One sampled response: text (special tokens dropped), its token count, and whether it stopped
    on a stop token (False: cut at ``max_new_tokens``)."""

    text: str
    n_tokens: int
    finished: bool
    #: multi-turn only (:mod:`.multi_turn`): the trajectory record the verifier reads, and the loop's account
    trajectory: Optional[dict] = None
    loop: Optional[dict] = None


@dataclass
class SamplingConfig:
    max_new_tokens: int = 2048
    temperature: float = 0.0
    top_p: float = 1.0
    n: int = 1
    seed: int = 0


def _load_tokenizer(model_path: str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    if not getattr(tok, "chat_template", None):
        raise EvalError(f"the tokenizer of {model_path} has no chat template")
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def _render(tok, messages: list[dict], template_kwargs: dict) -> str:
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **template_kwargs)


def _stop_ids(tok, generation_config) -> list[int]:
    ids = getattr(generation_config, "eos_token_id", None)
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tok.eos_token_id is not None:
        ids.append(tok.eos_token_id)
    return sorted(set(int(i) for i in ids))


class HFGenerator:
    """``transformers`` generation (CPU or one GPU): one batch per call, left padding."""

    backend = "hf"

    def __init__(self, model_path: str, sampling: SamplingConfig, dtype: str = "auto",
                 template_kwargs: Optional[dict] = None, device: Optional[str] = None):
        import torch
        from transformers import AutoModelForCausalLM

        self.sampling = sampling
        self.template_kwargs = dict(template_kwargs or {})
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if dtype == "auto":
            dtype = "bfloat16" if self.device.startswith("cuda") else "float32"
        self.tok = _load_tokenizer(model_path)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
        self.model.to(self.device).eval()
        self.stop_ids = _stop_ids(self.tok, self.model.generation_config)
        torch.manual_seed(sampling.seed)

    def _generation_config(self):
        from transformers import GenerationConfig

        s = self.sampling
        sample = s.temperature > 0
        kwargs = dict(max_new_tokens=s.max_new_tokens, do_sample=sample, num_return_sequences=s.n,
                      eos_token_id=self.stop_ids, pad_token_id=self.tok.pad_token_id)
        if sample:
            kwargs.update(temperature=s.temperature, top_p=s.top_p, top_k=0)
        return GenerationConfig(**kwargs)

    def generate(self, batch: Sequence[list[dict]]) -> list[list[Generation]]:
        """``n`` generations for each conversation of ``batch`` (in order)."""
        import torch

        texts = [_render(self.tok, m, self.template_kwargs) for m in batch]
        enc = self.tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        with torch.inference_mode():
            out = self.model.generate(**enc, generation_config=self._generation_config())
        new = out[:, enc["input_ids"].shape[1]:].tolist()
        stops = set(self.stop_ids)
        gens = []
        for ids in new:
            end = next((i + 1 for i, t in enumerate(ids) if t in stops), None)
            kept = ids if end is None else ids[:end]
            gens.append(Generation(self.tok.decode(kept, skip_special_tokens=True), len(kept), end is not None))
        n = self.sampling.n
        return [gens[i * n:(i + 1) * n] for i in range(len(batch))]

    def generate_ids(self, prompts: Sequence[list[int]], max_tokens: Sequence[int]) -> list[list[int]]:
        """One generation per prompt (token ids, left-padded into one batch), each cut after its first
        stop token (kept) and at its own ``max_tokens``."""
        import torch

        if self.sampling.n != 1:
            raise ValueError("generate_ids samples once per prompt (n must be 1)")
        width = max(len(p) for p in prompts)
        pad = self.tok.pad_token_id
        ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts], device=self.device)
        attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        config = self._generation_config()
        config.max_new_tokens = max(max_tokens)
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=attn, generation_config=config)
        stops = set(self.stop_ids)
        result = []
        for row, limit in zip(out[:, width:].tolist(), max_tokens):
            end = next((i + 1 for i, t in enumerate(row) if t in stops), len(row))
            result.append(row[:min(end, limit)])
        return result


class VLLMGenerator:
    """vLLM offline generation (``vllm.LLM``) on the rendered prompt token ids."""

    backend = "vllm"

    def __init__(self, model_path: str, sampling: SamplingConfig, dtype: str = "auto",
                 template_kwargs: Optional[dict] = None, tensor_parallel_size: int = 1,
                 gpu_memory_utilization: float = 0.9, max_model_len: Optional[int] = None):
        from vllm import LLM, SamplingParams

        self.sampling = sampling
        self.template_kwargs = dict(template_kwargs or {})
        self.tok = _load_tokenizer(model_path)
        llm_kwargs = dict(model=model_path, tokenizer=model_path, dtype=dtype, seed=sampling.seed,
                          tensor_parallel_size=tensor_parallel_size, gpu_memory_utilization=gpu_memory_utilization)
        if max_model_len:
            llm_kwargs["max_model_len"] = max_model_len
        self.llm = LLM(**llm_kwargs)
        s = sampling
        params = dict(n=s.n, temperature=s.temperature, max_tokens=s.max_new_tokens)
        if s.temperature > 0:
            params.update(top_p=s.top_p, seed=s.seed)
        self.params = SamplingParams(**params)
        self._params_kwargs = params

    def generate(self, batch: Sequence[list[dict]]) -> list[list[Generation]]:
        """``n`` generations for each conversation of ``batch`` (in order)."""
        prompts = [
            {"prompt_token_ids": self.tok(_render(self.tok, m, self.template_kwargs), add_special_tokens=False)["input_ids"]}
            for m in batch
        ]
        outputs = self.llm.generate(prompts, self.params, use_tqdm=False)
        return [
            [Generation(o.text, len(o.token_ids), o.finish_reason == "stop") for o in req.outputs]
            for req in outputs
        ]


    def generate_ids(self, prompts: Sequence[list[int]], max_tokens: Sequence[int]) -> list[list[int]]:
        """One generation per prompt token ids, each with its own ``max_tokens`` (one SamplingParams per
        request); the token ids vLLM returns (its stop token included)."""
        from vllm import SamplingParams

        if self.sampling.n != 1:
            raise ValueError("generate_ids samples once per prompt (n must be 1)")
        params = [SamplingParams(**{**self._params_kwargs, "max_tokens": int(m)}) for m in max_tokens]
        outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
        return [list(req.outputs[0].token_ids) for req in outputs]


def choose_backend(requested: str) -> str:
    """``vllm`` or ``hf``: ``auto`` picks vLLM when it is installed and a CUDA GPU is visible."""
    if requested in ("hf", "vllm"):
        if requested == "vllm" and importlib.util.find_spec("vllm") is None:
            raise EvalError("--backend vllm: vllm is not installed")
        return requested
    if requested != "auto":
        raise ValueError(f"unknown backend {requested!r}")
    import torch

    return "vllm" if importlib.util.find_spec("vllm") is not None and torch.cuda.is_available() else "hf"


def make_generator(args: argparse.Namespace, backend: str):
    """The generator of ``backend`` for the parsed CLI arguments."""
    sampling = SamplingConfig(args.max_new_tokens, args.temperature, args.top_p, args.n, args.seed)
    if backend == "vllm":
        return VLLMGenerator(args.model, sampling, args.dtype, args.chat_template_kwargs,
                             args.tensor_parallel_size, args.gpu_memory_utilization, args.max_model_len)
    return HFGenerator(args.model, sampling, args.dtype, args.chat_template_kwargs)
