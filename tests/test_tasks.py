"""Tests for papa_lib.experiments.tasks: task specs, local file parsing, subsampling and metrics."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from papa_lib.experiments.metrics import compute_metric
from papa_lib.experiments.task_specs import (
    MLM_HPARAMS,
    NER_TAG_NAMES,
    POS_TAG_NAMES,
    TASKS,
    HubUnavailableError,
    SentenceExamples,
    TokenExamples,
    convert_iob1_to_iob2,
)
from papa_lib.experiments.tasks import CONLL_PARQUET_COMMIT, load_task, load_wikitext, unlabeled_texts

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def write(path: Path, text: str, encoding: str = "utf-8") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode(encoding))
    return path


# ----------------------------------------------------------------------------- specs


def test_task_specs_match_table_3():
    expected = {
        "cola": (2e-5, 16, 15, 64),
        "sst2": (1e-4, 32, 4, 64),
        "mnli": (2e-4, 8, 4, 256),
        "mrpc": (2e-5, 16, 15, 128),
        "ner": (1e-4, 8, 4, 128),
        "pos": (5e-4, 8, 4, 128),
    }
    assert set(TASKS) == set(expected)
    for name, (lr, batch, epochs, length) in expected.items():
        spec = TASKS[name]
        assert spec.name == name
        assert (spec.learning_rate, spec.batch_size, spec.epochs, spec.max_length) == (lr, batch, epochs, length)
    assert MLM_HPARAMS == dict(learning_rate=5e-4, batch_size=8, epochs=2, max_length=128)


def test_task_spec_kinds_metrics_labels():
    assert {n: TASKS[n].metric for n in TASKS} == {
        "cola": "matthews_corrcoef", "sst2": "accuracy", "mrpc": "f1",
        "mnli": "accuracy", "ner": "seqeval_f1", "pos": "seqeval_f1",
    }
    assert [n for n in TASKS if TASKS[n].is_pair] == ["mrpc", "mnli"]
    assert {n for n in TASKS if TASKS[n].kind == "token"} == {"ner", "pos"}
    assert TASKS["mnli"].label_names == ("entailment", "neutral", "contradiction")
    assert TASKS["mrpc"].label_names[1] == "equivalent"
    assert TASKS["cola"].label_names == ("unacceptable", "acceptable")
    assert TASKS["sst2"].label_names == ("negative", "positive")
    assert TASKS["ner"].num_labels == 9 and TASKS["pos"].num_labels == 47
    assert len(set(POS_TAG_NAMES)) == 47 and POS_TAG_NAMES[:3] == ('"', "''", "#")
    assert POS_TAG_NAMES[22] == "NNP" and POS_TAG_NAMES[-1] == "WRB"
    assert NER_TAG_NAMES[1] == "B-PER"
    assert "mismatched" in TASKS["mnli"].validation_split
    assert TASKS["mnli"].hub_validation_split == "validation_mismatched"
    assert "eng.testa" in TASKS["ner"].validation_split
    with pytest.raises(dataclasses.FrozenInstanceError):
        TASKS["cola"].epochs = 3  # frozen


def test_unknown_task_and_split(tmp_path):
    with pytest.raises(ValueError, match="unknown task 'qqp'"):
        load_task("qqp", "train", tmp_path)
    with pytest.raises(ValueError, match="unknown split 'test'"):
        load_task("sst2", "test", tmp_path)
    with pytest.raises(ValueError, match="limit"):
        load_task("sst2", "train", tmp_path, limit=0)


def test_missing_file_names_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"SST-2.dev\.tsv"):
        load_task("sst2", "validation", tmp_path)
    with pytest.raises(FileNotFoundError, match="MNLI-sample"):
        load_task("mnli", "train", tmp_path)


# ----------------------------------------------------------------------------- GLUE files


def test_sst2(tmp_path):
    path = write(
        tmp_path / "glue" / "SST-2" / "train.tsv",
        'sentence\tlabel\nit \'s a "charming" film \t1\r\n\nbleak and desperate \t0\n',
    )
    ex = load_task("sst2", "train", tmp_path)
    assert isinstance(ex, SentenceExamples)
    assert ex.texts == ['it \'s a "charming" film ', "bleak and desperate "]
    assert ex.pairs is None
    assert ex.labels == [1, 0]
    assert ex.source == str(path)
    assert len(ex) == 2


def test_sst2_columns_read_by_header_name(tmp_path):
    write(tmp_path / "glue" / "SST-2" / "dev.tsv", "label\tsentence\n0\tbad\n1\tgood\n")
    ex = load_task("sst2", "validation", tmp_path)
    assert ex.texts == ["bad", "good"] and ex.labels == [0, 1]


def test_cola_no_header(tmp_path):
    write(
        tmp_path / "glue" / "CoLA" / "dev.tsv",
        "gj04\t1\t\tThe sailors rode the breeze.\ngj04\t0\t*\tThe more does Bill smoke.",
    )
    ex = load_task("cola", "validation", tmp_path)
    assert ex.texts == ["The sailors rode the breeze.", "The more does Bill smoke."]
    assert ex.labels == [1, 0]
    assert ex.pairs is None


def test_mrpc_bom_and_msr_header(tmp_path):
    text = (
        "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
        "1\t702876\t702977\tAmrozi accused his brother .\tReferring to him , Amrozi accused his brother .\n"
        "0\t2108705\t2108831\tYucaipa owned Dominick 's .\tYucaipa bought Dominick 's in 1995 .\n"
    )
    write(tmp_path / "glue" / "MRPC" / "train.tsv", text, encoding="utf-8-sig")
    assert (tmp_path / "glue" / "MRPC" / "train.tsv").read_bytes()[:3] == b"\xef\xbb\xbf"
    ex = load_task("mrpc", "train", tmp_path)
    assert ex.texts == ["Amrozi accused his brother .", "Yucaipa owned Dominick 's ."]
    assert ex.pairs == ["Referring to him , Amrozi accused his brother .", "Yucaipa bought Dominick 's in 1995 ."]
    assert ex.labels == [1, 0]


def test_mrpc_glue_style_lowercase_header(tmp_path):
    write(tmp_path / "glue" / "MRPC" / "dev.tsv", "idx\tsentence1\tsentence2\tlabel\n0\ta\tb\t1\n1\tc\td\t0\n")
    ex = load_task("mrpc", "validation", tmp_path)
    assert (ex.texts, ex.pairs, ex.labels) == (["a", "c"], ["b", "d"], [1, 0])


MNLI_GLUE_HEADER = (
    "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
    "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label"
)


def test_mnli_glue_layout_preferred_over_sample(tmp_path):
    write(
        tmp_path / "glue" / "MNLI" / "dev_mismatched.tsv",
        MNLI_GLUE_HEADER + "\n"
        "0\t1\t1n\tletters\t( a )\t( b )\t(ROOT a)\t(ROOT b)\tPremise one.\tHypothesis one.\tneutral\tneutral\n"
        "1\t2\t2c\tletters\t( c )\t( d )\t(ROOT c)\t(ROOT d)\tPremise two.\tHypothesis two.\t"
        "contradiction\tcontradiction\n"
        "2\t3\t3e\tverbatim\t( e )\t( f )\t(ROOT e)\t(ROOT f)\tPremise three.\tHypothesis three.\t"
        "entailment\tentailment\n",
    )
    write(tmp_path / "glue" / "MNLI-sample" / "dev.tsv", "index\tsentence1\tsentence2\tgold_label\n0\tx\ty\tneutral\n")
    ex = load_task("mnli", "validation", tmp_path)
    assert ex.texts == ["Premise one.", "Premise two.", "Premise three."]
    assert ex.pairs == ["Hypothesis one.", "Hypothesis two.", "Hypothesis three."]
    assert ex.labels == [1, 2, 0]
    assert ex.source.endswith("dev_mismatched.tsv")
    assert "sample" not in ex.source.lower()


def test_mnli_sample_layout(tmp_path):
    path = write(
        tmp_path / "glue" / "MNLI-sample" / "dev.tsv",
        "index\tsentence1\tsentence2\tgold_label\n"
        "0\tSalt kept the town fed.\tSalt kept the town thriving.\tentailment\n"
        "1\tyeah or working\tWorking as a part.\tcontradiction\n",
    )
    ex = load_task("mnli", "validation", tmp_path)
    assert ex.texts == ["Salt kept the town fed.", "yeah or working"]
    assert ex.pairs == ["Salt kept the town thriving.", "Working as a part."]
    assert ex.labels == [0, 2]
    assert ex.source.startswith(str(path))
    assert "MNLI-sample" in ex.source and "NOT the mismatched" in ex.source


@pytest.mark.parametrize(
    "task, relpath, content, line, message",
    [
        ("sst2", "glue/SST-2/train.tsv", "sentence\tlabel\ngood\t1\nbad\tzero\n", 3, "not an integer"),
        ("sst2", "glue/SST-2/train.tsv", "sentence\tlabel\ngood\t1\n\nfine\t1\textra\n", 4, "expected 2"),
        ("sst2", "glue/SST-2/train.tsv", "sentence\tlabel\ngood\t2\n", 2, "out of range"),
        ("cola", "glue/CoLA/train.tsv", "gj04\t1\t\tOk.\ngj04\t1\tOnly three\n", 2, "expected 4"),
        ("cola", "glue/CoLA/train.tsv", "gj04\t1\t\tOk.\ngj04\t1\t\tOk.\ngj04\tx\t\tNo.\n", 3, "not an integer"),
        (
            "mrpc",
            "glue/MRPC/train.tsv",
            "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\ta\tb\nyes\t3\t4\tc\td\n",
            3,
            "not an integer",
        ),
        (
            "mnli",
            "glue/MNLI-sample/train.tsv",
            "index\tsentence1\tsentence2\tgold_label\n0\ta\tb\tneutral\n1\tc\td\tmaybe\n",
            3,
            "unknown gold_label 'maybe'",
        ),
        ("mnli", "glue/MNLI-sample/train.tsv", "index\tsentence1\tsentence2\tgold_label\n0\ta\tb\n", 2, "expected 4"),
    ],
)
def test_malformed_tsv_rows_name_file_and_line(tmp_path, task, relpath, content, line, message):
    write(tmp_path / relpath, content)
    with pytest.raises(ValueError) as info:
        load_task(task, "train", tmp_path)
    text = str(info.value)
    assert f"{Path(relpath).name}:{line}:" in text
    assert str(tmp_path) in text
    assert message in text


def test_header_missing_required_column(tmp_path):
    write(tmp_path / "glue" / "SST-2" / "train.tsv", "text\tlabel\ngood\t1\n")
    with pytest.raises(ValueError, match=r"train\.tsv:1: header .*sentence"):
        load_task("sst2", "train", tmp_path)


# ----------------------------------------------------------------------------- CoNLL


CONLL_TEXT = (
    "-DOCSTART- -X- O O\n"
    "\n"
    "EU NNP I-NP I-ORG\n"
    "rejects VBZ I-VP O\n"
    "German JJ I-NP I-MISC\n"
    "call NN I-NP O\n"
    ". . O O\n"
    "\n"
    "Peter NNP I-NP I-PER\n"
    "Blackburn NNP I-NP I-PER\n"
    "-DOCSTART- -X- O O\n"  # DOCSTART in the middle, right after a sentence, no blank line
    "\n"
    "\n"
    "In IN I-PP O\n"
    "Paris NNP I-NP I-LOC\n"
    "Lyon NNP I-NP B-LOC\n"
    "and CC O O\n"
    "New NNP I-NP I-LOC\n"
    "York NNP I-NP I-LOC\n"
    "\n"
    "-DOCSTART- -X- O O"  # DOCSTART at the end, no trailing newline
)


def test_conll_ner_iob1_converted_to_iob2(tmp_path):
    path = write(tmp_path / "conll2003" / "eng.train", CONLL_TEXT)
    ex = load_task("ner", "train", tmp_path)
    assert isinstance(ex, TokenExamples)
    assert ex.source == str(path)
    assert ex.tag_names == NER_TAG_NAMES
    assert ex.words == [
        ["EU", "rejects", "German", "call", "."],
        ["Peter", "Blackburn"],
        ["In", "Paris", "Lyon", "and", "New", "York"],
    ]
    as_names = [[NER_TAG_NAMES[i] for i in sentence] for sentence in ex.tags]
    assert as_names == [
        ["B-ORG", "O", "B-MISC", "O", "O"],
        ["B-PER", "I-PER"],
        ["O", "B-LOC", "B-LOC", "O", "B-LOC", "I-LOC"],
    ]
    assert ex.tags[0] == [3, 0, 7, 0, 0]


def test_conll_pos(tmp_path):
    write(tmp_path / "conll2003" / "eng.testa", CONLL_TEXT + "\n")
    ex = load_task("pos", "validation", tmp_path)
    assert ex.tag_names == POS_TAG_NAMES
    assert len(ex) == 3
    assert [[POS_TAG_NAMES[i] for i in s] for s in ex.tags][0] == ["NNP", "VBZ", "JJ", "NN", "."]
    assert ex.tags[1] == [22, 22]  # NNP is id 22 on the hub


def test_conll_iob2_input_unchanged(tmp_path):
    write(tmp_path / "conll2003" / "eng.train", "New NNP B-NP B-LOC\nYork NNP I-NP I-LOC\nis VBZ B-VP O\n")
    ex = load_task("ner", "train", tmp_path)
    assert [[NER_TAG_NAMES[i] for i in s] for s in ex.tags] == [["B-LOC", "I-LOC", "O"]]


@pytest.mark.parametrize(
    "content, line, message",
    [
        ("EU NNP I-NP I-ORG\nrejects VBZ I-VP\n", 2, "expected 4"),
        ("EU NNP I-NP I-ORG\n\nrejects VBZ I-VP O extra\n", 3, "expected 4"),
        ("EU NNP I-NP I-ORG\nrejects XYZ I-VP O\n", 2, "unknown POS tag 'XYZ'"),
        ("-DOCSTART- -X- O O\n\nEU NNP I-NP I-FOO\n", 3, "unknown NER tag 'I-FOO'"),
        ("EU NNP I-NP ORG\n", 1, "unknown NER tag 'ORG'"),
    ],
)
def test_conll_malformed_lines(tmp_path, content, line, message):
    write(tmp_path / "conll2003" / "eng.train", content)
    for task in ("ner", "pos"):
        with pytest.raises(ValueError) as info:
            load_task(task, "train", tmp_path)
        assert f"eng.train:{line}:" in str(info.value)
        assert message in str(info.value)


# ----------------------------------------------------------------------------- subsampling


def _sst2_fixture(tmp_path: Path, n: int = 50) -> None:
    rows = "".join(f"sentence number {i}\t{i % 2}\n" for i in range(n))
    write(tmp_path / "glue" / "SST-2" / "train.tsv", "sentence\tlabel\n" + rows)


def test_limit_is_deterministic_without_replacement(tmp_path):
    _sst2_fixture(tmp_path)
    a = load_task("sst2", "train", tmp_path, limit=10, seed=3)
    b = load_task("sst2", "train", tmp_path, limit=10, seed=3)
    c = load_task("sst2", "train", tmp_path, limit=10, seed=4)
    assert a.texts == b.texts and a.labels == b.labels
    assert len(a) == 10 and len(set(a.texts)) == 10
    assert a.texts != c.texts
    indices = [int(t.split()[-1]) for t in a.texts]
    assert indices == sorted(indices)  # file order kept
    assert all(label == i % 2 for i, label in zip(indices, a.labels))  # labels stay aligned
    assert "subsample of 10/50, seed 3" in a.source
    bigger = load_task("sst2", "train", tmp_path, limit=20, seed=3)
    assert set(a.texts) <= set(bigger.texts)
    everything = load_task("sst2", "train", tmp_path, limit=500, seed=3)
    assert len(everything) == 50 and "subsample" not in everything.source


def test_limit_token_task_and_pairs(tmp_path):
    sentences = "\n".join(f"w{i} NN I-NP {'I-PER' if i % 3 == 0 else 'O'}\nend . O O\n" for i in range(20))
    write(tmp_path / "conll2003" / "eng.train", sentences)
    full = load_task("ner", "train", tmp_path)
    assert len(full) == 20
    sub = load_task("ner", "train", tmp_path, limit=5, seed=1)
    assert len(sub) == 5 and sub.tag_names == NER_TAG_NAMES
    for words, tags in zip(sub.words, sub.tags):
        i = int(words[0][1:])
        assert tags == full.tags[i]
    write(
        tmp_path / "glue" / "MNLI-sample" / "train.tsv",
        "index\tsentence1\tsentence2\tgold_label\n"
        + "".join(f"{i}\tp{i}\th{i}\tneutral\n" for i in range(30)),
    )
    pairs = load_task("mnli", "train", tmp_path, limit=7, seed=0)
    assert [p[1:] for p in pairs.texts] == [h[1:] for h in pairs.pairs]


def test_unlabeled_texts_is_train_split(tmp_path):
    _sst2_fixture(tmp_path, 12)
    write(tmp_path / "glue" / "SST-2" / "dev.tsv", "sentence\tlabel\ndev only\t1\n")
    ex = unlabeled_texts("sst2", tmp_path, limit=4, seed=2)
    assert ex.texts == load_task("sst2", "train", tmp_path, limit=4, seed=2).texts
    assert "dev only" not in ex.texts


# ----------------------------------------------------------------------------- WikiText


def test_load_wikitext_local(tmp_path):
    write(
        tmp_path / "wikitext-2" / "wiki.valid.tokens",
        " \n = Homarus gammarus = \n \n Homarus gammarus is a <unk> lobster . \n \n"
        " = = Description = = \n \n It is large . \n = = = Sub = = = \n a = b holds . \n",
    )
    write(tmp_path / "wikitext-2" / "wiki.test.tokens", " = T = \n Test line . ")
    lines = load_wikitext("validation", tmp_path)  # wikitext-103 absent -> wikitext-2
    assert lines == ["Homarus gammarus is a <unk> lobster .", "It is large .", "a = b holds ."]
    assert load_wikitext("test", tmp_path, name="wikitext-2") == ["Test line ."]
    with pytest.raises(FileNotFoundError, match="wiki.train.tokens"):
        load_wikitext("train", tmp_path)
    with pytest.raises(ValueError, match="split"):
        load_wikitext("dev", tmp_path)
    with pytest.raises(ValueError, match="corpus"):
        load_wikitext("validation", tmp_path, name="wikitext-3")


# ----------------------------------------------------------------------------- hub


def test_hub_failure_gives_clear_error(monkeypatch):
    datasets = pytest.importorskip("datasets")

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach the hub")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(HubUnavailableError, match="--data-dir") as info:
        load_task("sst2", "validation")
    assert "nyu-mll/glue/sst2:validation" in str(info.value)
    with pytest.raises(HubUnavailableError, match="Salesforce/wikitext/wikitext-103-raw-v1"):
        load_wikitext("validation")


def test_hub_code_paths_with_fake_datasets(monkeypatch):
    """Exercise the hub conversion code with in-memory stand-ins for hub datasets."""
    datasets = pytest.importorskip("datasets")
    calls = []
    ner_names = list(NER_TAG_NAMES)

    def fake_load(path, name=None, split=None, **kwargs):
        calls.append((path, name, split, kwargs.get("revision")))
        if path == "nyu-mll/glue":
            features = datasets.Features({
                "premise": datasets.Value("string"),
                "hypothesis": datasets.Value("string"),
                "label": datasets.ClassLabel(names=["entailment", "neutral", "contradiction"]),
            })
            return datasets.Dataset.from_dict(
                {"premise": ["p0", "p1"], "hypothesis": ["h0", "h1"], "label": [2, 0]}, features=features
            )
        if path == "eriktks/conll2003":
            if kwargs.get("revision") != CONLL_PARQUET_COMMIT:
                raise AssertionError(f"CoNLL-2003 loaded from {kwargs.get('revision')!r}, not the pinned export")
            features = datasets.Features({
                "tokens": datasets.Sequence(datasets.Value("string")),
                "pos_tags": datasets.Sequence(datasets.ClassLabel(names=list(POS_TAG_NAMES))),
                "ner_tags": datasets.Sequence(datasets.ClassLabel(names=ner_names)),
            })
            return datasets.Dataset.from_dict(
                {"tokens": [["EU", "rejects"], []], "pos_tags": [[22, 42], []], "ner_tags": [[3, 0], []]},
                features=features,
            )
        if path == "Salesforce/wikitext":
            return datasets.Dataset.from_dict({"text": ["", " = Title = \n", " Body text . \n"]})
        raise AssertionError(path)

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    mnli = load_task("mnli", "validation")
    assert (mnli.texts, mnli.pairs, mnli.labels) == (["p0", "p1"], ["h0", "h1"], [2, 0])
    assert mnli.source == "hub:nyu-mll/glue/mnli:validation_mismatched"
    assert calls[-1] == ("nyu-mll/glue", "mnli", "validation_mismatched", None)

    ner = load_task("ner", "train")
    assert ner.words == [["EU", "rejects"]] and ner.tags == [[3, 0]]  # empty sentence dropped
    assert calls[-1][3] == CONLL_PARQUET_COMMIT  # the pinned parquet export, tried first (and only)
    assert [call for call in calls if call[0] == "eriktks/conll2003"] == [calls[-1]]
    pos = load_task("pos", "validation")
    assert pos.tags == [[22, 42]] and calls[-1][2] == "validation"

    ner_names[:] = ["O", "B-ORG", "I-ORG", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
    remapped = load_task("ner", "train")  # hub id 3 = B-PER in this order -> our id 1
    assert remapped.tags == [[1, 0]]

    assert load_wikitext("test", name="wikitext-2") == ["Body text ."]
    assert calls[-1] == ("Salesforce/wikitext", "wikitext-2-raw-v1", "test", None)


def test_conll_pinned_parquet_revision_first_then_branch(monkeypatch, caplog):
    """CoNLL-2003: the pinned parquet commit first; a hub without it gets the branch; failures: one-line errors."""
    datasets = pytest.importorskip("datasets")
    calls = []
    assert len(CONLL_PARQUET_COMMIT) == 40 and int(CONLL_PARQUET_COMMIT, 16) >= 0  # a full commit hash
    missing = "Revision '{}' doesn't exist for dataset 'eriktks/conll2003' on the Hub.\nRequest ID: x"

    def hub_without_pin(path, name=None, split=None, **kwargs):
        calls.append(kwargs.get("revision"))
        if kwargs.get("revision") == CONLL_PARQUET_COMMIT:
            raise datasets.exceptions.DatasetNotFoundError(missing.format(CONLL_PARQUET_COMMIT))
        return datasets.Dataset.from_dict({"tokens": [["EU", "rejects"]], "ner_tags": [[3, 0]]})

    monkeypatch.setattr(datasets, "load_dataset", hub_without_pin)
    with caplog.at_level("WARNING", logger="papa_lib.experiments.tasks"):
        ner = load_task("ner", "validation")
    assert calls == [CONLL_PARQUET_COMMIT, "refs/convert/parquet"] and ner.tags == [[3, 0]]
    (record,) = caplog.records
    assert "\n" not in record.getMessage() and "refs/convert/parquet" in record.getMessage()

    def offline(path, name=None, split=None, **kwargs):  # not a missing revision: no second try
        calls.append(kwargs.get("revision"))
        raise ConnectionError("Couldn't reach 'eriktks/conll2003' on the Hub (ConnectError)")

    calls.clear()
    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(HubUnavailableError, match="--data-dir") as info:
        load_task("pos", "train")
    assert calls == [CONLL_PARQUET_COMMIT] and "\n" not in str(info.value)

    def nothing(path, name=None, split=None, **kwargs):  # neither the pin nor the branch
        calls.append(kwargs.get("revision"))
        raise datasets.exceptions.DatasetNotFoundError(missing.format(kwargs.get("revision")))

    calls.clear()
    monkeypatch.setattr(datasets, "load_dataset", nothing)
    with pytest.raises(HubUnavailableError, match="refs/convert/parquet") as info:
        load_task("ner", "train")
    assert calls == [CONLL_PARQUET_COMMIT, "refs/convert/parquet"]
    assert "\n" not in str(info.value) and CONLL_PARQUET_COMMIT in str(info.value)


# ----------------------------------------------------------------------------- metrics


def test_cola_matthews_hand_computed():
    # TP=2, FP=1, TN=1, FN=1 -> (2*1 - 1*1) / sqrt(3*3*2*2) = 1/6
    preds, refs = [1, 1, 0, 0, 1], [1, 0, 0, 1, 1]
    assert compute_metric("cola", preds, refs) == pytest.approx(1 / 6)
    assert compute_metric("cola", refs, refs) == pytest.approx(1.0)
    assert compute_metric("cola", [1 - r for r in refs], refs) == pytest.approx(-1.0)
    assert compute_metric("cola", [1] * 5, refs) == 0.0  # undefined -> 0


def test_mrpc_f1_of_positive_class():
    preds, refs = [1, 1, 0, 0, 1, 0], [1, 0, 0, 1, 1, 0]
    # TP=2, FP=1, FN=1 -> P=R=2/3 -> F1=2/3
    assert compute_metric("mrpc", preds, refs) == pytest.approx(2 / 3)
    preds, refs = [1, 1, 1, 1], [1, 0, 0, 0]  # P=1/4, R=1 -> F1 = 2/5 (class-0 F1 would be 0)
    assert compute_metric("mrpc", preds, refs) == pytest.approx(0.4)
    assert compute_metric("mrpc", [0, 0], [1, 0]) == 0.0


def test_accuracy_tasks_and_numpy_inputs():
    np = pytest.importorskip("numpy")
    assert compute_metric("sst2", [1, 0, 1, 1], [1, 1, 1, 0]) == pytest.approx(0.5)
    assert compute_metric("mnli", np.array([0, 1, 2]), np.array([0, 2, 2])) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="3 predictions but 2 references"):
        compute_metric("sst2", [1, 0, 1], [1, 0])
    with pytest.raises(ValueError, match="integer label id"):
        compute_metric("sst2", [0.7], [1])
    with pytest.raises(ValueError, match="zero examples"):
        compute_metric("sst2", [], [])


def test_ner_seqeval_f1_hand_computed():
    refs = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    preds = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "O"]]
    # gold entities: PER, LOC, ORG; predicted: PER, ORG(wrong span type), ORG -> TP=2, P=2/3, R=2/3
    assert compute_metric("ner", preds, refs) == pytest.approx(2 / 3)
    ids = lambda seqs: [[NER_TAG_NAMES.index(t) for t in s] for s in seqs]  # noqa: E731
    assert compute_metric("ner", ids(preds), ids(refs)) == pytest.approx(2 / 3)
    partial = [["B-PER", "O", "O", "B-LOC"], ["O", "O"]]
    # predicted: PER(0..0) wrong span, LOC right -> P=1/2, R=1/3 -> F1=0.4
    assert compute_metric("ner", partial, refs) == pytest.approx(0.4)


def test_ner_modes_differ_on_ill_formed_predictions():
    refs = [["B-PER", "I-PER", "O"]]
    preds = [["I-PER", "I-PER", "O"]]  # conlleval reads I-PER I-PER as one PER entity
    assert compute_metric("ner", preds, refs) == pytest.approx(1.0)
    assert compute_metric("ner", preds, refs, ner_mode="strict") == pytest.approx(0.0)
    with pytest.raises(ValueError, match="ner_mode"):
        compute_metric("ner", preds, refs, ner_mode="lenient")


def test_pos_seqeval_f1():
    refs = [["NNP", "VBZ", "JJ"], ["NN", "."]]
    preds = [["NNP", "VBZ", "NN"], ["NN", ","]]
    # seqeval reads NNP as type NP, VBZ as BZ, JJ as J, NN as N; '.' and ',' open no chunk. Reference chunks
    # NP, BZ, J, N; predicted NP, BZ, N, N: 3 of 4 match (P = R = F1 = 0.75; token accuracy would be 3/5).
    assert compute_metric("pos", preds, refs) == pytest.approx(0.75)
    assert compute_metric("pos", refs, refs) == pytest.approx(1.0)
    ids = lambda seqs: [[POS_TAG_NAMES.index(t) for t in s] for s in seqs]  # noqa: E731
    assert compute_metric("pos", ids(preds), ids(refs)) == pytest.approx(0.75)
    with pytest.raises(ValueError, match="sentence 1 has 1 predicted tags but 2"):
        compute_metric("pos", [["NN", "NN", "NN"], ["NN"]], refs)
    with pytest.raises(ValueError, match="out of range"):
        compute_metric("pos", [[99, 0, 0], [0, 0]], ids(refs))


@pytest.mark.parametrize(
    "iob1, iob2",
    [
        ([], []),
        (["O", "O"], ["O", "O"]),
        (["I-PER", "I-PER", "O"], ["B-PER", "I-PER", "O"]),
        (["I-LOC", "B-LOC", "I-LOC"], ["B-LOC", "B-LOC", "I-LOC"]),
        (["I-ORG", "I-MISC", "I-MISC"], ["B-ORG", "B-MISC", "I-MISC"]),
        (["O", "I-PER", "O", "I-PER"], ["O", "B-PER", "O", "B-PER"]),
        (["B-PER", "I-PER", "O", "B-LOC"], ["B-PER", "I-PER", "O", "B-LOC"]),  # IOB2 unchanged
    ],
)
def test_convert_iob1_to_iob2(iob1, iob2):
    assert convert_iob1_to_iob2(iob1) == iob2
    assert convert_iob1_to_iob2(iob2) == iob2  # idempotent


def test_convert_iob1_rejects_bad_tags():
    with pytest.raises(ValueError, match="'PER' at position 1"):
        convert_iob1_to_iob2(["O", "PER"])


# ----------------------------------------------------------------------------- real data


@pytest.mark.slow
def test_real_shared_data_row_counts():
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    expected = {
        ("sst2", "train"): 67349, ("sst2", "validation"): 872,
        ("cola", "train"): 8551, ("cola", "validation"): 1043,
        ("mnli", "train"): 8999, ("mnli", "validation"): 1000,
        ("ner", "train"): 14041, ("ner", "validation"): 3250,
        ("pos", "train"): 14041, ("pos", "validation"): 3250,
    }
    for (task, split), count in expected.items():
        ex = load_task(task, split, SHARED_DATA)
        assert len(ex) == count, (task, split, ex.source)
        if isinstance(ex, SentenceExamples):
            assert set(ex.labels) == set(range(TASKS[task].num_labels))
            assert all(text for text in ex.texts)
        else:
            assert all(len(w) == len(t) > 0 for w, t in zip(ex.words, ex.tags))
    assert "MNLI-sample" in load_task("mnli", "validation", SHARED_DATA).source
    if (SHARED_DATA / "glue" / "MRPC").is_dir():
        mrpc = load_task("mrpc", "validation", SHARED_DATA)
        assert set(mrpc.labels) == {0, 1}
    # CoNLL-2003 dev has 5942 entities (1842 PER, 1837 LOC, 1341 ORG, 922 MISC).
    ner = load_task("ner", "validation", SHARED_DATA)
    begins = sum(1 for s in ner.tags for t in s if NER_TAG_NAMES[t].startswith("B-"))
    assert begins == 5942
    assert math.isclose(compute_metric("ner", ner.tags, ner.tags), 1.0)
    for split in ("validation", "test"):
        lines = load_wikitext(split, SHARED_DATA)
        assert len(lines) > 1000
        assert not any(line.startswith("= ") and line.endswith(" =") for line in lines)
        assert all(line == line.strip() and line for line in lines)
