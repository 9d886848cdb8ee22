"""Tiny random encoders and generated data: the ``smoke`` profile (CI, seconds) and the tests.

Nothing here is a result. The generated data only has to look like the real files (same formats as
``../shared/data``: GLUE TSVs, CoNLL-2003 columns, WikiText token files) and carry a learnable signal, so that every
code path of the book and the library runs end to end offline in seconds.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

ARCHITECTURES = (
    "bert", "roberta", "electra", "deberta", "deberta-v2", "xlm-roberta", "mpnet", "distilbert", "albert", "modernbert",
)

_POSITIVE = ["good", "great", "wonderful", "moving", "funny", "brilliant"]
_NEGATIVE = ["bad", "dull", "awful", "boring", "weak", "terrible"]
_NOUNS = ["film", "story", "cast", "plot", "ending", "score"]
_NAMES = ["alice", "bob", "carol", "dave"]
_PLACES = ["paris", "london", "rome", "tokyo"]
_ORGS = ["acme", "globex", "initech"]
_VERBS = ["visited", "left", "saw", "joined"]


def tiny_config(model_type: str, **overrides):
    """A tiny config (2 layers, 4 heads, hidden 32) of one supported architecture."""
    from transformers import (
        AlbertConfig,
        BertConfig,
        DebertaConfig,
        DebertaV2Config,
        DistilBertConfig,
        ElectraConfig,
        ModernBertConfig,
        MPNetConfig,
        RobertaConfig,
        XLMRobertaConfig,
    )

    common = dict(
        vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=160, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, type_vocab_size=2,
    )
    common.update(overrides)
    if model_type == "bert":
        return BertConfig(**common)
    if model_type == "roberta":
        return RobertaConfig(**{**common, "pad_token_id": 1, "type_vocab_size": 1})
    if model_type == "electra":
        return ElectraConfig(**{**common, "embedding_size": 24})
    if model_type == "deberta":
        return DebertaConfig(
            **{**common, "relative_attention": True, "pos_att_type": ["c2p", "p2c"], "max_relative_positions": -1}
        )
    if model_type == "deberta-v2":
        return DebertaV2Config(
            **{**common, "relative_attention": True, "pos_att_type": ["c2p", "p2c"], "position_buckets": 16,
               "norm_rel_ebd": "layer_norm", "share_att_key": True, "position_biased_input": False}
        )
    if model_type == "xlm-roberta":
        return XLMRobertaConfig(**{**common, "pad_token_id": 1, "type_vocab_size": 1})
    if model_type == "mpnet":
        return MPNetConfig(**{k: v for k, v in common.items() if k != "type_vocab_size"}, pad_token_id=1,
                           relative_attention_num_buckets=32)
    if model_type == "distilbert":
        return DistilBertConfig(
            vocab_size=common["vocab_size"], dim=common["hidden_size"], n_layers=common["num_hidden_layers"],
            n_heads=common["num_attention_heads"], hidden_dim=common["intermediate_size"],
            max_position_embeddings=common["max_position_embeddings"], dropout=common["hidden_dropout_prob"],
            attention_dropout=common["attention_probs_dropout_prob"], pad_token_id=0,
        )
    if model_type == "albert":  # one shared layer for both layer positions, as in the released checkpoints
        return AlbertConfig(**{**common, "embedding_size": 24, "num_hidden_groups": 1, "inner_group_num": 1})
    if model_type == "modernbert":  # layer 0 global, layer 1 local (a window of +-2 positions), rotary positions
        return ModernBertConfig(
            vocab_size=common["vocab_size"],
            hidden_size=common["hidden_size"],
            intermediate_size=common["intermediate_size"],
            num_hidden_layers=common["num_hidden_layers"],
            num_attention_heads=common["num_attention_heads"],
            max_position_embeddings=common["max_position_embeddings"],
            global_attn_every_n_layers=2,
            local_attention=4,
            attention_dropout=common["attention_probs_dropout_prob"],
            pad_token_id=0,
            bos_token_id=2,
            eos_token_id=3,
            cls_token_id=2,
            sep_token_id=3,
        )
    raise ValueError(f"unknown architecture {model_type!r}; choose one of {ARCHITECTURES}")


def tiny_model(model_type: str = "bert", seed: int = 0, **overrides):
    """A tiny randomly initialised encoder in eval mode with eager attention."""
    from transformers import AutoModel

    torch.manual_seed(seed)
    model = AutoModel.from_config(tiny_config(model_type, **overrides), attn_implementation="eager")
    model.eval()
    model.papa_model_id = f"tiny-random-{model_type}"
    return model  # packing and the override install what the architecture needs (papa_lib.core.models.prepare_model)


def _vocabulary() -> list[str]:
    words = set(_POSITIVE + _NEGATIVE + _NOUNS + _NAMES + _PLACES + _ORGS + _VERBS)
    words |= {"the", "a", "was", "is", "not", "and", "in", "to", "of", "it", "very", "quite", ".", ",", "=", "@", "-"}
    words |= {"he", "she", "they", "said", "today", "city", "company", "met", "there", "yes", "no", "maybe"}
    return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(words)


def tiny_tokenizer(folder: str | Path | None = None):
    """A BERT WordPiece tokenizer over the generated data's vocabulary, written to ``folder`` (a temp dir if None)."""
    import tempfile

    from transformers import BertTokenizerFast

    folder = Path(folder or tempfile.mkdtemp(prefix="papa-tiny-tokenizer-"))
    folder.mkdir(parents=True, exist_ok=True)
    words = _vocabulary()
    (folder / "vocab.txt").write_text("\n".join(words) + "\n")
    return BertTokenizerFast(vocab={w: i for i, w in enumerate(words)}, do_lower_case=True)


def tiny_encoder(model_type: str = "bert", seed: int = 0):
    """(model, tokenizer): a tiny random BERT-architecture encoder sized to :func:`tiny_tokenizer`'s vocabulary."""
    tokenizer = tiny_tokenizer()
    return tiny_model(model_type, seed, vocab_size=len(tokenizer)), tokenizer


def _review(rng: random.Random) -> tuple[str, int]:
    label = rng.randint(0, 1)
    word = rng.choice(_POSITIVE if label else _NEGATIVE)
    noun = rng.choice(_NOUNS)
    extra = rng.choice(["", " very", " quite"])
    return f"the {noun} was{extra} {word} .", label


def _tagged_sentence(rng: random.Random):
    name, verb, place = rng.choice(_NAMES), rng.choice(_VERBS), rng.choice(_PLACES)
    words = [name.title(), verb, rng.choice(["the", "a"]), "city", "of", place.title(), "."]
    pos = ["NNP", "VBD", "DT", "NN", "IN", "NNP", "."]
    ner = ["I-PER", "O", "O", "O", "O", "I-LOC", "O"]
    if rng.random() < 0.5:
        words[2:4], pos[2:4], ner[2:4] = [rng.choice(_ORGS).title(), "Corp"], ["NNP", "NNP"], ["I-ORG", "I-ORG"]
    return words, pos, ner


def generate_data_dir(root: str | Path, n_train: int = 64, n_dev: int = 32, seed: int = 0) -> Path:
    """Write a small data folder shaped like ``../shared/data`` (same file formats) with learnable signals."""
    rng = random.Random(seed)
    root = Path(root)
    glue = root / "glue"
    for split, n in (("train", n_train), ("dev", n_dev)):
        (glue / "SST-2").mkdir(parents=True, exist_ok=True)
        rows = ["sentence\tlabel"] + ["\t".join(map(str, _review(rng))) for _ in range(n)]
        (glue / "SST-2" / f"{split}.tsv").write_text("\n".join(rows) + "\n")
        (glue / "CoLA").mkdir(parents=True, exist_ok=True)
        cola = []
        for _ in range(n):
            text, _ = _review(rng)
            ok = rng.randint(0, 1)
            words = text.split()
            if not ok:
                rng.shuffle(words)
            cola.append(f"gen\t{ok}\t{'' if ok else '*'}\t{' '.join(words)}")
        (glue / "CoLA" / f"{split}.tsv").write_text("\n".join(cola) + "\n")
        (glue / "MNLI-sample").mkdir(parents=True, exist_ok=True)
        mnli = ["index\tsentence1\tsentence2\tgold_label"]
        labels = ["entailment", "neutral", "contradiction"]
        for i in range(n):
            premise, polarity = _review(rng)
            label = rng.randrange(3)
            if label == 0:
                hypothesis = premise
            elif label == 1:
                hypothesis = f"{rng.choice(_NAMES)} met {rng.choice(_NAMES)} today ."
            else:
                hypothesis = premise.replace("was", "was not")
            mnli.append(f"{i}\t{premise}\t{hypothesis}\t{labels[label]}")
        (glue / "MNLI-sample" / f"{split}.tsv").write_text("\n".join(mnli) + "\n")
        (glue / "MRPC").mkdir(parents=True, exist_ok=True)
        mrpc = ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"]
        for i in range(n):
            first, _ = _review(rng)
            same = rng.randint(0, 1)
            second = first.replace("the", "a") if same else _review(rng)[0]
            mrpc.append(f"{same}\t{i}\t{i + 1000}\t{first}\t{second}")
        (glue / "MRPC" / f"{split}.tsv").write_text("\n".join(mrpc) + "\n")
    conll = root / "conll2003"
    conll.mkdir(parents=True, exist_ok=True)
    for name, n in (("eng.train", n_train), ("eng.testa", n_dev), ("eng.testb", n_dev)):
        lines = ["-DOCSTART- -X- O O", ""]
        for _ in range(n):
            words, pos, ner = _tagged_sentence(rng)
            lines += [f"{w} {p} I-NP {t}" for w, p, t in zip(words, pos, ner)] + [""]
        (conll / name).write_text("\n".join(lines))
    wiki = root / "wikitext-2"
    wiki.mkdir(parents=True, exist_ok=True)
    for name, n in (("wiki.valid.tokens", n_train), ("wiki.test.tokens", n_dev)):
        lines = [" = Generated article = ", ""]
        for _ in range(n):
            lines.append(" " + " ".join(_review(rng)[0] for _ in range(3)) + " ")
        (wiki / name).write_text("\n".join(lines) + "\n")
    return root
