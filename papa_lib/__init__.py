"""papa_lib: PAPA (Hassid et al. 2022) — how much do pretrained Transformers use their input-dependent attention?

One module per concept of the paper:

- :mod:`papa_lib.models`     supported encoders, the embedded default model, per-architecture adapters
- :mod:`papa_lib.layout`     the fixed-position input layout (App. A)
- :mod:`papa_lib.averaging`  constant matrices C^h = pad-aware average of A^h (Sec. 3.1, Eq. 2)
- :mod:`papa_lib.override`   the single seam that replaces/mixes attention per head (Sec. 3.2 Eq. 3, Sec. 5.2)
- :mod:`papa_lib.selection`  which heads to replace first (Sec. 3.2, 5.4)
- :mod:`papa_lib.probes`     frozen-model probing classifiers (Sec. 3.3)
- :mod:`papa_lib.tasks`      CoLA, SST-2, MRPC, MNLI, CoNLL NER/POS: data and metrics (Sec. 4.1, App. B)
- :mod:`papa_lib.results`    the tidy results store, confidence intervals, relative drops
- :mod:`papa_lib.norms`      norm-based attention analysis (Kobayashi et al. 2020) and norm-aware PAPA
- :mod:`papa_lib.mlm`        masked-language-model probing under PAPA (Sec. 5.5)
- :mod:`papa_lib.experiments` variants, feature cache, λ learning and declared grids (Sec. 4, 5)
- :mod:`papa_lib.profiles`   smoke / local / paper run profiles for the book
- :mod:`papa_lib.cli`        the ``papa`` command

The core API is importable from the package itself::

    import papa_lib
    model, tokenizer = papa_lib.load_encoder()               # embedded all-MiniLM-L6-v2
    batch = papa_lib.encode(tokenizer, ["a short text"], max_length=64)
    constants = papa_lib.average_attention(model, [batch])
    with papa_lib.override(model, constants):
        hidden = model(**batch).last_hidden_state
"""

__version__ = "0.1.0"

from .averaging import ConstantAttention, average_attention
from .layout import EncodedBatch, encode, encode_words
from .models import SUPPORTED_MODEL_TYPES, UnsupportedModelError, load_encoder
from .override import MODES, AttentionOverride, override, toeplitz_matrix

__all__ = [
    "AttentionOverride",
    "ConstantAttention",
    "EncodedBatch",
    "MODES",
    "SUPPORTED_MODEL_TYPES",
    "UnsupportedModelError",
    "average_attention",
    "encode",
    "encode_words",
    "load_encoder",
    "override",
    "toeplitz_matrix",
    "__version__",
]
