"""Masked-language-modelling (MLM) probing with PAPA (paper Sec. 5.5, Fig. 6a; App. B Table 3 "MLM" row).

Sec. 5.5 reports the *negative log perplexity* (higher is better) of BASE models on the WikiText-103 validation
set as more and more heads are replaced by constant matrices, and contrasts MLM-pretrained models with ELECTRA's
discriminator, which was never trained to fill in masked tokens. The paper states little of the MLM setup beyond
Table 3's hyperparameters; the authors' released code (``papa_modules.py``) has an MLM probe whose input and tied
decoder ours keeps (its MLP and layer norm differ). The data, masking, probe and score are
:mod:`papa_lib.analysis.mlm_probe` (each design choice, and where the probe departs from the released one, is stated
there); this module learns λ for MLM, scores a pretrained MLM head as a reference, and runs the curve. Reading a
profile's results into Fig. 6 and the numbers of Sec. 5.5 is the MLM chapter's own work (``book/mlm.md``).

Curve (:func:`run_mlm_curve`)
    1. Constant matrices C^h are averaged (Sec. 3.1, :func:`papa_lib.average_attention`) over the masked
       training sequences, i.e. over the inputs the model actually sees in this task.
    2. λ^h (Sec. 3.2, Eq. 3): the MLM probe is trained jointly with every head in ``mix`` mode, θ in the same
       AdamW optimiser as the probe, on the training sequences, with the probe's hyperparameters
       (:func:`learn_mlm_lambdas`). Heads with the smallest λ are replaced first
       (:func:`papa_lib.experiments.selection.heads_to_replace`, order ``'lambda'``). λ is learned once per seed, and
       only when some fraction strictly between 0 and 1 still has to run.
    3. For each fraction of input-dependent heads in {1, 1/2, 1/8, 1/16, 0}: the other heads run their constant
       matrix, the backbone's features are extracted, a fresh probe is trained and evaluated.
    4. Where the model carries a *pretrained* MLM head (load with ``load_encoder(name, with_mlm_head=True)``),
       that head's score on the same masked evaluation tokens is reported once as a reference
       (``matrix_type='pretrained_head'``, fraction 1). A head that ``transformers`` had to initialise because
       the checkpoint lacks it (e.g. the embedded all-MiniLM-L6-v2, a sentence encoder) is detected by
       :func:`mlm_head_status` and reported as unavailable instead of scoring random weights.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import Tensor, nn

from ..core.artefacts import read_or_heal
from ..core.averaging import ConstantAttention, average_attention
from ..core.layout import batched
from ..core.models import base_encoder, model_id, num_layers_and_heads
from ..core.override import AttentionOverride
from ..experiments.inloop import learn_lambdas
from ..experiments.loop import optimizer_for, set_seed
from ..experiments.provenance import config_hash, package_versions, run_provenance
from ..experiments.results import ResultsStore
from ..experiments.selection import PAPER_FRACTIONS, heads_to_replace
from ..experiments.task_specs import MLM_HPARAMS
from ..experiments.workspace import LAMBDA_SUFFIX, read_lambdas, write_lambdas
from .mlm_probe import (
    HUB_TRAIN_SEQUENCES_DEFAULT,
    MASK_PROBABILITY,
    MaskedFeatures,
    MaskedSequences,
    MLMProbe,
    epoch_batches,
    evaluate_mlm_probe,
    extract_masked_features,
    gather_layers,
    load_mlm_corpus,
    make_mlm_probe,
    mask_tokens,
    masked_batch_inputs,
    masked_token_log_probs,
    mlm_sequences,
    neg_log_perplexity,
    sequence_log_probs,
    train_mlm_probe,
)

__all__ = [
    "MLM_DESIGN_VERSION",
    "lambda_files",
    "lambda_path",
    "learn_mlm_lambdas",
    "mlm_head_status",
    "pretrained_head_log_probs",
    "run_mlm_curve",
]

#: Bumped whenever the experiment's design changes, so stored results of an older design are not reused.
MLM_DESIGN_VERSION = "mlm-v1"


# ----------------------------------------------------------------------------------------------------------------
# λ (Sec. 3.2) for MLM
# ----------------------------------------------------------------------------------------------------------------


class _JointMLM(nn.Module):
    """Frozen backbone (run under the ``mix`` override that :func:`learn_lambdas` applies) + MLM probe, trained
    together so θ gets gradients."""

    def __init__(self, encoder: nn.Module, probe: MLMProbe):
        super().__init__()
        self.encoder = encoder
        self.probe = probe

    def train(self, mode: bool = True):
        super().train(mode)
        self.encoder.eval()  # the backbone is frozen: no dropout inside it
        return self

    def forward(self, inputs: dict, rows: Tensor, cols: Tensor) -> Tensor:
        outputs = self.encoder(**inputs, output_hidden_states=True)
        return self.probe(gather_layers(outputs.hidden_states, rows, cols))


def learn_mlm_lambdas(
    model,
    train: MaskedSequences,
    constants: ConstantAttention,
    *,
    seed: int = 0,
    epochs: int = int(MLM_HPARAMS["epochs"]),
    batch_size: int = int(MLM_HPARAMS["batch_size"]),
    lr: float = float(MLM_HPARAMS["learning_rate"]),
    device: str | torch.device = "cpu",
    progress: bool = False,
) -> Tensor:
    """λ^h = σ(θ^h) for MLM: the library's λ learner (:func:`papa_lib.experiments.inloop.learn_lambdas`) with an
    MLM probe on masked sequences. θ and the probe share Table 3's learning rate; dropout draws from the global
    generator after :func:`set_seed` (``seed``). Returns λ ``[layers, heads]`` on the CPU."""
    encoder = base_encoder(model)
    layers, _ = num_layers_and_heads(encoder)
    set_seed(seed)
    probe = make_mlm_probe(model, layers + 1)
    encoder_device = next(encoder.parameters()).device

    def batches(epoch: int):
        for index in epoch_batches(len(train), seed, epoch, batch_size):
            rows, cols = train.selected[index].nonzero(as_tuple=True)
            if len(rows) == 0:
                continue
            inputs = masked_batch_inputs(encoder, train.inputs, index)
            targets = train.original_ids[index][rows, cols]
            yield (inputs, rows.to(encoder_device), cols.to(encoder_device)), targets

    return learn_lambdas(encoder, constants, probe, lambda state: _JointMLM(encoder, probe).to(device), batches,
                         seed=seed, epochs=epochs, learning_rate=lr, own_stream=False, device=device)


# ----------------------------------------------------------------------------------------------------------------
# The pretrained MLM head (reference)
# ----------------------------------------------------------------------------------------------------------------


def _head_parameters(model) -> list[tuple[str, nn.Parameter]]:
    """Parameters of ``model`` outside its base encoder and not shared with the input embeddings."""
    encoder = base_encoder(model)
    if encoder is model:
        return []
    inside = {id(p) for p in encoder.parameters()}
    return [(name, p) for name, p in model.named_parameters(remove_duplicate=False) if id(p) not in inside]


def mlm_head_status(model) -> tuple[bool, str]:
    """Whether ``model`` carries a usable *pretrained* MLM head, and why (not).

    A model from ``load_encoder(name, with_mlm_head=True)`` always has a head, but ``transformers`` silently
    creates one with fresh weights when the checkpoint has none (e.g. the embedded all-MiniLM-L6-v2, or an ELECTRA
    discriminator loaded as ``ElectraForMaskedLM``). Detection, in order:

    1. ``model.papa_mlm_head_pretrained`` (bool), when a loader set it explicitly;
    2. ``model.papa_missing_keys`` (the ``missing_keys`` of ``from_pretrained(..., output_loading_info=True)``), when
       present: the head is pretrained iff none of its parameters is missing;
    3. otherwise the weights themselves: a freshly initialised head has every 1-D parameter (biases, LayerNorm
       weights and biases) exactly all-zero or all-one, which a trained head never has.
    """
    output_embeddings = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if output_embeddings is None:
        return False, f"{type(model).__name__} has no MLM head (load it with load_encoder(..., with_mlm_head=True))"
    head = _head_parameters(model)
    if not head:
        return False, f"{type(model).__name__} has no MLM head parameters"
    explicit = getattr(model, "papa_mlm_head_pretrained", None)
    if explicit is not None:
        return (True, "marked pretrained") if explicit else (False, "marked as not pretrained")
    missing = getattr(model, "papa_missing_keys", None)
    if missing is not None:
        names = {name for name, _ in head}
        lacking = sorted(k for k in missing if k in names)
        if lacking:
            return False, f"the checkpoint has no MLM head weights ({', '.join(lacking[:3])}...): newly initialised"
        return True, "loaded from the checkpoint"
    vectors = [(name, p) for name, p in head if p.dim() == 1]
    if vectors and all(bool((p == 0).all()) or bool((p == 1).all()) for _, p in vectors):
        return False, "the MLM head looks freshly initialised (all biases 0, LayerNorm 1/0): the checkpoint has none"
    return True, "MLM head weights look trained"


@torch.inference_mode()
def pretrained_head_log_probs(model, masked: MaskedSequences, batch_size: int = 8) -> Tensor:
    """Per-sequence mean log-probability of the original tokens under the model's own MLM head (original attention)."""
    device = next(model.parameters()).device
    token_log_probs, sequence_index = [], []
    for start in range(0, len(masked), batch_size):
        index = slice(start, start + batch_size)
        logits = model(**masked_batch_inputs(model, masked.inputs, index)).logits
        rows, cols = masked.selected[index].nonzero(as_tuple=True)
        token_log_probs.append(
            masked_token_log_probs(logits[rows.to(device), cols.to(device)], masked.original_ids[index][rows, cols])
        )
        sequence_index.append(rows + start)
    return sequence_log_probs(torch.cat(token_log_probs), torch.cat(sequence_index), len(masked))


# ----------------------------------------------------------------------------------------------------------------
# The curve
# ----------------------------------------------------------------------------------------------------------------


def lambda_path(results_dir: Path, key: str) -> Path:
    """Where the λ learned under ``key`` (a hash of the curve's settings and seed) is stored: beside the grid's λ,
    ``results_dir/lambdas/``, in their format (:func:`papa_lib.experiments.workspace.write_lambdas`)."""
    return Path(results_dir) / "lambdas" / f"mlm-from-mlm-{key}{LAMBDA_SUFFIX}"


def lambda_files(results_dir: Path) -> list[Path]:
    """Every MLM λ file under ``results_dir`` (sorted by name); what each was learned under is its
    :func:`papa_lib.experiments.workspace.read_lambda_info`."""
    return sorted((Path(results_dir) / "lambdas").glob(f"mlm-from-mlm-*{LAMBDA_SUFFIX}"))


def run_mlm_curve(
    model,
    tokenizer,
    data_dir: str | Path | None = None,
    fractions: Sequence[float] = PAPER_FRACTIONS,
    seeds: Sequence[int] = (0,),
    max_length: int = int(MLM_HPARAMS["max_length"]),
    train_sequences: int | None = None,
    eval_sequences: int | None = None,
    epochs: int = int(MLM_HPARAMS["epochs"]),
    batch_size: int = int(MLM_HPARAMS["batch_size"]),
    lr: float = float(MLM_HPARAMS["learning_rate"]),
    device: str | torch.device = "cpu",
    results_dir: str | Path | None = None,
    progress: bool = True,
    *,
    mask_seed: int = 0,
    mask_probability: float = MASK_PROBABILITY,
) -> pd.DataFrame:
    """The MLM curve of Fig. 6a: negative log perplexity vs the fraction of input-dependent heads.

    See the module docstring for the design. ``model`` is a bare encoder or an MLM model (then its pretrained head,
    when it has one, is also scored once as a reference). The model is moved to ``device``.

    Returns:
        One row per ``fraction x seed`` (``matrix_type='average'``, ``selection_order='lambda'``, ``value`` =
        negative log perplexity, ``ci_low``/``ci_high`` its 95% interval over evaluation sequences, plus
        ``masked_accuracy``, ``num_replaced_heads``, target counts and the final training loss), and one
        ``matrix_type='pretrained_head'`` row where a pretrained head exists. With ``results_dir`` every record is
        appended to ``ResultsStore(results_dir)`` (task ``'mlm'``, metric ``'neg_log_perplexity'``) and runs whose
        ``run_id`` is already stored are not recomputed (their stored record is returned); the learned λ per seed
        go to :func:`lambda_path` (``results_dir/lambdas/``).
    """
    from tqdm.auto import tqdm

    if not fractions:
        raise ValueError("fractions is empty")
    if not seeds:
        raise ValueError("seeds is empty")
    for seed in seeds:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise ValueError(f"seeds must be integers, got {seed!r}")
    model.to(device)
    model.eval()
    encoder = base_encoder(model)
    num_layers, num_heads = num_layers_and_heads(encoder)
    store = ResultsStore(results_dir) if results_dir is not None else None
    results_path = Path(results_dir) if results_dir is not None else None
    name = model_id(model)

    corpus = load_mlm_corpus(data_dir)
    if train_sequences is None and corpus["hub"]:
        train_sequences = HUB_TRAIN_SEQUENCES_DEFAULT
    base_config = {
        "design": MLM_DESIGN_VERSION, "model": name, "task": "mlm", "corpus": corpus["corpus"],
        "max_length": int(max_length), "train_sequences": train_sequences, "eval_sequences": eval_sequences,
        "epochs": int(epochs), "batch_size": int(batch_size), "lr": float(lr), "mask_seed": int(mask_seed),
        "mask_probability": float(mask_probability), "probe": "concat-layers-mlp-tied-decoder",
    }

    def run_config(fraction: float, seed: int, matrix_type: str, order: str | None) -> dict:
        return {**base_config, "fraction": float(fraction), "seed": int(seed), "matrix_type": matrix_type,
                "selection_order": order}

    curve_ids = {
        (float(f), int(s)): config_hash(run_config(f, s, "average", "lambda")) for s in seeds for f in fractions
    }
    head_id = config_hash(run_config(1.0, mask_seed, "pretrained_head", None))
    head_available, head_reason = mlm_head_status(model)
    records: dict[str, dict] = {}
    for run_id in [*curve_ids.values(), head_id]:
        if store is not None and store.has(run_id):
            records[run_id] = store.get(run_id)
    pending_curve = [key for key, run_id in curve_ids.items() if run_id not in records]
    pending_head = head_available and head_id not in records
    if not head_available and progress:
        print(f"[mlm] pretrained MLM head not scored: {head_reason}")

    if pending_curve or pending_head:
        train_encoded = mlm_sequences(tokenizer, corpus["train_lines"], max_length, train_sequences)
        eval_encoded = mlm_sequences(tokenizer, corpus["eval_lines"], max_length, eval_sequences)
        train_masked = mask_tokens(train_encoded, tokenizer, mask_seed, mask_probability)
        # mask_seed + 1 for the evaluation corpus, so its sequence i is not masked at the same offsets as train's i.
        eval_masked = mask_tokens(eval_encoded, tokenizer, mask_seed + 1, mask_probability)
        common = {
            "model": name, "task": "mlm", "metric": "neg_log_perplexity", "eval_size": len(eval_masked),
            "train_size": len(train_masked), "profile": None, "data_source": corpus["source"],
            "versions": package_versions(), "device": str(device),
            **run_provenance(str(device), corpus.get("files", {}), optimizer_for(device)),
            "eval_targets": eval_masked.num_targets, "train_targets": train_masked.num_targets,
        }

    if pending_head:
        started = time.time()
        per_sequence = pretrained_head_log_probs(model, eval_masked, batch_size)
        mean, low, high = neg_log_perplexity(per_sequence)
        records[head_id] = {
            **common, "run_id": head_id, "matrix_type": "pretrained_head", "matrices_from": None,
            "selection_order": None, "fraction": 1.0, "seed": int(mask_seed), "value": mean, "ci_low": low,
            "ci_high": high, "config_hash": head_id, "wall_time_s": time.time() - started, "num_replaced_heads": 0,
        }
        if store is not None:
            store.append(records[head_id])

    if pending_curve:
        constants = None
        feature_cache: dict[tuple, tuple[MaskedFeatures, MaskedFeatures]] = {}
        everything = tuple((layer, h) for layer in range(num_layers) for h in range(num_heads))

        def features_for(heads: list[tuple[int, int]]):
            key = tuple(sorted(heads))
            if key not in feature_cache:
                state = AttentionOverride(encoder, constants, list(key), "constant") if key else None
                pair = (extract_masked_features(encoder, train_masked, batch_size, state, progress),
                        extract_masked_features(encoder, eval_masked, batch_size, state, progress))
                # Only the original model and the fully constant one recur across seeds; keep just those.
                for old in [k for k in feature_cache if k not in ((), everything)]:
                    del feature_cache[old]
                feature_cache[key] = pair
            return feature_cache[key]

        bar = tqdm(total=len(pending_curve), disable=not progress, desc="mlm curve", unit="run")
        for seed in seeds:
            todo = [f for (f, s) in pending_curve if s == int(seed)]
            if not todo:
                continue
            if constants is None and any(f < 1.0 for f in todo):
                constants = average_attention(
                    encoder, batched(train_masked.inputs, batch_size),
                    progress=False, source=f"{corpus['source']} (masked MLM training sequences)",
                )
            lambdas = None
            if any(0.0 < f < 1.0 for f in todo):
                lambda_key = config_hash({**base_config, "seed": int(seed), "what": "lambdas"})
                path = lambda_path(results_path, lambda_key) if results_path is not None else None
                lambdas = read_or_heal(path, read_lambdas)  # None: absent, or damaged and set aside
                if lambdas is None:
                    started = time.time()
                    lambdas = learn_mlm_lambdas(model, train_masked, constants, seed=int(seed), epochs=epochs,
                                                batch_size=batch_size, lr=lr, device=device, progress=False)
                    if path is not None:
                        write_lambdas(path, lambdas, {"model": name, "seed": int(seed), "corpus": corpus["corpus"],
                                                      "seconds": round(time.time() - started, 1)})
            for fraction in todo:
                started = time.time()
                heads = heads_to_replace("lambda", fraction, encoder,
                                         lambdas=lambdas if lambdas is not None else torch.zeros(num_layers, num_heads))
                train_features, eval_features = features_for(heads)
                set_seed(int(seed))
                probe = make_mlm_probe(model, num_layers + 1)
                losses = train_mlm_probe(probe, train_features, seed=int(seed), epochs=epochs, batch_size=batch_size,
                                         lr=lr, device=device)
                scores = evaluate_mlm_probe(probe, eval_features, device)
                run_id = curve_ids[(float(fraction), int(seed))]
                records[run_id] = {
                    **common, "run_id": run_id, "matrix_type": "average", "matrices_from": "mlm_train",
                    "selection_order": "lambda", "fraction": float(fraction), "seed": int(seed),
                    "value": scores["value"], "ci_low": scores["ci_low"], "ci_high": scores["ci_high"],
                    "masked_accuracy": scores["masked_accuracy"], "num_replaced_heads": len(heads),
                    "final_train_loss": losses[-1] if losses else float("nan"),
                    "config_hash": run_id, "wall_time_s": time.time() - started,
                }
                if store is not None:
                    store.append(records[run_id])
                bar.update(1)
        bar.close()

    order = [*curve_ids.values()] + ([head_id] if head_id in records else [])
    return pd.DataFrame([records[run_id] for run_id in order if run_id in records])
