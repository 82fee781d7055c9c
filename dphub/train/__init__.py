"""DP-SGD training of PHI taggers: one package, one concern per module, no import cycles.

The pipeline is ``notes -> windows (data) -> units (dphub.privacy.units) -> Opacus DP-SGD (loop)
-> model directory + card (output)``:

============== ================================================================================
module         concern
============== ================================================================================
options        :class:`TrainOptions` (every knob, defaults, validation)
data           labelled notes -> windows with tag ids -> batches; the per-window loss
plan           the privacy plan (q, steps, σ, δ) fixed before the first step
sources        initial weights: public base + synthetic warm start, or a pulled DP model
lineage        the privacy ledger: a parent's disjointness checked, the composed claim, the record
warmstart      the public warm start (synthetic notes, no private data, no ε), built once, cached
pretrain       ``dphub pretrain``: the same public training written as a shareable public base
encoder_cache  head-only runs look the frozen encoder's outputs up instead of recomputing them
loop           the step loop (DP or not), its randomness and its resumable state
checkpoints    checkpoints (no pickle), the run fingerprint, the private run log
output         the published model directory and the checks that keep outputs off inputs
run            :func:`train`: one run from notes to a model directory
============== ================================================================================

Imports only point down this table's dependency order (``run`` uses everything, ``options``
nothing), so public pretraining, DP fine-tuning and an owner's local training can share the loop
and the data path. The library never prints: progress goes to an optional callback.
"""

from __future__ import annotations

from dphub.train.checkpoints import (
    LEGACY_CHECKPOINT_FILE,
    checkpoint_dir_for,
    load_checkpoint,
    run_log_path,
    save_checkpoint,
    write_run_log,
)
from dphub.train.data import (
    Example,
    batch_from_examples,
    check_patient_ids,
    encode_notes,
    load_training_notes,
    recall_weights,
)
from dphub.train.encoder_cache import FrozenEncoderCache
from dphub.train.options import (
    ACCOUNTANTS,
    DEFAULT_TARGET_EPSILON,
    HEADS,
    PRIVACY_UNITS,
    WARM_STARTS,
    TrainOptions,
    default_delta,
)
from dphub.train.output import (
    TRAINING_CONFIG_FILE,
    build_meta,
    check_output_dir,
    is_model_directory,
    training_config,
)
from dphub.train.plan import PrivacyPlan, plan_privacy
from dphub.train.results import Progress, ProgressFn, TrainResult
from dphub.train.run import train

__all__ = [
    "ACCOUNTANTS", "DEFAULT_TARGET_EPSILON", "HEADS", "LEGACY_CHECKPOINT_FILE", "PRIVACY_UNITS",
    "TRAINING_CONFIG_FILE", "WARM_STARTS", "Example",
    "FrozenEncoderCache", "PrivacyPlan", "Progress", "ProgressFn", "TrainOptions", "TrainResult",
    "batch_from_examples", "build_meta", "check_output_dir", "check_patient_ids",
    "checkpoint_dir_for", "default_delta", "encode_notes", "is_model_directory",
    "load_checkpoint", "load_training_notes", "plan_privacy", "recall_weights", "run_log_path",
    "save_checkpoint", "train", "training_config", "write_run_log",
]
