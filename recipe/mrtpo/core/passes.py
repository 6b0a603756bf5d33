"""The pass engine: every no-grad pass over the actor, at the cost of the tokens that exist (docs/design.md §5).

The replay (JS of each variant against P_all, :mod:`recipe.mrtpo.core.replay`), the OPSD teacher (top-k,
:mod:`recipe.mrtpo.methods.opsd.teacher`) and the fused old_log_prob pass all forward sequences ``prompt | response``
through the same causal LM and differ only in what they reduce per sequence. This module owns what they
share: the sequences (:class:`PassSequence`), the one response-length rule (:func:`response_lengths`),
the one packer (:func:`plan_forwards`), the one forward-count agreement with its padding forwards, the
input layouts and the settings (:class:`PassSettings`). :func:`run_pass` drives a reduction over it.

Layouts (``PassSettings.layout``; the forwards hold, over the tokens that exist):

- ``padded``: micro-batches in arrival order, each LEFT-padded to its longest sequence (n x longest tokens);
- ``sorted``: the same micro-batches over rows sorted by length, a row's sequences kept together (each
  micro-batch pads to sequences of similar length);
- ``single``: every forward holds one sequence, unpadded (the sorted order): what the model table gives
  recurrent (hybrid, linear-attention, SSM) types, whose layers neither keep packed sequences apart nor ignore
  left padding (measured on tiny Qwen3-Next / Mamba2: a left-padded row differs from the sequence alone);
- ``packed``: a micro-batch is ONE row, its sequences concatenated with restarting position ids, logits
  kept only at response positions (``keep`` is then an index tensor): the tokens that exist, ~1.0x.
  The attention must keep the sequences apart: flash-attention's varlen path reads the boundaries from
  the restarting ``position_ids`` (``packed_attention="varlen"``, no attention mask, what verl's
  ``use_remove_padding`` forward relies on). SDPA and eager attend across the sequences under a 2D mask
  of ones; given no mask, transformers 5.9 derives the blocks from the position ids too, but as a dense
  [L, L] mask; ``"block_mask"`` passes that 4D block-diagonal causal mask explicitly (exact, quadratic
  in the row: for CPU tests at small lengths). So ``auto`` packs only under flash-attention, and only
  model types the one table (:mod:`recipe.mrtpo.core.model_support`) knows to keep packed sequences apart
  there; hybrid / linear-attention / SSM types and unknown types sort.

A token budget (verl's ``log_prob_max_token_len_per_gpu``) bounds a forward's tokens (padded ones included:
n x longest, or the packed row's length); a sequence longer than the budget runs alone. Without one, a
forward holds ``micro_batch_size`` sequences.

Numerics (what verl's ``forward_step`` does, ``verl/workers/engine/fsdp/transformer_impl.py`` in 0.9.1, checked
by ``tests/integration/test_verl_seam.py``): every forward's logits are divided by the temperature exactly as
verl divides them (:func:`scale_logits`: in the logits' own dtype, by the temperature rounded to that dtype,
0.7 -> 0.69921875 in bf16; not at all at temperature 1) before any reduction sees them, so the reductions
run at temperature 1 on the scaled logits; they compute in fp32 and, where verl's own log-prob (or entropy)
comes out in the logits' dtype (its fallback without flash-attention's cross entropy), round to that dtype
(``PassSettings.logprob_dtype`` / ``entropy_dtype``, which the worker reads off verl's functions). The forward
itself runs under the engine's autocast (the worker's business, ``worker.engine_autocast``).

Logits check: a forward must return one row of logits per position it was asked to keep (``logits_to_keep``:
the last ``keep`` positions of every row, or the packed row's positions); a model whose forward ignores it
(verl's patched VLM forwards return full logits) fails with :class:`LogitsShapeError` instead of being read
at the wrong rows.

Collective safety: every FSDP forward issues collectives, so every data-parallel rank must run the same
number of forwards: the schedule is planned first and ``sync_forward_count(n_local) -> n_global`` is
called BEFORE the first forward; a short rank then runs ``n_global - n_local`` one-token padding forwards.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Optional, Union

import torch

from recipe.mrtpo.core.attention_cost import ModelShape
from recipe.mrtpo.core.model_support import VARLEN_ATTENTIONS, may_pack, table_entry
from recipe.mrtpo.core.shared_prompts import hf_forward, plan_pass  # noqa: F401  (hf_forward: the passes' callers import it here)


class LogitsShapeError(RuntimeError):
    """A forward returned logits at other positions than the pass asked for (module docstring)."""


def scale_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits / temperature`` as verl 0.9.1's ``_scale_logits_by_temperature`` computes it for a scalar
    temperature: unchanged at exactly 1.0, else divided in the logits' dtype by the temperature taken as an
    fp32 tensor, clamped at 1e-8 and cast to that dtype (bf16 rounds 0.7 to 0.69921875)."""
    if float(temperature) == 1.0:
        return logits
    t = torch.tensor(float(temperature), dtype=torch.float32, device=logits.device)
    return logits / t.clamp(min=1e-8).to(logits.dtype)


def round_to(x: torch.Tensor, dtype_name: str) -> torch.Tensor:
    """``x`` (fp32) rounded to the dtype named (``"float32"``: unchanged), back in fp32: where verl's own
    reduction returns that dtype (``PassSettings.logprob_dtype``)."""
    if dtype_name in ("float32", ""):
        return x
    return x.to(getattr(torch, dtype_name)).float()


def picked_logprobs_in_dtype(logits: torch.Tensor, ids: torch.Tensor, dtype_name: str, chunk_size: Optional[int] = None) -> torch.Tensor:
    """[T] ``log_softmax(logits)[ids]`` computed in the dtype named, row chunk by row chunk, as verl's fallback
    ``logprobs_from_logits_v2`` computes it for logits of that dtype (a log-softmax in that dtype, then the
    gather); fp32 out. For ``logprob_dtype`` other than fp32 (module docstring: Numerics)."""
    dtype = getattr(torch, dtype_name)
    out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    step = int(chunk_size or 128)
    for a in range(0, logits.shape[0], step):
        lp = torch.log_softmax(logits[a : a + step].to(dtype), dim=-1)
        out[a : a + step] = lp.gather(-1, ids[a : a + step].long().unsqueeze(-1)).squeeze(-1).float()
    return out


def entropy_in_dtype(logits: torch.Tensor, dtype_name: str, chunk_size: Optional[int] = None) -> torch.Tensor:
    """[T] entropy of ``softmax(logits)`` by verl's ``entropy_from_logits`` formula evaluated in the dtype named
    (``logsumexp(z) - sum(softmax(z) * z)``), fp32 out: for ``entropy_dtype`` other than fp32."""
    dtype = getattr(torch, dtype_name)
    out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    step = int(chunk_size or 128)
    for a in range(0, logits.shape[0], step):
        z = logits[a : a + step].to(dtype)
        out[a : a + step] = (torch.logsumexp(z, dim=-1) - torch.sum(torch.softmax(z, dim=-1) * z, dim=-1)).float()
    return out


def check_logits(logits: torch.Tensor, ids: torch.Tensor, keep) -> None:
    """Raise :class:`LogitsShapeError` unless ``logits`` holds exactly the kept positions of ``ids``:
    [b, keep, V] for an int ``keep``, [1, len(keep), V] for a packed row's index tensor."""
    want = (ids.shape[0], int(keep.numel()) if torch.is_tensor(keep) else int(keep))
    got = tuple(logits.shape[:-1]) if logits.dim() == 3 else tuple(logits.shape)
    if logits.dim() != 3 or got != want:
        raise LogitsShapeError(
            f"the model's forward returned logits of shape {tuple(logits.shape)} for {tuple(ids.shape)} input ids and "
            f"logits_to_keep of {want[1]} positions (expected [{want[0]}, {want[1]}, V]): its forward does not honour "
            "logits_to_keep (verl's patched vision-language forwards return full logits), so the pass would read "
            "other positions' logits; the replay and teacher passes support causal LMs whose forward keeps them"
        )


# forward(input_ids [b, L], attention_mask [b, L] | [b, 1, L, L] additive or bool (True: attends) | TreeMask (a shared row)
#         | None, position_ids [b, L], keep: int (the last `keep` positions) | LongTensor [N] (positions)) -> logits [b, keep | N, V]
ForwardFn = Callable[[torch.Tensor, Optional[torch.Tensor], torch.Tensor, Union[int, torch.Tensor]], torch.Tensor]

LAYOUTS = ("padded", "sorted", "packed", "single")
PACKED_ATTENTIONS = ("varlen", "block_mask")
#: dtypes a reduction's output may be rounded to (:func:`round_to`)
REDUCTION_DTYPES = ("float32", "bfloat16", "float16")


def sync_max_over_ranks(n: int) -> int:
    """The largest ``n`` over the ranks of the default process group (``n`` itself outside one): the
    forward-count agreement (module docstring). gloo reduces on CPU, NCCL on the current CUDA device."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return n
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor([n], dtype=torch.long, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


@dataclass(frozen=True)
class PassSettings:
    """The settings of a no-grad pass, as the driver sends them and the worker reads them (one owner).

    On the wire (non-tensor entries of the worker's batch) ``token_budget`` / ``chunk_size`` 0 mean none /
    auto and ``pad_id`` is ``pad_token_id``; ``packed_attention`` is the worker's to choose (it knows the
    model's attention), never sent.
    """

    temperature: float = 1.0
    micro_batch_size: int = 8
    token_budget: Optional[int] = None
    chunk_size: Optional[int] = None
    pad_id: int = 0
    layout: str = "sorted"  # or "auto": the worker's choice (:func:`resolve_layout`), ``sorted`` where unresolved
    packed_attention: str = "varlen"
    # the dtypes verl's own log-prob and entropy come out in (module docstring: Numerics); the worker's to set
    logprob_dtype: str = "float32"
    entropy_dtype: str = "float32"
    share_prompts: bool = False  # a forward holds each distinct prompt once (:mod:`.shared_prompts`) where it pays
    model_shape: Optional[ModelShape] = None  # the worker's: the cost model's (:mod:`.attention_cost`); None: always share

    WIRE_KEYS = ("temperature", "micro_batch_size", "token_budget", "chunk_size", "pad_token_id", "layout", "share_prompts")

    def __post_init__(self):
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if int(self.micro_batch_size) < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {self.micro_batch_size}")
        if self.token_budget is not None and int(self.token_budget) < 1:
            raise ValueError(f"token_budget must be >= 1 (or None), got {self.token_budget}")
        if self.chunk_size is not None and int(self.chunk_size) < 1:
            raise ValueError(f"chunk_size must be >= 1 (or None), got {self.chunk_size}")
        if self.layout not in (*LAYOUTS, "auto"):
            raise ValueError(f"layout must be 'auto' or one of {LAYOUTS}, got {self.layout!r}")
        if self.packed_attention not in PACKED_ATTENTIONS:
            raise ValueError(f"packed_attention must be one of {PACKED_ATTENTIONS}, got {self.packed_attention!r}")
        for name in (self.logprob_dtype, self.entropy_dtype):
            if name not in REDUCTION_DTYPES:
                raise ValueError(f"logprob_dtype / entropy_dtype must be one of {REDUCTION_DTYPES}, got {name!r}")

    def to_wire(self) -> dict:
        d = asdict(self)
        for worker_side in ("packed_attention", "logprob_dtype", "entropy_dtype", "model_shape"):
            d.pop(worker_side)
        d["pad_token_id"] = int(d.pop("pad_id"))
        d["token_budget"] = int(self.token_budget or 0)
        d["chunk_size"] = int(self.chunk_size or 0)
        return d

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any], method: str, attn_implementation: Optional[str] = None,
                  model_type: Optional[str] = None, **worker: Any) -> PassSettings:
        """The settings of ``wire``; a clear error naming ``method`` when one is missing. ``layout`` "auto"
        (or absent) is decided by the model table (:func:`resolve_layout`). ``worker``: the settings the
        worker reads off verl itself (``logprob_dtype``, ``entropy_dtype``)."""
        required = [k for k in cls.WIRE_KEYS if k not in ("layout", "share_prompts")]  # optional: "auto", off
        missing = [k for k in required if wire.get(k, None) is None]
        if missing:
            raise ValueError(f"{method}: settings {missing} missing (the trainer sends them from mrtpo.*)")
        layout, attention = resolve_layout(str(wire.get("layout", None) or "auto"), attn_implementation, model_type)
        return cls(
            temperature=float(wire["temperature"]),
            micro_batch_size=int(wire["micro_batch_size"]),
            token_budget=int(wire["token_budget"]) or None,
            chunk_size=int(wire["chunk_size"]) or None,
            pad_id=int(wire["pad_token_id"]),
            layout=layout,
            packed_attention=attention,
            share_prompts=bool(wire.get("share_prompts", None) or False),
            **worker,
        )


def resolve_layout(layout: str, attn_implementation: Optional[str], model_type: Optional[str] = None) -> tuple[str, str]:
    """(layout, packed_attention) for a requested layout (``auto`` or one of :data:`LAYOUTS`), the model's
    attention implementation and its model type, by the one table (:mod:`recipe.mrtpo.core.model_support`):
    a recurrent (hybrid, linear-attention, SSM) type always runs ``single`` (an explicit ``packed`` is refused);
    otherwise ``auto`` packs only a type the table marks ``packed`` under a varlen attention and sorts
    everything else (an unknown type included), and an explicit ``packed`` under a non-varlen attention takes
    the exact block mask."""
    varlen = str(attn_implementation or "") in VARLEN_ATTENTIONS
    attention = "varlen" if varlen else "block_mask"
    if layout not in (*LAYOUTS, "auto"):
        raise ValueError(f"layout must be 'auto' or one of {LAYOUTS}, got {layout!r}")
    if table_entry(model_type) == "single":
        if layout == "packed":
            raise ValueError(f"layout 'packed' is refused for model type {model_type!r}: its recurrent (linear-attention / "
                             "state-space) layers would carry state across the packed sequences; use layout 'auto'")
        return "single", attention
    if layout == "auto":
        layout = "packed" if may_pack(model_type, attn_implementation) else "sorted"
    return layout, attention


@dataclass(frozen=True)
class PassSequence:
    """One forward sequence: prompt ``variant`` of row ``row`` followed by the row's response."""

    row: int
    variant: int  # index into the row's prompts (replay: 0 = P_all)
    prompt_len: int
    resp_len: int  # response positions that exist (attended), up to the last valid token
    last_of_row: bool  # no later sequence of this row follows

    @property
    def length(self) -> int:
        return self.prompt_len + self.resp_len


def response_lengths(response_mask: torch.Tensor) -> torch.Tensor:
    """[R] response positions that exist: the index of the last valid token + 1 (0 if none).

    A non-contiguous mask (tool output inside a multi-turn response, rejected tokens) keeps its gaps
    attended: they are tokens the model saw; where a pass measures is the mask's business.
    """
    m = (response_mask > 0).cpu()
    if m.shape[-1] == 0:
        return torch.zeros(m.shape[0], dtype=torch.long)
    return (torch.arange(1, m.shape[-1] + 1) * m).amax(dim=-1)


def row_sequences(row: int, variants: list[int], prompt_lens: list[int], resp_len: int) -> list[PassSequence]:
    """The sequences of one row, in the given variant order (the last one marked ``last_of_row``)."""
    n = len(variants)
    return [PassSequence(row, v, int(p), int(resp_len), j == n - 1) for j, (v, p) in enumerate(zip(variants, prompt_lens))]


def forward_tokens(mb: list[PassSequence], layout: str) -> int:
    """Tokens a forward of ``mb`` holds: the packed row's length, or n x longest (padded micro-batch)."""
    if layout == "packed":
        return sum(s.length for s in mb)
    return len(mb) * max(s.length for s in mb)


def _row_ordered(seqs: list[PassSequence]) -> list[PassSequence]:
    """Rows by their longest sequence, longest first (stable), a row's sequences together and in their order."""
    groups: dict[int, list[PassSequence]] = {}
    for s in seqs:
        groups.setdefault(s.row, []).append(s)
    ordered = sorted(groups.values(), key=lambda g: -max(s.length for s in g))  # stable: ties keep row order
    return [s for g in ordered for s in g]


def plan_forwards(seqs: list[PassSequence], settings: PassSettings) -> list[list[PassSequence]]:
    """The forwards of a pass: the one packer (module docstring).

    ``padded`` keeps the arrival order; ``sorted``, ``packed`` and ``single`` first order rows by their longest
    sequence, longest first, a row's sequences kept together and in their order (a reduction that needs a
    row's reference before its variants, as the replay's P_all, gets it). Then consecutive sequences fill a
    forward while :func:`forward_tokens` stays within the budget (or ``micro_batch_size`` sequences);
    ``single``: one sequence a forward.
    """
    if settings.layout == "single":  # one unpadded sequence per forward, rows longest first, kept together
        return [[s] for s in _row_ordered(seqs)]
    if settings.layout != "padded":
        seqs = _row_ordered(seqs)
    budget = settings.token_budget
    batches: list[list[PassSequence]] = []
    cur: list[PassSequence] = []
    for s in seqs:
        if cur:
            full = forward_tokens(cur + [s], settings.layout) > budget if budget else len(cur) >= settings.micro_batch_size
            if full:
                batches.append(cur)
                cur = []
        cur.append(s)
    if cur:
        batches.append(cur)
    return batches


def forward_inputs(mb: list[PassSequence], prompts: torch.Tensor, responses: torch.Tensor, settings: PassSettings):
    """``(input_ids, attention_mask, position_ids, keep, starts)`` of one forward, on CPU.

    ``prompts`` [R, NV, P] LEFT-padded prompt ids; ``responses`` [R, T]. ``starts[i]``: where sequence i's
    response logits begin in the forward's kept logits, flattened over (batch, kept positions); each
    sequence's ``resp_len`` rows follow (kept position j predicts response token t = j - start).
    """
    P = prompts.shape[-1]
    pad = settings.pad_id
    if settings.layout == "packed":
        L = sum(s.length for s in mb)
        ids = torch.full((1, L), pad, dtype=torch.long)
        pos = torch.zeros((1, L), dtype=torch.long)
        keep, starts, o, n_kept = [], [], 0, 0
        seg = torch.empty(L, dtype=torch.long)
        for i, s in enumerate(mb):
            ids[0, o : o + s.prompt_len] = prompts[s.row, s.variant, P - s.prompt_len :]
            ids[0, o + s.prompt_len : o + s.length] = responses[s.row, : s.resp_len]
            pos[0, o : o + s.length] = torch.arange(s.length)
            seg[o : o + s.length] = i
            keep.append(torch.arange(o + s.prompt_len - 1, o + s.length - 1))
            starts.append(n_kept)
            n_kept += s.resp_len
            o += s.length
        attn = None
        if settings.packed_attention == "block_mask":
            allowed = (seg.unsqueeze(0) == seg.unsqueeze(1)) & torch.ones(L, L, dtype=torch.bool).tril()
            attn = torch.zeros(1, 1, L, L).masked_fill_(~allowed, torch.finfo(torch.float32).min)
        return ids, attn, pos, torch.cat(keep), starts
    L = max(s.length for s in mb)
    ids = torch.full((len(mb), L), pad, dtype=torch.long)
    attn = torch.zeros((len(mb), L), dtype=torch.long)
    for i, s in enumerate(mb):
        ids[i, L - s.length : L - s.resp_len] = prompts[s.row, s.variant, P - s.prompt_len :]
        ids[i, L - s.resp_len :] = responses[s.row, : s.resp_len]
        attn[i, L - s.length :] = 1
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    keep = max(s.resp_len for s in mb) + 1  # every response ends at the last position
    return ids, attn, pos, keep, [i * keep + keep - 1 - s.resp_len for i, s in enumerate(mb)]


@dataclass
class PassCounts:
    """What a pass cost on this process: its own forwards, the agreed ones, the tokens the forwards held
    (padding included, the agreement's padding forwards not) and the tokens that exist."""

    n_forwards: int = 0
    n_forwards_global: int = 0
    tokens_forwarded: int = 0
    tokens_existing: int = 0
    unshared_by_cost: int = 0  # shared forwards the cost model ran unshared (:func:`~.shared_prompts.plan_pass`)
    attention_pairs: int = 0  # (query, key) pairs the forwards' attention computes, in tiles (:mod:`.attention_cost`)

    def as_tensors(self) -> dict:
        """Every count as a 0-d tensor, by its name (what the passes return beside their outputs)."""
        return {k: torch.tensor(int(v)) for k, v in asdict(self).items()}


# consume(seqs: consecutive sequences of one row in one forward, logits [len(seqs), resp_len, V] (a view of
#         the forward's logits), single: the forward holds only these sequences)
Consume = Callable[[list[PassSequence], torch.Tensor, bool], None]


def run_pass(
    forward: ForwardFn,
    prompts: torch.Tensor,
    responses: torch.Tensor,
    seqs: list[PassSequence],
    settings: PassSettings,
    consume: Consume,
    *,
    device: torch.device | str = "cpu",
    sync_forward_count: Optional[Callable[[int], int]] = None,
) -> PassCounts:
    """Forward ``seqs`` as :func:`plan_forwards` plans them and hand each row's response logits to ``consume``,
    checked against the positions asked for (:func:`check_logits`) and divided by the temperature as verl divides
    them (:func:`scale_logits`): ``consume`` reduces at temperature 1.

    The forward count is agreed (``sync_forward_count``) before the first forward; the padding forwards
    run after the last (module docstring).
    """
    plan = plan_pass(seqs, prompts, responses, settings, plan_forwards)  # shared where it can and pays, else unshared
    counts = PassCounts(n_forwards=len(plan.forwards), unshared_by_cost=plan.unshared_by_cost,
                        attention_pairs=plan.counts.pairs)
    counts.n_forwards_global = int(sync_forward_count(counts.n_forwards)) if sync_forward_count is not None else counts.n_forwards
    if counts.n_forwards_global < counts.n_forwards:
        raise RuntimeError(f"forward-count agreement returned {counts.n_forwards_global} < this rank's {counts.n_forwards}")
    for mb, inputs in plan.forwards:
        ids, attn, pos, keep, starts = inputs or forward_inputs(mb, prompts, responses, settings)
        counts.tokens_forwarded += ids.numel()
        counts.tokens_existing += sum(s.length for s in mb)
        keep = keep.to(device) if torch.is_tensor(keep) else keep
        attn = attn.to(device) if torch.is_tensor(attn) else attn  # a TreeMask becomes a BlockMask on the ids' device
        logits = forward(ids.to(device), attn, pos.to(device), keep)
        check_logits(logits, ids, keep)
        logits = scale_logits(logits, settings.temperature)  # verl's division: the reductions run at temperature 1
        flat = logits.reshape(-1, logits.shape[-1])
        i = 0
        while i < len(mb):  # consecutive sequences of one row: one strided view of the kept logits
            j = i
            while j < len(mb) and mb[j].row == mb[i].row:
                j += 1
            n = mb[i].resp_len
            stride = starts[i + 1] - starts[i] if j - i > 1 else n
            view = flat.as_strided((j - i, n, flat.shape[-1]), (stride * flat.stride(0), flat.stride(0), flat.stride(1)),
                                   flat.storage_offset() + starts[i] * flat.stride(0))
            consume(mb[i:j], view, len(mb) == j - i)
            del view
            i = j
        del logits, flat
    if counts.n_forwards_global > counts.n_forwards:
        dummy = torch.full((1, 1), settings.pad_id, dtype=torch.long, device=device)
        one = torch.ones((1, 1), dtype=torch.long, device=device)
        for _ in range(counts.n_forwards_global - counts.n_forwards):
            forward(dummy, one, torch.zeros_like(one), 1)
    return counts
