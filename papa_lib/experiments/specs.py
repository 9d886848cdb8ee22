"""Checked grid files and custom-task specs: every key, type and range validated before anything runs.

A grid file (:func:`papa_lib.experiments.grid.load_grid`) and its ``custom_tasks:`` entries
(:mod:`papa_lib.experiments.custom`) are read as YAML *nodes* (``yaml.compose``) as well as values, so every problem
is reported as one line naming the file and the line it is on::

    grid.yaml:3: unknown key 'seed' (did you mean 'seeds'?)
    grid.yaml:9: blocks[0].fractions[1]: a fraction of input-dependent heads must be in [0, 1], got 1.5

(the command prints it as ``papa: error: <what> (<file>:<line>)`` and exits with 2). The models are pydantic v2
models with ``extra="forbid"``: :class:`GridSpec` (top-level settings and ``blocks``), :class:`BlockSpec` and
:class:`CustomTaskSpec`. Checked: unknown keys (with the closest valid key), types, fractions in [0, 1], seeds
non-negative integers, tasks (the paper's six and the file's own custom tasks), matrix types and orders that are
registered, lengths L of at least 4, positive limits, epochs, batch sizes and learning rates, per-task mappings
``{task: value, default: value}`` whose keys are known tasks.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from ..core.models import DEVICE_NAMES
from ..errors import PapaInputError
from .lm import DATA_FREE, LMSettings
from .matrices import MATRIX_TYPES
from .rankings import HEAD_RANKINGS
from .selection import ORDERS

__all__ = ["BlockSpec", "CustomTaskSpec", "GridSpec", "LanguageModelSpec", "SpecError", "at", "grid_reference",
           "line_of", "validate", "validate_grid", "yaml_nodes"]


class SpecError(PapaInputError):
    """A grid file or custom-task spec that does not validate: ``<file>:<line>: <what>`` (one line)."""


class _At(ValueError):
    """A problem found inside a field's value: ``sub`` is its path below the field (keys and indices)."""

    def __init__(self, sub: tuple, message: str):
        super().__init__(message)
        self.sub = sub


# ----------------------------------------------------------------------------------------------- value checks

_KINDS = {
    "positive_int": ("a positive integer", lambda v: _is_int(v) and v >= 1),
    "non_negative_int": ("a non-negative integer", lambda v: _is_int(v) and v >= 0),
    "length": ("an integer of at least 4 (the sequence length L)", lambda v: _is_int(v) and v >= 4),
    "positive_number": ("a positive number", lambda v: _is_number(v) and v > 0),
}


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check(value, kind: str, sub: tuple = ()):
    what, ok = _KINDS[kind]
    if value is not None and not ok(value):
        raise _At(sub, f"must be {what}, got {value!r}")
    return value


def _closest(word: str, choices) -> str:
    choices = [str(c) for c in choices]
    match = difflib.get_close_matches(str(word), choices, n=1, cutoff=0.6)
    match = match or [c for c in choices if c.startswith(str(word)) or str(word).startswith(c)][:1]
    return f" (did you mean {match[0]!r}?)" if match else ""


def _all_known(values: list, known, what: str) -> list:
    """``values`` when each is in ``known``; else an error at the first unknown one naming the closest and the known."""
    for i, name in enumerate(values):
        if name not in known:
            raise _At((i,), f"unknown {what} {name!r}{_closest(name, known)}; known: {', '.join(sorted(known))}")
    return values


def _known_tasks(info: ValidationInfo) -> set[str]:
    from .task_specs import TASKS

    return set(TASKS) | set((info.context or {}).get("custom_names", ()))


def _per_task(value, kind: str, info: ValidationInfo):
    """One value for every task, or a mapping ``{task: value, default: value}`` (keys: known tasks)."""
    if isinstance(value, dict):
        known = _known_tasks(info) | {"default"}
        for key, item in value.items():
            if key not in known:
                raise _At((key,), f"unknown task {key!r} in a per-task mapping{_closest(key, known)}; "
                                  f"keys are task names or 'default'")
            _check(item, kind, (key,))
        return value
    return _check(value, kind)


def _checks(kind: str, *fields: str, per_task: bool = False):
    """The validator of ``fields``: each value is ``kind`` (a key of ``_KINDS``; None passes) or, ``per_task``, that or
    a per-task mapping of such values (:func:`_per_task`)."""
    if per_task:
        return field_validator(*fields)(classmethod(lambda cls, value, info: _per_task(value, kind, info)))
    return field_validator(*fields)(classmethod(lambda cls, value: _check(value, kind)))


def _checks_with(check, *fields: str):
    """The validator of ``fields`` that returns ``check(value)`` (or raises what it raises)."""
    return field_validator(*fields)(classmethod(lambda cls, value: check(value)))


def _each_of(known, what: str, *fields: str):
    """The validator of the lists ``fields``: each item is in ``known`` (:func:`_all_known`; ``what`` names one)."""
    return _checks_with(lambda value: _all_known(value, known, what), *fields)


# ----------------------------------------------------------------------------------------------- models

def _key(default: Any = None, kind: str = "", text: str = "", factory=None, per_task: bool = False):
    """A field with its reference entry: ``kind`` (the type in words; ``per_task``: it also takes a mapping
    ``{task: value, default: value}``) and ``text`` (what it does); the grid-file reference page
    (:func:`grid_reference`) is generated from them."""
    extra = {"kind": kind + (", per task" if per_task else "")}
    if factory is not None:
        return Field(default_factory=factory, description=text, json_schema_extra=extra, min_length=1)
    return Field(default, description=text, json_schema_extra=extra)



def _check_seed_list(value: list) -> list:
    """A list of seeds: at least one, each a non-negative integer, none twice."""
    if not value:
        raise ValueError("must list at least one seed")
    for i, seed in enumerate(value):
        _check(seed, "non_negative_int", (i,))
    if len(set(value)) != len(value):
        raise ValueError(f"lists a seed twice: {value}")
    return value


def _check_fractions(value: list) -> list:
    for i, fraction in enumerate(value):
        if not _is_number(fraction) or not 0 <= fraction <= 1:
            raise _At((i,), f"a fraction of input-dependent heads must be a number in [0, 1], got {fraction!r}")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, arbitrary_types_allowed=True)


class CustomTaskSpec(_Strict):
    """One ``custom_tasks:`` entry (the fields of :class:`papa_lib.experiments.custom.CustomTask`)."""

    name: str = _key(..., "string", "the task's name in records and blocks (letters, digits, _ . -; not one of the "
                             "paper's tasks)")
    train: str = _key(..., "path", "training file (.tsv or .csv with a header row), relative to the grid file")
    validation: str = _key(..., "path", "validation file (results are reported on it), relative to the grid file")
    text_columns: Any = _key(..., "column name or list of two", "the text column, or two columns for a pair task")
    label_column: str = _key(..., "column name", "the label column (strings or integers; the label set is the "
                                                  "training file's, sorted)")
    metric: Literal["accuracy", "f1", "mcc", "matthews_corrcoef"] = _key(
        "accuracy", "accuracy, f1 or mcc", "the metric (f1: the positive class is the second sorted label)")
    max_length: Any = _key(None, "integer of at least 4", "sequence length L (even for a pair task); null: 128")
    delimiter: str | None = _key(None, "one character, tab, comma, semicolon or pipe",
                                 "field separator; null: from the file's extension")
    learning_rate: Any = _key(1e-4, "positive number", "probe learning rate (SST-2's row of Table 3)")
    batch_size: Any = _key(32, "positive integer", "probe batch size (SST-2's row of Table 3)")
    epochs: Any = _key(4, "positive integer", "probe epochs (SST-2's row of Table 3)")

    @field_validator("text_columns")
    @classmethod
    def _columns(cls, value):
        columns = value.split(",") if isinstance(value, str) else value
        if not isinstance(columns, list) or not 1 <= len(columns) <= 2 or not all(isinstance(c, str) and c.strip()
                                                                                  for c in columns):
            raise ValueError(f"must be one column name or a list of two, got {value!r}")
        return value

    _length = _checks("length", "max_length")
    _rate = _checks("positive_number", "learning_rate")
    _counts = _checks("positive_int", "batch_size", "epochs")


class BlockSpec(_Strict):
    """One block of a grid (see :class:`papa_lib.experiments.grid.GridBlock`)."""

    name: str = _key(..., "string", "the block's name (papa grid --blocks picks blocks by it)")
    tasks: list[str] = Field(min_length=1, description="the tasks it runs: the paper's six and the file's custom "
                             "tasks", json_schema_extra={"kind": "list of task names"})
    matrix_types: list[str] = _key(kind="list of matrix types", factory=lambda: ["average"],
                                   text="what replaced heads use (Sec. 3, 5.2): a registered matrix type")
    orders: list[str] = _key(kind="list of orders", factory=lambda: ["lambda"],
                             text="which heads are replaced first (Sec. 3.2, 5.4): a registered head ranking")
    fractions: list[Any] = _key(kind="list of numbers in [0, 1]", factory=lambda: [1, 0.5, 0.125, 0.0625, 0],
                                text="fractions of heads kept input-dependent (1: the original model)")
    matrices_from: str | None = _key(None, "task name", "build the constant matrices from this task's training text "
                                                        "(Sec. 5.3); null: each task's own")

    @field_validator("tasks")
    @classmethod
    def _tasks(cls, value, info: ValidationInfo):
        return _all_known(value, _known_tasks(info), "task")

    @field_validator("matrices_from")
    @classmethod
    def _source(cls, value, info: ValidationInfo):
        known = _known_tasks(info)
        if value is not None and value not in known:
            raise ValueError(f"unknown task {value!r}{_closest(value, known)}")
        return value

    _matrix_types = _each_of(MATRIX_TYPES, "matrix type", "matrix_types")
    _orders = _each_of(HEAD_RANKINGS, "order", "orders")
    _fractions = _checks_with(_check_fractions, "fractions")


_LM = LMSettings()  # the section's defaults are the experiment's own


class LanguageModelSpec(_Strict):
    """A grid's ``language_model:`` section: PAPA on a decoder's own next-token loss
    (:class:`papa_lib.experiments.lm.LMSettings`; the grid's model must be a decoder LM)."""

    corpus: Literal["wikitext-2", "wikitext-103"] = _key(_LM.corpus, "wikitext-2 or wikitext-103",
                                                         "the corpus: test windows scored, validation windows for "
                                                         "the constants and λ")
    length: Any = _key(_LM.length, "integer of at least 4", "tokens per window, <bos> included")
    test_windows: Any = _key(_LM.test_windows, "positive integer", "test windows scored (evenly spaced over the split)")
    average_windows: Any = _key(_LM.average_windows, "positive integer",
                                "validation windows the constant matrices average over")
    lambda_windows: Any = _key(_LM.lambda_windows, "positive integer",
                               "validation windows λ is learned on (the LM loss)")
    lambda_epochs: Any = _key(_LM.lambda_epochs, "positive integer", "epochs of λ training")
    lambda_learning_rate: Any = _key(_LM.lambda_learning_rate, "positive number",
                                     "Adam's learning rate for θ (λ = σ(θ))")
    lambda_seed: Any = _key(_LM.lambda_seed, "non-negative integer", "seed of the window order in λ training")
    orders: list[str] = _key(kind="list of orders", factory=lambda: list(_LM.orders),
                             text="head orders of the LM curve: lambda, reversed, random, first_to_last, "
                                  "last_to_first (λ: learned on the LM loss)")
    random_seeds: list[Any] = _key(kind="list of non-negative integers", factory=lambda: list(_LM.random_seeds),
                                   text="one random order per seed")
    fractions: list[Any] = _key(kind="list of numbers in [0, 1]", factory=lambda: list(_LM.fractions),
                                text="fractions of heads kept input-dependent")
    alternatives: list[str] = _key(kind="list of data-free modes", factory=lambda: list(_LM.alternatives),
                                   text="data-free replacements of every head")
    resamples: Any = _key(_LM.resamples, "positive integer", "bootstrap resamples of test windows for intervals")
    bootstrap_seed: Any = _key(_LM.bootstrap_seed, "non-negative integer", "seed of the bootstrap")

    _length = _checks("length", "length")
    _counts = _checks("positive_int", "test_windows", "average_windows", "lambda_windows", "lambda_epochs", "resamples")
    _rate = _checks("positive_number", "lambda_learning_rate")
    _seed = _checks("non_negative_int", "lambda_seed", "bootstrap_seed")
    _seeds = _checks_with(_check_seed_list, "random_seeds")
    _orders = _each_of(ORDERS, "order", "orders")
    _alternatives = _each_of(DATA_FREE, "data-free mode", "alternatives")
    _fractions = _checks_with(_check_fractions, "fractions")


class GridSpec(_Strict):
    """A grid file: top-level settings (see :func:`papa_lib.experiments.grid.run_grid`), ``custom_tasks`` and
    ``blocks``. Settings marked per task take one value or a mapping ``{task: value, default: value}``."""

    model: str | None = _key(None, "string", "hub id, local folder, all-mpnet-base-v2 (the mpnet extra) or the "
                                             "decoder LM gemma-3-270m (the gemma extra); null: the embedded "
                                             "all-MiniLM-L6-v2")
    data_dir: str | None = _key(None, "path", "data folder laid out like ../shared/data, relative to the working "
                                              "directory; null: the dataset hub. When it lacks SST-2 and every task "
                                              "is sst2, papa grid uses the packaged sample and says so")
    profile: Literal["smoke", "local", "paper"] = _key("local", "smoke, local or paper",
                                                       "the profile name written into every record (its profile "
                                                       "column, part of the run id); it sets nothing else")
    seeds: Any = _key(3, "positive integer or list of non-negative integers",
                      "n: seeds 0 to n-1; a list: those seeds (each seed draws its own training subset and probe)")
    limit: Any = _key(None, "positive integer", "training rows each seed's probe trains on (a seeded subset); "
                                                "null: every training example", per_task=True)
    average_limit: Any = _key(None, "positive integer", "training examples the constant matrices average over "
                                                        "(Eq. 2); null: the whole training set", per_task=True)
    eval_limit: Any = _key(None, "positive integer", "validation examples scored; null: all", per_task=True)
    max_length: Any = _key(None, "integer of at least 4", "sequence length L; null: Table 3's", per_task=True)
    epochs: Any = _key(None, "positive integer", "most probe epochs (early stopping); null: Table 3's",
                       per_task=True)
    patience: Any = _key(None, "positive integer", "epochs without held-out improvement before the probe stops; "
                                                   "null: 3", per_task=True)
    lambda_epochs: Any = _key(None, "positive integer", "epochs of λ training (Sec. 3.2); null: the probe's epochs",
                              per_task=True)
    inloop_epochs: Any = _key(None, "positive integer", "epochs of training inside the backbone (trainable matrix "
                                                        "types); null: the probe's epochs", per_task=True)
    inloop_limit: Any = _key(None, "positive integer", "training rows of that in-loop training; null: the seed's "
                                                       "rows", per_task=True)
    batch_size: Any = _key(None, "positive integer", "probe batch size; null: Table 3's", per_task=True)
    learning_rate: Any = _key(None, "positive number", "probe learning rate; null: Table 3's", per_task=True)
    lambda_learning_rate: Any = _key(None, "positive number", "learning rate of λ's θ; null: the probe's",
                                     per_task=True)
    matrix_learning_rate: Any = _key(None, "positive number", "learning rate of trainable matrices; null: the "
                                                              "probe's", per_task=True)
    lambda_seed: Any = _key(None, "non-negative integer", "learn λ once, on this seed's rows, for every seed's runs; "
                                                          "null: each seed learns its own λ")
    cache_budget: Any = _key(None, "size (8G, 512M) or bytes", "cached features per variant before streaming; "
                                                              "null: a quarter of the machine's memory")
    keep_features: bool = _key(False, "true or false", "keep a variant's cached features after its records are "
                                                       "written")
    device: str = _key("cpu", "auto, cpu, cuda, cuda:N or mps", "where runs compute (auto: CUDA when torch sees "
                                                                "a GPU)")
    custom_tasks: list[CustomTaskSpec] | None = _key(None, "list of custom tasks",
                                                     "tasks of your own from TSV/CSV files (keys: custom_tasks[])")
    language_model: LanguageModelSpec | None = _key(None, "language-model section",
                                                    "a decoder's own next-token loss under PAPA, run before the "
                                                    "blocks (keys: language_model.)")
    blocks: list[BlockSpec] = Field(description="the runs: each block is its tasks x matrix types x orders x "
                                    "fractions, for every seed (keys: blocks[])",
                                    json_schema_extra={"kind": "list of blocks"})

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, value):
        if isinstance(value, list):
            return _check_seed_list(value)
        if not _is_int(value) or value < 1:
            raise ValueError(f"must be a number of seeds (a positive integer) or a list of non-negative integers, "
                             f"got {value!r}")
        return value

    _counts = _checks("positive_int", "limit", "average_limit", "eval_limit", "inloop_limit", "epochs", "patience",
                      "lambda_epochs", "inloop_epochs", "batch_size", per_task=True)
    _length = _checks("length", "max_length", per_task=True)
    _rates = _checks("positive_number", "learning_rate", "lambda_learning_rate", "matrix_learning_rate", per_task=True)
    _lambda_seed = _checks("non_negative_int", "lambda_seed")  # None passes: λ per seed

    @field_validator("cache_budget")
    @classmethod
    def _budget(cls, value):
        from .features import parse_bytes

        if value is None:
            return value
        if isinstance(value, bool) or not isinstance(value, (int, str)) or parse_bytes(value) <= 0:
            raise ValueError(f"must be a size such as 8G or a positive number of bytes, got {value!r}")
        return value

    @field_validator("device")
    @classmethod
    def _device(cls, value):
        if not DEVICE_NAMES.fullmatch(value):
            raise ValueError(f"must be auto, cpu, cuda, cuda:N or mps, got {value!r}")
        return value


def grid_reference():
    """Every key of a grid file as a table (pandas DataFrame): ``where`` (top level, ``blocks[]``,
    ``custom_tasks[]``), ``key``, ``type``, ``default`` (``required`` where there is none) and ``description``, read
    from the models above, so the reference page (book/gridfile.md) cannot drift from what :func:`validate_grid`
    checks."""
    import pandas as pd
    from pydantic_core import PydanticUndefined

    def shown(field) -> str:
        if field.is_required():
            return "required"
        value = field.default_factory() if field.default_factory is not None else field.default
        if value is PydanticUndefined or value is None:
            return "null"
        if isinstance(value, bool):
            return str(value).lower()
        return ", ".join(map(str, value)) if isinstance(value, list) else str(value)

    rows = []
    for where, model in (("top level", GridSpec), ("blocks[]", BlockSpec), ("custom_tasks[]", CustomTaskSpec),
                         ("language_model.", LanguageModelSpec)):
        for key, field in model.model_fields.items():
            rows.append({"where": where, "key": key, "type": (field.json_schema_extra or {}).get("kind", ""),
                         "default": shown(field), "description": field.description or ""})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------- YAML and errors


def yaml_nodes(text: str):
    """The YAML node tree of ``text`` (``yaml.compose``), whose marks give each key's and value's line."""
    import yaml

    return yaml.compose(text, Loader=yaml.SafeLoader)


def line_of(node, loc: tuple, key_line: bool = False) -> int:
    """1-based line of the entry at ``loc`` (keys and indices) in a node tree; the deepest entry found.

    ``key_line``: for a mapping key, the line of the key itself (unknown keys), not of its value."""
    import yaml

    line = node.start_mark.line + 1 if node is not None else 1
    for depth, part in enumerate(loc):
        last = depth == len(loc) - 1
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if key.value == str(part):
                    line = (key if (last and key_line) else value).start_mark.line + 1
                    node = value
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def at(where: str, root, loc: tuple, key_line: bool = False) -> str:
    """``where:line`` of the entry at ``loc`` (just ``where`` without a node tree)."""
    return where if root is None else f"{where}:{line_of(root, loc, key_line)}"


def _dotted(loc: tuple) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _first_line(error: ValidationError, where: str, root, base: tuple, model: type[BaseModel]) -> str:
    """One line for the first problem of a pydantic error, ``<where>:<line>: <what>``."""
    errors = error.errors(include_url=False)
    item = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])  # a misspelt key explains the rest
    loc = tuple(item["loc"])
    cause = (item.get("ctx") or {}).get("error")
    if isinstance(cause, _At):
        loc += cause.sub
        message = str(cause)
    elif isinstance(cause, Exception):
        message = str(cause)
    else:
        message = item["msg"]
        message = message[:1].lower() + message[1:]
        if item["type"] not in ("missing", "extra_forbidden"):
            message += f", got {item['input']!r}"
    full = base + loc
    if item["type"] == "extra_forbidden":
        owner = _model_at(model, loc)
        fields = list(owner.model_fields) if owner is not None else []
        where_in = f" in {_dotted(base + loc[:-1])}" if loc[:-1] or base else ""
        return f"{at(where, root, full, True)}: unknown key {loc[-1]!r}{where_in}{_closest(loc[-1], fields)}"
    if item["type"] == "missing":
        return f"{at(where, root, full[:-1])}: {_dotted(full[:-1]) or 'the file'} lacks the key {loc[-1]!r}"
    return f"{at(where, root, full)}: {_dotted(full)}: {message}"


def _model_at(model: type[BaseModel], loc: tuple):
    """The model that owns the last key of ``loc`` (for the closest valid key)."""
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        annotation = model.model_fields.get(part) if model is not None else None
        if annotation is None:
            return model
        text = str(annotation.annotation)
        model = next((m for m in (BlockSpec, CustomTaskSpec, LanguageModelSpec) if m.__name__ in text), model)
    return model


def validate(model: type[BaseModel], data, where: str, root, base: tuple = (), context: dict | None = None):
    """``model.model_validate(data)``, or a :class:`SpecError` with one line naming ``where`` and the line."""
    try:
        return model.model_validate(data, context=context or {})
    except ValidationError as error:
        raise SpecError(_first_line(error, where, root, base, model)) from None


def validate_grid(path: str | Path) -> tuple[dict, Any]:
    """Read and check a grid file; ``(values, node tree)``. Raises :class:`SpecError` (``file:line: what``)."""
    import yaml

    path = Path(path)
    text = path.read_text()
    try:
        root = yaml_nodes(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = ' '.join(str(error).replace('in "<unicode string>", ', "").split())
        raise SpecError(f"{where}: invalid YAML: {problem}") from None
    _check_repeated_keys(root, str(path))
    if not isinstance(data, dict):
        raise SpecError(f"{path}:1: a grid file is a mapping of settings with a 'blocks' list, got "
                        f"{type(data).__name__}")
    customs = data.get("custom_tasks") if isinstance(data.get("custom_tasks"), list) else []
    names = [entry["name"] for entry in customs if isinstance(entry, dict) and isinstance(entry.get("name"), str)]
    validate(GridSpec, data, str(path), root, context={"custom_names": names})
    blocks = [block.get("name") for block in data.get("blocks") or [] if isinstance(block, dict)]
    for index, name in enumerate(blocks):
        if name in blocks[:index]:
            raise SpecError(f"{at(str(path), root, ('blocks', index, 'name'))}: a second block named {name!r} "
                            f"(line {line_of(root, ('blocks', blocks.index(name), 'name'))}); give each block its own "
                            "name")
    return data, root


def _check_repeated_keys(node, where: str) -> None:
    """A :class:`SpecError` at the second of two equal keys of one mapping: YAML would keep the last one silently
    (``seeds: [0]`` and, further down, ``seeds: [0, 1, 2, 3, 4]`` would run five seeds)."""
    import yaml

    if isinstance(node, yaml.MappingNode):
        first: dict = {}
        for key, value in node.value:
            same = (key.tag, key.value)  # 1 and '1' are two keys; merge keys (<<) add entries, they repeat nothing
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                if same in first:
                    raise SpecError(f"{where}:{key.start_mark.line + 1}: the key {key.value!r} is given twice (first "
                                    f"on line {first[same]}); YAML would keep only the last")
                first[same] = key.start_mark.line + 1
            _check_repeated_keys(value, where)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _check_repeated_keys(item, where)

