"""Fixed-position input layout of PAPA (paper App. A).

A constant attention matrix C^h has one row and one column per *position*. For it to mean the same thing on
every input, the special tokens must sit at the same positions in every example. App. A therefore fixes:

* single texts: ``[CLS] text [PAD]... [SEP]`` — the final separator is always at position L-1, after the padding;
* pairs: ``[CLS] a [PAD]... | [SEP] b [PAD]... [SEP]`` — text a and the classifier token fill [0, L/2), the middle
  separator(s) start at L/2, text b follows, and the final separator is at L-1.

We differ from the paper's code in two documented ways: a single text is truncated to L minus the special tokens
(the paper's code cuts it at L/2), and ``token_type_ids`` follow the new layout (the paper's code leaves them at the
positions of the ordinary layout, which gives BERT wrong segment ids).

The special tokens are learned from the tokenizer itself (:func:`special_token_template`), so BERT-style
(``[CLS] a [SEP] b [SEP]``), RoBERTa-style (``<s> a </s></s> b </s>``) and DeBERTa tokenizers all work.
``layout="standard"`` gives ordinary right padding for comparison.

Decoder LMs (:mod:`papa_lib.core.decoders`) use ``layout="causal"``: ``[bos] text [PAD]...``, right-padded, and a pair
as ``[bos] a <separator> b [PAD]...`` joined by a declared separator (default a newline, tokenized without special
tokens; the longer text is cut first). A causal row never sees the padding after it, and every real token sits at
its sequence index, so a decoder's constant matrices mean the same thing on every input. A tokenizer returned by
:func:`papa_lib.load_decoder` carries ``papa_layout = "causal"``, which ``encode`` uses when no layout is given.
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..errors import PapaInputError

LAYOUTS = ("papa", "standard", "causal")
#: The separator of a decoder pair when none is declared.
DEFAULT_SEPARATOR = "\n"
logger = logging.getLogger(__name__)


class EncodedBatch(dict):
    """A dict of ``[B, L]`` tensors (``input_ids``, ``attention_mask``, maybe ``token_type_ids``, and ``position_ids``
    when encoded for a model) plus facts about it.

    Attributes:
        layout: ``"papa"``, ``"standard"`` or ``"causal"``.
        max_length: L, the width of every tensor.
        num_truncated: how many examples lost tokens to truncation.
        word_index: for word-level (token task) batches, ``[B, W]`` position of each word's first sub-token, -1 where
            the word was truncated away or does not exist; ``None`` otherwise.
        model_type: ``config.model_type`` of the model the batch was encoded for (``encode(..., model=model)``),
            else ``None``.
    """

    def __init__(self, tensors: dict, *, layout: str, max_length: int, num_truncated: int, word_index=None,
                 separator: str | None = None, model_type: str | None = None):
        super().__init__(tensors)
        self.model_type = model_type
        self.separator = separator  # a decoder pair's declared separator (layout "causal"), else None
        self.layout = layout
        self.max_length = max_length
        self.num_truncated = num_truncated
        self.word_index = word_index

    @property
    def batch_size(self) -> int:
        return int(self["input_ids"].shape[0])


@dataclass(frozen=True)
class SpecialTokenTemplate:
    """Where a tokenizer puts its special tokens around one text or a pair, and their segment ids.

    ``prefix + a + suffix`` for one text; ``prefix + a + middle + b + suffix`` for a pair.
    """

    prefix: tuple[int, ...]
    middle: tuple[int, ...]
    suffix: tuple[int, ...]
    single_prefix: tuple[int, ...]
    single_suffix: tuple[int, ...]
    pad_id: int
    type_a: int = 0
    type_middle: int = 0
    type_b: int = 1
    type_suffix: int = 1
    uses_token_type_ids: bool = True


def _find(haystack: Sequence[int], needle: Sequence[int], start: int = 0) -> int:
    for i in range(start, len(haystack) - len(needle) + 1):
        if list(haystack[i : i + len(needle)]) == list(needle):
            return i
    raise ValueError("could not locate the probe text inside the tokenizer's own encoding")


def special_token_template(tokenizer) -> SpecialTokenTemplate:
    """Learn the tokenizer's special-token layout by encoding two probe texts with and without special tokens."""
    cached = getattr(tokenizer, "_papa_template", None)
    if cached is not None:
        return cached
    if tokenizer.pad_token_id is None:
        raise PapaInputError(f"tokenizer {type(tokenizer).__name__} has no pad token; PAPA's layout needs one")
    text_a, text_b = "hello there", "good morning"
    ids_a = tokenizer(text_a, add_special_tokens=False)["input_ids"]
    ids_b = tokenizer(text_b, add_special_tokens=False)["input_ids"]
    pair = tokenizer(text_a, text_b, return_token_type_ids=True)
    single = tokenizer(text_a)["input_ids"]
    full = pair["input_ids"]
    a_at = _find(full, ids_a)
    b_at = _find(full, ids_b, a_at + len(ids_a))
    s_at = _find(single, ids_a)
    types = pair.get("token_type_ids") or [0] * len(full)
    template = SpecialTokenTemplate(
        prefix=tuple(full[:a_at]),
        middle=tuple(full[a_at + len(ids_a) : b_at]),
        suffix=tuple(full[b_at + len(ids_b) :]),
        single_prefix=tuple(single[:s_at]),
        single_suffix=tuple(single[s_at + len(ids_a) :]),
        pad_id=int(tokenizer.pad_token_id),
        type_a=int(types[a_at]),
        type_middle=int(types[a_at + len(ids_a)]) if b_at > a_at + len(ids_a) else int(types[a_at]),
        type_b=int(types[b_at]),
        type_suffix=int(types[-1]),
        uses_token_type_ids="token_type_ids" in getattr(tokenizer, "model_input_names", ["token_type_ids"]),
    )
    try:
        tokenizer._papa_template = template
    except AttributeError:  # pragma: no cover - some tokenizers forbid new attributes
        pass
    return template


def _check_texts(texts, what: str = "texts") -> None:
    """A :class:`~papa_lib.errors.PapaInputError` unless ``texts`` is a sequence of strings, naming the first item
    that is not one (one string is not a sequence of texts: it would be read character by character)."""
    if isinstance(texts, str):
        raise PapaInputError(f"{what} must be a list of strings, not one string")
    bad = next(((i, text) for i, text in enumerate(texts) if not isinstance(text, str)), None)
    if bad is not None:
        raise PapaInputError(f"{what}[{bad[0]}] is {type(bad[1]).__name__} {bad[1]!r}, not a string")


def _tokenize(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    if len(texts) == 0:
        return []
    return list(tokenizer(list(texts), add_special_tokens=False)["input_ids"])


def _place_single(t: SpecialTokenTemplate, ids: list[int], length: int):
    """One text in the PAPA layout: prefix, text, padding, suffix ending at L-1."""
    room = length - len(t.single_prefix) - len(t.single_suffix)
    truncated = len(ids) > room
    ids = ids[:room]
    row = [t.pad_id] * length
    mask = [0] * length
    head = list(t.single_prefix) + ids
    row[: len(head)] = head
    mask[: len(head)] = [1] * len(head)
    tail_at = length - len(t.single_suffix)
    row[tail_at:] = list(t.single_suffix)
    mask[tail_at:] = [1] * len(t.single_suffix)
    types = [t.type_a] * length
    return row, mask, types, truncated, len(t.single_prefix)


def _place_pair(t: SpecialTokenTemplate, ids_a: list[int], ids_b: list[int], length: int):
    """A pair in the PAPA layout: [0, L/2) holds prefix + a; the middle separator(s) start at L/2; suffix at L-1."""
    half = length // 2
    room_a = half - len(t.prefix)
    room_b = length - half - len(t.middle) - len(t.suffix)
    if room_a < 1 or room_b < 1:  # no room for one token of a text: it would vanish without a word
        raise PapaInputError(f"max_length={length} leaves no room for both texts of a pair beside this tokenizer's "
                             "special tokens")
    truncated = len(ids_a) > room_a or len(ids_b) > room_b
    ids_a, ids_b = ids_a[:room_a], ids_b[:room_b]
    row = [t.pad_id] * length
    mask = [0] * length
    types = [t.type_a] * half + [t.type_b] * (length - half)
    head = list(t.prefix) + ids_a
    row[: len(head)] = head
    mask[: len(head)] = [1] * len(head)
    mid = list(t.middle) + ids_b
    row[half : half + len(mid)] = mid
    mask[half : half + len(mid)] = [1] * len(mid)
    types[half : half + len(t.middle)] = [t.type_middle] * len(t.middle)
    tail_at = length - len(t.suffix)
    row[tail_at:] = list(t.suffix)
    mask[tail_at:] = [1] * len(t.suffix)
    types[tail_at:] = [t.type_suffix] * len(t.suffix)
    return row, mask, types, truncated


def _place_standard(t: SpecialTokenTemplate, ids_a: list[int], ids_b: list[int] | None, length: int):
    """Ordinary right padding: prefix a [middle b] suffix, then padding. Truncates the longer text first."""
    if ids_b is None:
        room = length - len(t.single_prefix) - len(t.single_suffix)
        truncated = len(ids_a) > room
        seq = list(t.single_prefix) + ids_a[:room] + list(t.single_suffix)
        types = [t.type_a] * len(seq)
        offset = len(t.single_prefix)
    else:
        room = length - len(t.prefix) - len(t.middle) - len(t.suffix)
        a, b = list(ids_a), list(ids_b)
        truncated = len(a) + len(b) > room
        while len(a) + len(b) > room:
            (a if len(a) >= len(b) else b).pop()
        seq = list(t.prefix) + a + list(t.middle) + b + list(t.suffix)
        types = [t.type_a] * (len(t.prefix) + len(a) + len(t.middle)) + [t.type_b] * (len(b) + len(t.suffix))
        offset = len(t.prefix)
    pad = length - len(seq)
    return seq + [t.pad_id] * pad, [1] * len(seq) + [0] * pad, types + [0] * pad, truncated, offset


def _to_batch(rows, masks, types, template, layout, length, num_truncated, word_index=None,
              separator=None) -> EncodedBatch:
    """The rows as an :class:`EncodedBatch`, with ``token_type_ids`` where the encoder's ``template`` uses them
    (``template`` None: a causal batch, none)."""
    tensors = {
        "input_ids": torch.tensor(rows, dtype=torch.long).reshape(-1, length),
        "attention_mask": torch.tensor(masks, dtype=torch.long).reshape(-1, length),
    }
    if template is not None and template.uses_token_type_ids:
        tensors["token_type_ids"] = torch.tensor(types, dtype=torch.long).reshape(-1, length)
    if num_truncated:
        logger.info("%d of %d examples were truncated to max_length=%d", num_truncated, len(rows), length)
    return EncodedBatch(tensors, layout=layout, max_length=length, num_truncated=num_truncated,
                        word_index=word_index, separator=separator)


def _check_args(layout: str, max_length: int, pairs_given: bool) -> None:
    if layout not in LAYOUTS:
        raise PapaInputError(f"unknown layout {layout!r}; choose one of {LAYOUTS}")
    if isinstance(max_length, bool) or not isinstance(max_length, numbers.Integral):
        raise PapaInputError(f"max_length must be an integer, got {max_length!r}")
    if max_length < 4:
        raise PapaInputError(f"max_length must be at least 4, got {max_length}")
    if pairs_given and layout == "papa" and max_length % 2:  # the causal layout has no middle
        raise PapaInputError(
            f"the PAPA pair layout puts the middle separator at L/2, so max_length must be even (got {max_length})"
        )


def _encode_causal(tokenizer, texts, pairs, max_length: int, separator: str | None) -> EncodedBatch:
    """The decoder layout: ``[bos] a [separator b] [PAD]...``, right-padded to ``max_length``."""
    bos = tokenizer.bos_token_id
    if bos is None:
        raise PapaInputError(f"tokenizer {type(tokenizer).__name__} has no bos token; the decoder layout starts with "
                             "one")
    pad = next(i for i in (tokenizer.pad_token_id, tokenizer.eos_token_id, bos) if i is not None)
    separator = DEFAULT_SEPARATOR if separator is None else separator
    sep = list(tokenizer(separator, add_special_tokens=False)["input_ids"]) if pairs is not None and separator else []
    ids_a = _tokenize(tokenizer, texts)
    ids_b = _tokenize(tokenizer, pairs) if pairs is not None else [None] * len(ids_a)
    rows, masks, num_truncated = [], [], 0
    for a, b in zip(ids_a, ids_b):
        a = list(a)
        if b is None:
            truncated = len(a) > max_length - 1
            seq = [bos] + a[: max_length - 1]
        else:
            b, room = list(b), max_length - 1 - len(sep)
            if room < 0:
                raise PapaInputError(f"max_length={max_length} is too short for a pair joined by {separator!r}")
            truncated = len(a) + len(b) > room
            while len(a) + len(b) > room:
                (a if len(a) >= len(b) else b).pop()
            seq = [bos] + a + sep + b
        rows.append(seq + [pad] * (max_length - len(seq)))
        masks.append([1] * len(seq) + [0] * (max_length - len(seq)))
        num_truncated += int(truncated)
    return _to_batch(rows, masks, None, None, "causal", max_length, num_truncated,
                     separator=separator if pairs is not None else None)


def for_model(batch: EncodedBatch, model) -> EncodedBatch:
    """Make ``batch`` the exact keyword inputs of ``model`` (in place; returns it): its App. A ``position_ids``
    (:func:`papa_lib.core.models.layout_position_ids`; none for DeBERTa and decoder LMs, whose default is right) and
    no ``token_type_ids`` where the model has no segment embedding. ``model(**batch)`` then runs App. A positions."""
    from .models import with_app_a_positions

    with_app_a_positions(batch, batch, model)
    batch.model_type = model.config.model_type
    return batch


def encode(
    tokenizer, texts: Sequence[str], pairs: Sequence[str] | None = None, max_length: int = 64,
    layout: str | None = None, *, separator: str | None = None, model=None,
) -> EncodedBatch:
    """Encode texts (or text pairs) into fixed-width tensors in the PAPA layout (App. A), the standard one, or a
    decoder's.

    Args:
        tokenizer: a Hugging Face tokenizer (BERT-, RoBERTa- or DeBERTa-style; a decoder's for ``"causal"``).
        texts: the (first) texts.
        pairs: optional second texts, one per text.
        max_length: L; every tensor has exactly this width.
        layout: ``"papa"`` (fixed separator positions), ``"standard"`` (right padding) or ``"causal"`` (a decoder:
            ``[bos] text``, right-padded); ``None``: the tokenizer's ``papa_layout`` (``"causal"`` for one from
            :func:`papa_lib.load_decoder`), else ``"papa"``.
        separator: for ``"causal"`` pairs, the text joining a and b (default :data:`DEFAULT_SEPARATOR`, a newline);
            recorded as the batch's ``.separator``.
        model: the model the batch is for (recommended). The batch then carries the model's App. A
            ``position_ids`` and only the inputs it takes (:func:`for_model`), so ``model(**batch)`` is right on every
            architecture and ``pack(batch)`` knows the positions. Without it the batch has no ``position_ids``: the
            library's own paths (:func:`papa_lib.average_attention`, :func:`papa_lib.core.models.model_inputs`,
            packing with ``model=``, feature extraction) add them, and so does ``model(**batch)`` for BERT-like
            models (BERT, MiniLM, ELECTRA, ALBERT, DistilBERT and ModernBERT number positions from 0); a
            RoBERTa-style model (RoBERTa, XLM-R, MPNet) called directly would number positions by counting the
            non-pad tokens, which is not App. A: call it with ``model(**model_inputs(model, batch))``.

    Returns:
        An :class:`EncodedBatch` with ``input_ids``, ``attention_mask`` and, where the tokenizer (and the model)
        uses them, ``token_type_ids``, plus ``position_ids`` with ``model``; ``.num_truncated`` counts the examples
        that were cut.
    """
    if layout is None:
        layout = getattr(tokenizer, "papa_layout", None) or "papa"
    _check_args(layout, max_length, pairs is not None)
    _check_texts(texts)
    if pairs is not None:
        _check_texts(pairs, "pairs")
    if pairs is not None and len(pairs) != len(texts):
        raise PapaInputError(f"got {len(texts)} texts but {len(pairs)} pairs")
    if separator is not None and layout != "causal":
        raise PapaInputError(f"a separator is declared for the decoder layout only (layout='causal'), not {layout!r}")
    if layout == "causal":
        batch = _encode_causal(tokenizer, texts, pairs, max_length, separator)
        return batch if model is None else for_model(batch, model)
    template = special_token_template(tokenizer)
    ids_a = _tokenize(tokenizer, texts)
    ids_b = _tokenize(tokenizer, pairs) if pairs is not None else [None] * len(ids_a)
    rows, masks, types, num_truncated = [], [], [], 0
    for a, b in zip(ids_a, ids_b):
        if layout == "standard":
            row, mask, type_ids, truncated, _ = _place_standard(template, a, b, max_length)
        elif b is None:
            row, mask, type_ids, truncated, _ = _place_single(template, a, max_length)
        else:
            row, mask, type_ids, truncated = _place_pair(template, a, b, max_length)
        rows.append(row)
        masks.append(mask)
        types.append(type_ids)
        num_truncated += int(truncated)
    batch = _to_batch(rows, masks, types, template, layout, max_length, num_truncated)
    return batch if model is None else for_model(batch, model)


def encode_words(
    tokenizer, sentences: Sequence[Sequence[str]], max_length: int = 128, layout: str = "papa", *, model=None
) -> EncodedBatch:
    """Encode pre-split sentences (NER/POS) as single texts and record each word's first sub-token position.

    The label of a word sits on its first sub-token (Sec. 3.3, token tasks). Each word after the first is
    tokenized with a leading space, which is what RoBERTa-style byte-level tokenizers need and what BERT and
    SentencePiece tokenizers ignore. ``word_index[b, w]`` is -1 where word ``w`` was truncated away. ``model``: as
    for :func:`encode`.
    """
    _check_args(layout, max_length, False)
    if layout == "causal":
        raise PapaInputError("encode_words supports the encoder layouts 'papa' and 'standard', not 'causal'")
    if isinstance(sentences, str):
        raise PapaInputError("sentences must be a list of sentences, each a list of words, not one string")
    for index, words in enumerate(sentences):  # a string would be split into characters, one "word" each
        if isinstance(words, str):
            raise PapaInputError(f"sentences[{index}] is a string; each sentence is a list of words, e.g. "
                                 f"{words.split()[:3]!r}")
        _check_texts(words, f"sentences[{index}]")
    template = special_token_template(tokenizer)
    flat = [(w if i == 0 else " " + w) for words in sentences for i, w in enumerate(words)]
    flat_ids = _tokenize(tokenizer, flat)
    max_words = max((len(words) for words in sentences), default=0)
    room = max_length - len(template.single_prefix) - len(template.single_suffix)
    word_index = torch.full((len(sentences), max(max_words, 1)), -1, dtype=torch.long)
    rows, masks, types, num_truncated, cursor = [], [], [], 0, 0
    for b, words in enumerate(sentences):
        pieces = flat_ids[cursor : cursor + len(words)]
        cursor += len(words)
        starts, ids = [], []
        for piece in pieces:
            starts.append(len(ids) if piece else -1)
            ids.extend(piece)
        if layout == "standard":
            row, mask, type_ids, truncated, offset = _place_standard(template, ids, None, max_length)
        else:
            row, mask, type_ids, truncated, offset = _place_single(template, ids, max_length)
        for w, start in enumerate(starts):
            if 0 <= start < room:
                word_index[b, w] = offset + start
        rows.append(row)
        masks.append(mask)
        types.append(type_ids)
        num_truncated += int(truncated)
    batch = _to_batch(rows, masks, types, template, layout, max_length, num_truncated, word_index=word_index)
    return batch if model is None else for_model(batch, model)


def batched(encoded: EncodedBatch, batch_size: int):
    """Split an :class:`EncodedBatch` into consecutive batches of at most ``batch_size`` rows."""
    if batch_size < 1:
        raise PapaInputError("batch_size must be positive")
    n = encoded.batch_size
    for start in range(0, n, batch_size):
        part = {k: v[start : start + batch_size] for k, v in encoded.items()}
        wi = encoded.word_index[start : start + batch_size] if encoded.word_index is not None else None
        yield EncodedBatch(part, layout=encoded.layout, max_length=encoded.max_length, num_truncated=0, word_index=wi,
                           separator=getattr(encoded, "separator", None),
                           model_type=getattr(encoded, "model_type", None))
