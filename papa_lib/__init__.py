"""papa_lib: PAPA (Hassid et al. 2022) — how much do pretrained Transformers use their input-dependent attention?

Layers (each imports only from the ones before it):

- :mod:`papa_lib.core`        encoders, decoder LMs and adapters, App. A layout, averaging (Eq. 2), the override seam,
                              fast path
- :mod:`papa_lib.experiments` tasks and metrics, probes, head selection, results store, the experiment engine
- :mod:`papa_lib.analysis`    norm-based analysis (Kobayashi et al. 2020), attention patterns, MLM probing
- :mod:`papa_lib.book`        figures, offline charts, profiles, the paper's numbers, chapter pages, the book build
- :mod:`papa_lib.cli`, :mod:`papa_lib.ops.bench`  the ``papa`` command and the benchmarks

The core API is importable from the package itself::

    import papa_lib
    model, tokenizer = papa_lib.load_encoder()               # embedded all-MiniLM-L6-v2
    batch = papa_lib.encode(tokenizer, ["a short text"], max_length=64, model=model)  # with App. A position_ids
    constants = papa_lib.average_attention(model, [batch])
    with papa_lib.override(model, constants):
        hidden = model(**batch).last_hidden_state        # or papa_lib.pack(batch): real tokens only
"""

from importlib import metadata as _metadata

try:  # the version is written once, in pyproject.toml; the installed package's metadata carries it
    __version__ = _metadata.version("papa_lib")
except _metadata.PackageNotFoundError:  # a checkout on sys.path that was never installed
    __version__ = "0+unknown"

# Importing the registering modules here registers every built-in (tasks, matrix types, constant builders, head
# rankings; the analysis layer's norm-weighted matrices and label-free rankings too) on ``import papa_lib``,
# whatever module is imported first; later registrations are extensions (papa_lib.core.registry).
from .analysis import norm_rankings as _norm_rankings  # noqa: F401
from .core.averaging import ConstantAttention, average_attention
from .core.decoders import load_decoder, next_token_nll
from .core.layout import EncodedBatch, encode, encode_words
from .core.models import (
    SUPPORTED_MODEL_TYPES,
    ArchitectureAdapter,
    UnsupportedModelError,
    load_encoder,
    register_adapter,
    supported_model_types,
)
from .core.override import MODES, AttentionOverride, override, toeplitz_matrix
from .core.packing import PackedBatch, pack, unpack
from .core.registry import seal_builtins as _seal_builtins
from .experiments import matrices as _matrices  # noqa: F401
from .experiments import rankings as _rankings  # noqa: F401
from .experiments import tasks as _tasks  # noqa: F401

_seal_builtins()

__all__ = [
    "ArchitectureAdapter",
    "AttentionOverride",
    "ConstantAttention",
    "EncodedBatch",
    "MODES",
    "SUPPORTED_MODEL_TYPES",
    "UnsupportedModelError",
    "average_attention",
    "encode",
    "encode_words",
    "load_decoder",
    "load_encoder",
    "next_token_nll",
    "register_adapter",
    "supported_model_types",
    "override",
    "pack",
    "PackedBatch",
    "unpack",
    "toeplitz_matrix",
    "__version__",
]
