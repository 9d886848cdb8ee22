"""The provenance banner: every label comes from the records it describes, never from the reader's setup."""

from __future__ import annotations

import pandas as pd

from papa_lib.book import profiles, provenance


def _records(**extra):
    base = {"model": ["all-MiniLM-L6-v2"] * 4, "seed": [0, 1, 2, 0], "profile": ["local"] * 4,
            "device": ["cuda", "cpu", "cpu", "cpu"],
            "data_source": ["train: /tmp/x/data/glue/SST-2/train.tsv; validation: /tmp/x/data/glue/SST-2/dev.tsv"] * 4,
            "finished_at": ["2026-11-21T10:00:00+00:00", "2026-11-22T10:00:00+00:00",
                            "2026-11-23T10:00:00+00:00", "2026-11-23T11:00:00+00:00"]}
    base.update(extra)
    return pd.DataFrame(base)


def test_committed_facts_read_seeds_device_and_data_from_the_records():
    text = provenance.committed_facts(_records())
    assert "3 seeds (0, 1, 2)" in text
    assert "a CPU (3 runs) and a CUDA GPU (1 run)" in text
    assert "2026-11-21 to 2026-11-23" in text
    assert "local files: SST-2" in text
    assert "/tmp" not in text


def test_where_label_names_records_that_read_lambda_learned_on_another_device():
    # R16: three CPU runs, two of them on λ learned on a GPU, one reading no λ; a GPU run on its own GPU λ
    frame = _records(lambda_device=["cuda", "cuda", "", "cuda:0"])
    text = provenance.where_label(frame)
    assert text.startswith("a CPU (3 runs; 2 of them read λ learned on a CUDA GPU) and a CUDA GPU (1 run),")
    assert "λ" not in provenance.where_label(_records(lambda_device=["cuda", "cpu", "not recorded", ""]))
    # counted by row: two folders' records concatenated keep their own indexes (0-3 twice)
    twice = provenance.where_label(pd.concat([frame, frame]))
    assert twice.startswith("a CPU (6 runs; 4 of them read λ learned on a CUDA GPU) and a CUDA GPU (2 runs),")
    # a GPU run on λ learned on a CPU says so too
    gpu = provenance.where_label(_records(lambda_device=["cpu", "", "", ""]))
    assert "a CUDA GPU (1 run; it read λ learned on a CPU)" in gpu


def test_banner_names_the_packaged_sample_for_live_cells_and_the_full_files_for_records(tmp_path):
    setup = profiles.resolve("local", data_dir=tmp_path / "no-such-folder")
    assert setup.data_source == "sample"
    shown = provenance.banner(setup, _records(), live="the example")
    committed, live = (text for _, text in shown.lines())
    assert "local files: SST-2" in committed and "packaged sample" not in committed
    assert "packaged sample" in live and "the example" in live
    html = shown._repr_html_()
    assert "overflow-wrap" in html and str(tmp_path) not in html


def test_banner_without_records_says_so():
    setup = profiles.resolve("smoke")
    shown = provenance.banner(setup, records=False, live=None)
    assert [text.split(":")[0] for _, text in shown.lines()] == ["nothing", "nothing"]
    assert provenance.seeds_label([float("nan")]) == ""


def test_shown_path_never_prints_a_machine_folder(tmp_path):
    from papa_lib.smoke import generate_data_dir

    setup = profiles.resolve("smoke", data_dir=generate_data_dir(tmp_path / "papa-smoke-data"))
    text = provenance.shown_path(f"{setup.data_dir}/wikitext-2 (probe: wiki.valid.tokens)", setup)
    assert str(tmp_path) not in text and text.startswith("papa-smoke-data/wikitext-2")


def test_seeds_per_setting_names_the_fewest_and_most_seeds_of_a_setting():
    import pandas as pd

    rows = [{"task": "cola", "matrix_type": "original", "fraction": 1.0, "seed": s} for s in range(10)]
    rows += [{"task": "cola", "matrix_type": "average", "fraction": 0.5, "seed": s} for s in range(3)]
    assert provenance.seeds_per_setting(pd.DataFrame(rows)) == "3 to 10 seeds (0-9)"
    assert provenance.seeds_per_setting(pd.DataFrame(rows[:10])) == provenance.seeds_label(range(10))
    # the committed-run sentence of a page's banner says the same: a union of seeds would overstate the 3-seed rows
    assert provenance.committed_facts(pd.DataFrame(rows)) == "13 records: 3 to 10 seeds (0-9)"
