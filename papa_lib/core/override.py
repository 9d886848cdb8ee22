"""The single seam through which PAPA changes a model's attention (paper Sec. 3.2 Eq. 3, Sec. 5.2, footnotes 8 and 14).

Every head h of every layer runs one of these modes:

=============  =================================================================================================
``original``   the model's own input-dependent attention A^h
``constant``   C^h (Sec. 3.1), masked for the current input's padded queries and keys and row-normalised (fn. 8)
``mix``        B^h = λ^h A^h + (1-λ^h) C^h, λ^h = σ(θ^h), one trainable θ per head per layer initialised at 0 (Eq. 3)
``identity``   each real token attends only to itself (Sec. 5.2 (1))
``toeplitz``   T_qk = 1/(|q-k|+1), masked and row-normalised (Sec. 5.2 (2))
``zeros``      an all-zero matrix: the head contributes nothing (Sec. 5.2 (3), i.e. pruning)
``trainable``  a constant matrix trained with the probe, initialised from the average or from Toeplitz, kept
               non-negative (clamped at 0) and masked + row-normalised when used (Sec. 5.2 (4)-(5), fn. 14)
``previous``   each real token attends only to the token before it (a data-free alternative for decoders; a row
               with no real previous token, such as the first, falls back to uniform over its allowed real keys: in
               a decoder, itself)
``uniform``    uniform over the real keys a query may see (for a decoder: the causal prefix, within the window)
=============  =================================================================================================

How a model is reached (architecture specifics are in :mod:`papa_lib.core.models`):

* BERT, RoBERTa, XLM-R, ELECTRA, DistilBERT, ALBERT, ModernBERT: an attention function registered in transformers'
  ``AttentionInterface`` under the name
  ``"papa"``, plus the eager mask function registered in ``AttentionMaskInterface`` under the same name — without
  the latter, transformers would silently drop the padding mask for an unknown implementation. While an override is
  active the model's ``config._attn_implementation`` is ``"papa"``.
* DeBERTa, DeBERTa-v2/v3, MPNet: a small adapter replaces the attention module's probability dropout (applied right
  after the softmax, just before the product with the values) with a module that rewrites the probabilities, and a
  forward pre-hook reads which tokens are real from the module's attention mask.
* ALBERT's one attention module serves every layer position: the layer is the call order within a forward pass, so
  constants, θ and modes stay per layer position. ModernBERT's local layers restrict every replacement to their
  sliding window (their own A, hence an averaged C, is zero outside it; Toeplitz, identity and trainable matrices
  are cut to it and renormalised), and use the reference path.

Decoder LMs (adapters with ``causal=True``: Gemma 3, Llama, GPT-2; :mod:`papa_lib.core.decoders`) take the
``AttentionInterface`` route, and the seam imposes their structure itself, whatever mask transformers passes (for an
unpadded batch the default path passes none and relies on ``is_causal``): key j is allowed for query i when j <= i,
q - k < the module's ``sliding_window`` on local layers, and j is a real token. The model's own A is computed under
that mask, every replacement is cut to it and renormalised over the real causal keys, and grouped-query keys and
values are repeated per query head, so constants, modes and λ are per *query* head. Constants built at L serve any
input of width <= L (their top-left block: a causal row never sees a later position). The override runs whole
sequences (no KV cache: a query length other than the key length is an error).

Both routes call the same :meth:`AttentionOverride.head_weights`, so every mode means the same thing everywhere.
Leaving the context restores the model exactly. With ``output_attentions=True`` the model returns the weights it
actually used (constant, mixed, ...).

On the ``AttentionInterface`` route a fast path (:mod:`papa_lib.core.fastpath`, Sec. 3.4) is on by default
(``fast=True``): heads that do not look at the input skip the query/key projections, the softmax and the per-example
weight matrices, with the same result; ``fast=False`` runs the reference path described here.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from contextlib import contextmanager

import torch
from torch import nn

from ..errors import PapaInputError
from .fastpath import (
    causal_band,
    causal_eager_weights,
    eager_weights,
    fast_attention,
    fast_causal_attention,
    skip_causal_projections,
    skip_query_key_projections,
)
from .masks import allowed_pairs_from_additive_mask, real_tokens_from_additive_mask, real_tokens_from_pair_mask
from .models import adapter_for, model_device, num_layers_and_heads, prepare_model, self_attention_modules

MODES = ("original", "constant", "mix", "identity", "toeplitz", "zeros", "trainable", "previous", "uniform")
_USES_INPUT_ATTENTION = {"original", "mix"}
_ROW_NORMALISED = {"constant", "mix", "toeplitz", "trainable", "previous", "uniform"}
_IMPLEMENTATION = "papa"


def toeplitz_matrix(length: int, dtype=torch.float32, device=None) -> torch.Tensor:
    """The Toeplitz matrix T_qk = 1 / (|q - k| + 1) of Sec. 5.2 (harmonic decay away from the diagonal)."""
    if isinstance(length, bool) or not isinstance(length, numbers.Integral) or length < 0:
        raise PapaInputError(f"toeplitz_matrix: length must be a non-negative integer, got {length!r}")
    positions = torch.arange(length, device=device)
    return 1.0 / ((positions[:, None] - positions[None, :]).abs().to(dtype) + 1.0)


def _resolve_plan(num_layers: int, num_heads: int, heads, mode: str) -> dict[tuple[int, int], str]:
    """Turn ``heads``/``mode`` into ``{(layer, head): mode}`` for every head that is not ``original``."""
    if mode not in MODES:  # checked even when no head is listed: a fraction-1 run of a sweep would hide the typo
        raise PapaInputError(f"unknown mode {mode!r}; choose one of {MODES}")
    if isinstance(heads, Mapping):
        items = list(heads.items())
    elif isinstance(heads, str):
        if heads != "all":
            raise PapaInputError(f"heads must be 'all', an iterable of (layer, head) or a mapping; got {heads!r}")
        items = [((layer, h), mode) for layer in range(num_layers) for h in range(num_heads)]
    else:
        if isinstance(heads, tuple) and len(heads) == 2 and all(isinstance(i, int) for i in heads):
            raise PapaInputError(f"heads={heads!r}: pass a list of (layer, head) pairs, e.g. [{heads!r}]")
        items = []
        for lh in heads:
            if isinstance(lh, (str, bytes)) or not hasattr(lh, "__len__"):
                raise PapaInputError(f"a head is a (layer, head) pair, got {lh!r} (heads: a list of pairs, e.g. "
                                     "[(0, 1)])")
            items.append((tuple(lh), mode))
    plan: dict[tuple[int, int], str] = {}
    for key, head_mode in items:
        if len(key) != 2:
            raise PapaInputError(f"a head is a (layer, head) pair, got {key!r}")
        layer, head = int(key[0]), int(key[1])
        if not (0 <= layer < num_layers and 0 <= head < num_heads):
            raise PapaInputError(f"head {(layer, head)} is outside the model's {num_layers} layers x {num_heads} heads")
        if head_mode not in MODES:
            raise PapaInputError(f"unknown mode {head_mode!r} for head {(layer, head)}; choose one of {MODES}")
        if head_mode != "original":
            plan[(layer, head)] = head_mode
    return plan


class AttentionOverride(nn.Module):
    """Per-head attention replacement for one model: the state behind :func:`override`.

    Holds the mixing parameters θ ``[layers, heads]`` (λ = σ(θ), initialised to 0, i.e. λ = 0.5) and, for
    ``trainable`` heads, the trainable constant matrices. Train them by passing :meth:`trainable_parameters` to an
    optimiser. Apply it with :meth:`applied` (or use :func:`override`). ``fast`` turns the fast path of
    :mod:`papa_lib.core.fastpath` on (default) or off (reference path).
    """

    def __init__(
        self,
        model: nn.Module,
        matrices=None,
        heads="all",
        mode: str = "constant",
        *,
        trainable_init: str = "average",
        max_length: int | None = None,
        fast: bool = True,
    ):
        super().__init__()
        prepare_model(model)
        self.causal = bool(adapter_for(model).causal)
        self.fast = bool(fast)
        self.num_layers, self.num_heads = num_layers_and_heads(model)
        self.plan = _resolve_plan(self.num_layers, self.num_heads, heads, mode)
        device = model_device(model)
        tensor = None
        if matrices is not None:
            tensor = getattr(matrices, "matrices", matrices)
            if hasattr(matrices, "check_compatible"):
                matrices.check_compatible(model)
            if tensor.dim() != 4 or tuple(tensor.shape[:2]) != (self.num_layers, self.num_heads):
                raise PapaInputError(
                    f"matrices must have shape [layers={self.num_layers}, heads={self.num_heads}, L, L]; "
                    f"got {tuple(tensor.shape)}"
                )
            if tensor.shape[-1] != tensor.shape[-2]:
                raise PapaInputError(f"matrices must be square in their last two dims; got {tuple(tensor.shape)}")
            if not bool(torch.isfinite(tensor).all()):
                raise PapaInputError("matrices hold NaN or infinite entries: every output would be NaN")
            tensor = tensor.detach().to(device=device, dtype=torch.float32)
        used_modes = set(self.plan.values())
        needs_average = {"constant", "mix"} & used_modes or ("trainable" in used_modes and trainable_init == "average")
        if needs_average and tensor is None:
            raise PapaInputError(f"modes {sorted(used_modes)} need constant matrices (pass `matrices`)")
        if trainable_init not in ("average", "toeplitz"):
            raise PapaInputError(f"trainable_init must be 'average' or 'toeplitz', got {trainable_init!r}")
        self.length = int(tensor.shape[-1]) if tensor is not None else max_length
        if "trainable" in used_modes and self.length is None:
            raise PapaInputError("trainable matrices need a size: pass `matrices` or `max_length`")

        self.theta = nn.Parameter(torch.zeros(self.num_layers, self.num_heads, device=device))
        codes = torch.zeros(self.num_layers, self.num_heads, dtype=torch.long)
        for (layer, head), head_mode in self.plan.items():
            codes[layer, head] = MODES.index(head_mode)
        self.register_buffer("mode_codes", codes.to(device), persistent=False)
        self.trainable = nn.ParameterDict()
        self._bases: dict[int, torch.Tensor | None] = {}
        self._dynamic_cache: dict[tuple[int, int], torch.Tensor] = {}
        # App. A position of each token of the running batch ([B, W]); None: sequence index = position (padded run)
        self.positions: torch.Tensor | None = None
        # shared attention modules (ALBERT): the layer index is the call order within the running forward pass
        self._calls = 0
        for layer in range(self.num_layers):
            layer_modes = self.layer_modes(layer)
            if "trainable" in layer_modes:
                init = (
                    tensor[layer]
                    if trainable_init == "average"
                    else toeplitz_matrix(self.length, device=device).expand(self.num_heads, -1, -1)
                )
                self.trainable[str(layer)] = nn.Parameter(init.clone())
            if tensor is not None and {"constant", "mix"} & set(layer_modes):
                self._bases[layer] = tensor[layer]

    # ------------------------------------------------------------------ introspection
    def head_mode(self, layer: int, head: int) -> str:
        """The mode of one head (``original`` for heads outside the plan)."""
        return self.plan.get((layer, head), "original")

    def layer_modes(self, layer: int) -> list[str]:
        return [self.head_mode(layer, h) for h in range(self.num_heads)]

    def needs_input_attention(self, layer: int) -> bool:
        """Whether this layer needs the model's own A (some head is ``original`` or ``mix``)."""
        return any(m in _USES_INPUT_ATTENTION for m in self.layer_modes(layer))

    def next_layer(self) -> int:
        """The layer position of the next call of a shared attention module (ALBERT), in call order."""
        layer = self._calls % self.num_layers
        self._calls += 1
        return layer

    def lambdas(self) -> torch.Tensor:
        """λ = σ(θ) for every head ``[layers, heads]`` (meaningful for ``mix`` heads; Sec. 3.2)."""
        return torch.sigmoid(self.theta.detach()).cpu()

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The parameters an optimiser should update: θ if any head mixes, and any trainable matrices."""
        params = []
        if "mix" in self.plan.values():
            params.append(self.theta)
        params.extend(self.trainable.values())
        return params

    # ------------------------------------------------------------------ the math
    def _replacement_source(self, layer: int, length: int, device, dtype) -> torch.Tensor:
        """Unnormalised replacement matrices ``[heads, L, L]`` for one layer (zeros for heads that need none)."""
        modes = self.layer_modes(layer)
        if (
            self.length is not None
            and (length > self.length if self.causal else length != self.length)
            and any(m in ("constant", "mix", "trainable") for m in modes)
        ):
            raise PapaInputError(
                f"constant matrices were built at max_length L={self.length} but the input has L={length}; "
                f"encode with max_length={self.length} or rebuild the matrices"
            )
        key = (layer, length)
        if key not in self._dynamic_cache:
            base = self._bases.get(layer)
            rows = []
            for head, head_mode in enumerate(modes):
                if head_mode in ("constant", "mix"):
                    rows.append(base[head, :length, :length].to(device))  # a causal input may be shorter than L
                elif head_mode == "identity":
                    rows.append(torch.eye(length, device=device))
                elif head_mode == "toeplitz":
                    rows.append(toeplitz_matrix(length, device=device))
                elif head_mode == "previous":
                    rows.append(torch.diag(torch.ones(max(length - 1, 0), device=device), -1))
                elif head_mode == "uniform":
                    rows.append(torch.ones(length, length, device=device))
                else:
                    rows.append(torch.zeros(length, length, device=device))
            self._dynamic_cache[key] = torch.stack(rows)
        source = self._dynamic_cache[key].to(device=device, dtype=torch.float32)
        if str(layer) in self.trainable:
            is_trainable = torch.tensor([m == "trainable" for m in modes], device=device)[:, None, None]
            trained = self.trainable[str(layer)][:, :length, :length]
            source = torch.where(is_trainable, trained.clamp_min(0.0), source)
        return source.to(dtype)

    def replacement_weights(self, layer: int, real: torch.Tensor, dtype=torch.float32,
                            allowed: torch.Tensor | None = None) -> torch.Tensor:
        """Every head's replacement matrix for this input, masked to real tokens and row-normalised where the mode
        says so: ``[1 or B, H, W, W]``. With packed inputs (:attr:`positions` set) entry (i, j) of example b reads
        the App. A entry ``(positions[b, i], positions[b, j])`` — the same numbers as the padded batch.
        ``allowed`` (``[B, 1, W, W]`` bool) restricts the pairs further: a sliding-window layer's band (ModernBERT),
        where the layer's own attention is zero outside it, so an averaged C already is and a Toeplitz or identity
        matrix is cut to the window the layer can see."""
        modes = self.layer_modes(layer)
        width = real.shape[1]
        device = real.device
        if self.positions is None:
            source = self._replacement_source(layer, width, device, dtype)[None]  # [1, H, L, L]
        else:
            positions = self.positions.to(device)
            top = int(positions.max()) + 1 if positions.numel() else 1
            length = self.length if self.length is not None else top
            if top > length:
                raise PapaInputError(f"a token sits at App. A position {top - 1}, beyond the matrices' L={length}")
            index = positions.clamp(0, length - 1)
            full = self._replacement_source(layer, length, device, dtype)  # [H, L, L]
            source = full[:, index[:, :, None], index[:, None, :]].transpose(0, 1)  # [B, H, W, W]
        pair = real[:, None, :, None] & real[:, None, None, :]  # [B, 1, W, W]
        if allowed is not None:
            pair = pair & allowed
        pair = pair.to(dtype)
        masked = source * pair  # [B, H, W, W]
        row_sum = masked.sum(-1, keepdim=True)
        normalise = torch.tensor([m in _ROW_NORMALISED for m in modes], device=device)[None, :, None, None]
        normalised = masked / row_sum.clamp_min(torch.finfo(dtype).tiny)
        # A real query row with no mass on any real key (e.g. entries never seen while averaging) falls back to a
        # uniform row over the real keys, so every used row still sums to 1.
        empty = (row_sum <= 0) & real[:, None, :, None] & normalise
        uniform = pair / pair.sum(-1, keepdim=True).clamp_min(1.0)
        return torch.where(normalise, torch.where(empty, uniform, normalised), masked)

    def head_weights(self, layer: int, attention: torch.Tensor | None,
                     real: torch.Tensor,
                     allowed: torch.Tensor | None = None) -> torch.Tensor:
        """The attention weights ``[B, H, W, W]`` each head of ``layer``
        uses for this input.

        Args:
            layer: layer index.
            attention: the model's own softmax attention A ``[B, H, W, W]``
                (may be ``None`` when no head of this layer is ``original``
                or ``mix``).
            real: ``[B, W]`` bool, True at real (non-padding) tokens.
            allowed: optional ``[B, 1, W, W]`` bool, the (query, key) pairs
                the layer may use (a sliding window).
        """
        modes = self.layer_modes(layer)
        if all(m == "original" for m in modes):
            return attention
        dtype = attention.dtype if attention is not None else torch.float32
        replacement = self.replacement_weights(layer, real, dtype, allowed)

        code = self.mode_codes[layer]
        is_original = code == MODES.index("original")
        is_mix = code == MODES.index("mix")
        lam = torch.sigmoid(self.theta[layer]).to(dtype)
        gate_input = torch.where(is_mix, lam, is_original.to(dtype))  # weight on A: λ (mix), 1 (original), else 0
        gate_replacement = torch.where(is_mix, 1.0 - lam, (~is_original).to(dtype))  # 1 - λ (mix), 0 (original), else 1
        weights = gate_replacement[None, :, None, None] * replacement
        if attention is not None and self.needs_input_attention(layer):
            weights = weights + gate_input[None, :, None, None] * attention
        return weights

    # ------------------------------------------------------------------ attaching to a model
    @contextmanager
    def applied(self, model: nn.Module):
        """Context manager: run ``model`` with this override; leaving restores the model exactly."""
        adapter = adapter_for(model)
        modules = self_attention_modules(model)
        if any(getattr(m, "_papa_state", None) is not None for m in modules):
            raise RuntimeError("an attention override is already active on this model; overrides do not nest")
        if num_layers_and_heads(model) != (self.num_layers, self.num_heads):
            raise PapaInputError(f"this override was built for {self.num_layers} layers x {self.num_heads} heads; the "
                                 f"model has {' x '.join(map(str, num_layers_and_heads(model)))}")
        undo = []
        first_position = adapter.first_position_id(model.config)

        def read_positions(_module, _args, kwargs):
            position_ids = kwargs.get("position_ids")
            positions = None if position_ids is None else position_ids - first_position
            if positions is not None and bool((positions == torch.arange(positions.shape[-1],
                                                                         device=positions.device)).all()):
                positions = None  # a padded batch's App. A ids: sequence index = position, the shared fast path
            self.positions = positions
            self._calls = 0

        try:
            handle = model.register_forward_pre_hook(read_positions, with_kwargs=True)
            undo.append(lambda: (handle.remove(), setattr(self, "positions", None)))
            if adapter.shared_layers:  # one module, many layer positions: attach once, count calls
                unique = list({id(m): m for m in modules}.values())
                layers_of = {id(m): [i for i, n in enumerate(modules) if n is m] for m in unique}
            else:
                unique, layers_of = modules, {id(m): [i] for i, m in enumerate(modules)}
            for module in unique:
                layers = layers_of[id(module)]
                layer = None if adapter.shared_layers else layers[0]
                module._papa_state = (self, layer)
                undo.append(lambda module=module: delattr(module, "_papa_state"))
                if adapter.route == "probs_hook":
                    hook = _ProbabilityRewrite(layer, getattr(module, adapter.dropout), adapter.mask)
                    object.__setattr__(hook, "override", self)
                    setattr(module, adapter.dropout, hook)
                    handle = module.register_forward_pre_hook(hook.read_mask, with_kwargs=True)
                    undo.append(lambda module=module, hook=hook, handle=handle: (
                        handle.remove(), setattr(module, adapter.dropout, hook.inner)))
                elif self.fast and self.causal:  # Sec. 3.4 on a decoder: no Q/K rows for heads that do not read
                    reading = {h for i in layers for h, m in enumerate(self.layer_modes(i))
                               if m in _USES_INPUT_ATTENTION}
                    undo.append(skip_causal_projections(module, self.num_heads, reading))
                elif (self.fast and adapter.projections is not None
                      and not any(self.needs_input_attention(i) for i in layers)):
                    undo.append(skip_query_key_projections(module, adapter.projections))  # Sec. 3.4: no Q, no K
            if adapter.route == "interface":
                _register_attention_function()
                previous = model.config._attn_implementation
                model.config._attn_implementation = _IMPLEMENTATION
                undo.append(lambda: setattr(model.config, "_attn_implementation", previous))
            yield self
        finally:
            for step in reversed(undo):
                step()
            self._dynamic_cache.clear()


class _ProbabilityRewrite(nn.Module):
    """``probs_hook`` route (DeBERTa, MPNet): sits where the attention-probability dropout was and rewrites the
    probabilities; a forward pre-hook on the attention module reads which tokens are real from its mask."""

    def __init__(self, layer: int | None, inner: nn.Module, mask: str = "pair"):
        super().__init__()
        self.layer = layer
        self.inner = inner
        self.mask = mask
        self.real = None

    def read_mask(self, module, args, kwargs):
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
        read = real_tokens_from_pair_mask if self.mask == "pair" else real_tokens_from_additive_mask
        self.real = read(mask, hidden.shape[0], hidden.shape[1], hidden.device)

    def forward(self, probabilities: torch.Tensor) -> torch.Tensor:
        layer = self.layer if self.layer is not None else self.override.next_layer()
        weights = self.override.head_weights(layer, probabilities, self.real)
        return self.inner(weights)


def papa_attention_function(module, query, key, value, attention_mask,
                            scaling=None, dropout=0.0, **kwargs):
    """The attention function registered as ``"papa"`` in transformers'
    ``AttentionInterface``.

    Computes the eager softmax attention where some head still needs it,
    lets the active :class:`AttentionOverride` rewrite the weights, and
    returns ``(output [B, L, H, d'], weights [B, H, L, L])``.
    """
    state = getattr(module, "_papa_state", None)
    if state is not None and state[1] is None:
        # a shared module (ALBERT): the layer is the call order
        state = (state[0], state[0].next_layer())
    if state is not None and state[0].causal:
        return _causal_attention(state, module, query, key, value, attention_mask, scaling, dropout, **kwargs)
    # ModernBERT's local layers
    windowed = getattr(module, "sliding_window", None) is not None
    if state is not None and state[0].fast and not windowed:
        result = fast_attention(state[0], state[1], module, query, key,
                                value, attention_mask, scaling, dropout)
        if result is not None:
            return result
    batch, _, length, _ = query.shape
    attention = None
    if state is None or state[0].needs_input_attention(state[1]):
        attention = eager_weights(query, key, scaling, attention_mask)
    if state is not None:
        override_, layer = state
        real = real_tokens_from_additive_mask(attention_mask, batch, length,
                                              query.device)
        allowed = None
        if (windowed and attention_mask is not None
                and attention_mask.dim() == 4):
            allowed = allowed_pairs_from_additive_mask(attention_mask, length)
        weights = override_.head_weights(layer, attention, real, allowed)
    else:
        weights = attention
    weights = nn.functional.dropout(weights, p=dropout,
                                    training=module.training)
    output = torch.matmul(weights.to(value.dtype), value)
    return output.transpose(1, 2).contiguous(), weights


def _causal_allowed(attention_mask, batch: int, length: int, window, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(real [B, L], allowed [B, 1, L, L])`` for a decoder: key j <= query i, i - j < ``window`` (a local layer),
    j a real token, and whatever a 4D mask from transformers also forbids (``None``: no padding)."""
    real = real_tokens_from_additive_mask(attention_mask, batch, length, device)
    allowed = causal_band(length, window, device)[None, None] & real[:, None, None, :]
    if attention_mask is not None and attention_mask.dim() == 4 and attention_mask.shape[-1] == length:
        allowed = allowed & allowed_pairs_from_additive_mask(attention_mask, length)
    return real, allowed


def _causal_attention(state, module, query, key, value, attention_mask, scaling, dropout, **kwargs):
    """The decoder branch of :func:`papa_attention_function`: causality, the sliding window and the real keys are
    imposed here (not left to the mask), grouped-query keys/values are repeated per query head, and the model's own
    A (softmax in float32, Gemma's optional logit soft-cap) is computed only where some head of the layer needs it.
    With ``fast`` on, :func:`papa_lib.core.fastpath.fast_causal_attention` computes the layer when it can (the same
    outputs without Q·K, softmax or per-example weights for the replaced heads)."""
    override_, layer = state
    batch, heads, length, _ = query.shape
    if key.shape[-2] != length:
        raise PapaInputError(
            f"the PAPA override runs whole sequences: got {length} queries for {key.shape[-2]} keys (a KV cache?); "
            "call the model with use_cache=False and the full input"
        )
    window = kwargs.get("sliding_window", getattr(module, "sliding_window", None))
    if override_.fast:
        result = fast_causal_attention(override_, layer, module, query, key, value, attention_mask, scaling, dropout,
                                       window, kwargs.get("softcap"))
        if result is not None:
            return result
    groups = heads // key.shape[1]
    if groups > 1:  # grouped-query attention: one key/value head serves `groups` query heads (repeat_kv's order)
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    real, allowed = _causal_allowed(attention_mask, batch, length, window, query.device)
    attention = None
    if override_.needs_input_attention(layer):
        attention = causal_eager_weights(query, key, scaling, allowed, kwargs.get("softcap"))
    weights = override_.head_weights(layer, attention, real, allowed)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights.to(value.dtype), value)
    return output.transpose(1, 2).contiguous(), weights


_registered = False


def _register_attention_function() -> None:
    """Register the ``"papa"`` attention function and its (eager, additive) mask function with transformers."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(_IMPLEMENTATION, papa_attention_function)
    AttentionMaskInterface.register(_IMPLEMENTATION, eager_mask)
    _registered = True


@contextmanager
def override(
    model: nn.Module,
    matrices=None,
    heads="all",
    mode: str = "constant",
    *,
    trainable_init: str = "average",
    max_length: int | None = None,
    state: AttentionOverride | None = None,
    fast: bool | None = None,
):
    """Run ``model`` with some heads' attention replaced — PAPA's one seam (Sec. 3.2, Eq. 3; Sec. 5.2).

    Args:
        model: an encoder from :func:`papa_lib.load_encoder`.
        matrices: a :class:`~papa_lib.core.averaging.ConstantAttention` or a tensor ``[layers, heads, L, L]`` (needed by
            ``constant``, ``mix`` and average-initialised ``trainable`` heads).
        heads: ``"all"``, an iterable of ``(layer, head)`` pairs (those heads run ``mode``, the rest stay original),
            or a mapping ``{(layer, head): mode}`` for a mixed plan.
        mode: one of :data:`MODES`.
        trainable_init: ``"average"`` or ``"toeplitz"`` for ``trainable`` heads.
        max_length: size of trainable matrices when no ``matrices`` are given.
        state: reuse an existing :class:`AttentionOverride` (e.g. with learned θ) instead of building a new one.
        fast: use the fast path of :mod:`papa_lib.core.fastpath` (``None``: on for a new state, the state's own setting
            for a given ``state``); ``False`` runs the reference path. Both give the same outputs.

    Yields:
        The :class:`AttentionOverride` (θ, λ, trainable matrices).

    Example::

        with override(model, constants, heads=[(0, 3), (5, 1)]) as papa:
            logits = probe(model(**batch, output_hidden_states=True).hidden_states)
    """
    if state is None:
        state = AttentionOverride(
            model, matrices, heads, mode, trainable_init=trainable_init, max_length=max_length,
            fast=True if fast is None else fast,
        )
    elif fast is not None:
        state.fast = bool(fast)
    with state.applied(model):
        yield state
