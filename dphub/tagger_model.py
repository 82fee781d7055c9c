"""The PHI tagger's network: :class:`TaggerModel`, a transformers encoder, a linear emission layer
and a CRF (or softmax) head, with its losses, CRF marginals and its model directory (save/load).

Its contract with ``dphub.train`` is ``from_base``, ``emissions``, ``per_sample_loss`` (one loss
per window, so Opacus can compute per-sample gradients), ``marginals``, ``decode``,
``set_trainable``, ``save``/``load``. The CRF is pytorch-crf's ``torchcrf.CRF``; its per-sample
gradients come from the grad sampler in :mod:`dphub.privacy.grad_samplers`, registered by
:func:`register_grad_sampler` (when a model is built in a process that has loaded Opacus, and by
the training loop before it wraps the model); inference never loads Opacus (issue 55: it was a
third of the start-up of ``dphub deid``). Inference over notes is :mod:`dphub.tagger`. Over 600 lines because it is one concern: the
module and its on-disk form, which must change together.

The model directory is what ``transformers`` expects for ``BertForTokenClassification``
(``model.safetensors`` with ``bert.*`` + ``classifier.*``; the CRF's ``crf.*`` tensors ride along
in the same file and are ignored by plain transformers), so a published model also runs in a
stock ``pipeline("token-classification")`` (without the CRF). Weights are safetensors only and
loading never executes code from the directory.

Rule features (optional, :mod:`dphub.rule_features`): a model built with ``rule_features`` adds
``rule_proj(features)`` to the emissions, where the features are the zero-ε rule member's flags
per word piece. ``rule_proj.*`` tensors ride along like ``crf.*``; ``config.json`` records the
feature layout and a digest of the rules (``dphub.rule_features``), and such a model writes
``format_version`` 2 so that an older dphub refuses it instead of running it without features.
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torchcrf import CRF

from dphub.encoders import quiet_transformers as _quiet_transformers
from dphub.encoders import resolve_base_model
from dphub.errors import ConfigError, ModelError
from dphub.io import atomic_write_bytes, atomic_write_text
from dphub.labels import get_schema
from dphub.rule_features import NUM_FEATURES, check_spec, feature_spec
from dphub.runtime import (
    bound_kernel_cache,
)

bound_kernel_cache()  # before any model here runs: oneDNN reads its cache size once

HEADS: tuple[str, ...] = ("crf", "softmax")
FORMAT_VERSION = 2
#: Format version written by models without rule features (readable by any dphub).
BASIC_FORMAT_VERSION = 1
DEFAULT_MAX_LENGTH = 128
DEFAULT_STRIDE = 32
IGNORE_INDEX = -100
#: Files copied byte-for-byte from the public base model (never rebuilt from data).
TOKENIZER_FILES: tuple[str, ...] = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
)
#: Files that must never be in a model directory (pickles can execute code when loaded).
PICKLE_SUFFIXES: tuple[str, ...] = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
ENCODER_INPUTS: tuple[str, ...] = ("input_ids", "attention_mask", "token_type_ids", "position_ids")


def nonfinite_tensors(module: nn.Module) -> list[str]:
    """Names of ``module``'s floating-point parameters and buffers holding inf or NaN."""
    return [name for name, t in module.state_dict().items()
            if t.is_floating_point() and not bool(torch.isfinite(t).all())]


def check_finite(module: nn.Module, where: str) -> None:
    """Refuse weights holding inf or NaN (:class:`ModelError`, naming up to three tensors).

    Why: a diverged run (``--lr 1e308``) leaves ±inf in the head and CRF; such a model tags
    nothing, yet loaded silently and "de-identified" notes by removing nothing. The names are
    the model's own parameter names (checked against its config before this runs).
    """
    bad = nonfinite_tensors(module)
    if bad:
        shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise ModelError(
            f"{where}: {len(bad)} tensor(s) hold non-finite values (inf or NaN): {shown}; the "
            "weights are broken (a diverged training run?) and cannot be used"
        )


def _load_encoder(loadable: str | Path) -> nn.Module:
    """A base encoder without pooler (unused by tagging; its parameters would get no gradient,
    which Opacus reports as a missing per-sample gradient)."""
    from transformers import AutoModel

    if isinstance(loadable, str) and loadable.startswith(("/", "./", "../", "~", "\\")):
        # clearly meant as a directory: say so instead of trying it as a hub id (slow retries)
        raise ModelError(f"base model directory {loadable} does not exist")
    try:
        with _quiet_transformers():
            try:
                enc = AutoModel.from_pretrained(
                    loadable, add_pooling_layer=False, trust_remote_code=False,
                    use_safetensors=True,
                )
            except TypeError:
                enc = AutoModel.from_pretrained(
                    loadable, trust_remote_code=False, use_safetensors=True
                )
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot load base model {loadable}: {type(e).__name__}") from None
    if getattr(enc, "pooler", None) is not None:
        enc.pooler = None
    check_finite(enc, f"base model {loadable}")
    return enc


def _token_mask(batch: dict[str, Tensor]) -> Tensor:
    """Positions of real word pieces: ``batch["token_mask"]`` when given, else attended positions
    minus each row's first and last attended one ([CLS] ... [SEP], as ``dphub.align`` builds
    windows)."""
    if "token_mask" in batch:
        return batch["token_mask"].bool()
    att = batch["attention_mask"].bool()
    if att.shape[1] == 0:
        return att
    pos = torch.arange(att.shape[1], device=att.device).expand_as(att)
    first = torch.where(att, pos, att.shape[1]).min(dim=1, keepdim=True).values
    last = torch.where(att, pos, -1).max(dim=1, keepdim=True).values
    return att & (pos > first) & (pos < last)


def _compact(valid: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Left-align each row's valid positions (the CRF wants a prefix mask starting at 0).

    Returns ``(index [B, L'], mask [B, L'], counts [B])`` where ``index`` gathers the valid
    positions in order and ``L' = max(1, max count)``; rows without valid positions get one masked
    dummy position (their loss is zeroed by the caller).
    """
    batch, length = valid.shape
    counts = valid.sum(dim=1)
    width = max(1, int(counts.max()) if batch else 1)
    pos = torch.arange(length, device=valid.device).expand(batch, length)
    # valid positions first (stable by position), invalid ones after
    key = torch.where(valid, pos, pos + length)
    order = key.argsort(dim=1)
    if length < width:  # only when length == 0
        order = torch.zeros((batch, width), dtype=torch.long, device=valid.device)
    index = order[:, :width]
    mask = torch.arange(width, device=valid.device).expand(batch, width) < counts.unsqueeze(1)
    mask = mask.clone()
    mask[:, 0] = True  # pytorch-crf requires the first step on; empty rows are zeroed later
    return index, mask, counts


def soft_targets(tags: Tensor, confidence: Tensor, num_tags: int, o_index: int = 0) -> Tensor:
    """Per-position tag distributions ``[B, L, T]`` of soft labels: ``confidence`` on the hard tag,
    the rest on ``O`` (a position tagged ``O`` stays certain ``O``)."""
    hard = nn.functional.one_hot(tags, num_tags).to(confidence.dtype)
    other = nn.functional.one_hot(torch.full_like(tags, o_index), num_tags).to(confidence.dtype)
    c = confidence.unsqueeze(-1)
    return c * hard + (1 - c) * other


def soft_crf_nll(crf: CRF, emissions: Tensor, targets: Tensor, mask: Tensor) -> Tensor:
    """``[B]`` cross-entropy of a linear-chain CRF against per-position tag distributions.

    ``-E_q[log p(y | x)] = log Z - E_q[score(y)]`` with ``q`` the product of ``targets``' rows
    (``[B, L, T]``, each row sums to 1; ``mask`` a prefix mask starting at 0, as pytorch-crf
    wants it): the expected score is linear in ``q``'s unary and pairwise terms, and ``log Z`` is
    pytorch-crf's forward algorithm. With one-hot targets this is exactly the CRF's negative
    log-likelihood (tested), so soft labels generalise the hard-label loss and nothing else.
    Why our own: pytorch-crf takes hard tags only; its normaliser is reused, not rewritten.
    """
    m = mask.to(emissions.dtype)
    log_z = crf._compute_normalizer(emissions.transpose(0, 1), mask.transpose(0, 1))
    unary = ((targets * emissions).sum(-1) * m).sum(1)
    start = (targets[:, 0] * crf.start_transitions).sum(-1)
    pair = torch.einsum("nla,ab,nlb->nl", targets[:, :-1], crf.transitions, targets[:, 1:])
    pair = (pair * m[:, 1:]).sum(1)
    last = mask.long().sum(1).clamp(min=1) - 1
    q_last = targets.gather(1, last.view(-1, 1, 1).expand(-1, 1, targets.shape[-1])).squeeze(1)
    end = (q_last * crf.end_transitions).sum(-1)
    return log_z - (unary + start + pair + end)


def register_grad_sampler() -> None:
    """Register the CRF's per-sample gradient with Opacus (:mod:`dphub.privacy.grad_samplers`).

    Why not at import: Opacus (and the SciPy, sympy and ``torch.distributed`` it loads) took
    about a third of the start-up of ``dphub deid``, which never trains. Opacus decides at
    ``make_private`` time how each layer's per-sample gradient is computed, so registering
    before the model is wrapped is enough; :class:`TaggerModel` does it when built in a process
    that has Opacus loaded, and the training loop does it before ``make_private``. Idempotent.
    """
    import dphub.privacy.grad_samplers  # noqa: F401  (registers on import)


class TaggerModel(nn.Module):
    """Encoder → dropout → Linear emissions over BIOES tags → CRF (or softmax).

    ``forward(batch, tags, weights=None)`` is :meth:`per_sample_loss`, so the model can be called
    through Opacus's ``GradSampleModule`` wrapper as well as directly.
    """

    def __init__(
        self,
        encoder: nn.Module,
        tags: Sequence[str],
        head: str = "crf",
        *,
        schema: str = "hipaa",
        dropout: float | None = None,
        max_length: int = DEFAULT_MAX_LENGTH,
        stride: int = DEFAULT_STRIDE,
        base_public_id: str | None = None,
        tokenizer_source: Path | None = None,
        rule_features: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if "opacus" in sys.modules:  # a process that trains: the CRF's sampler before any wrap
            register_grad_sampler()
        if head not in HEADS:
            raise ConfigError(f"unknown head {head!r}; choose one of {', '.join(HEADS)}")
        self.encoder = encoder
        self.tags = list(tags)
        self.head = head
        self.schema = schema
        self.max_length = max_length
        self.stride = stride
        self.base_public_id = base_public_id
        self.tokenizer_source = Path(tokenizer_source) if tokenizer_source else None
        self.train_layers: int | None = None
        self.lora_rank: int | None = None
        hidden = int(self._encoder_config().hidden_size)
        p = dropout if dropout is not None else getattr(self._encoder_config(),
                                                        "hidden_dropout_prob", 0.1)
        self.dropout = nn.Dropout(float(p))
        self.classifier = nn.Linear(hidden, len(self.tags))
        self.crf: CRF | None = CRF(len(self.tags), batch_first=True) if head == "crf" else None
        #: the ``dphub.rule_features`` config block (None: the model takes no rule features)
        self.rule_features: dict[str, Any] | None = None
        self.rule_proj: nn.Linear | None = None
        if rule_features is not None:
            self.add_rule_features(rule_features)

    # ------------------------------------------------------------------ construction

    def _encoder_config(self) -> Any:
        return self._base_encoder().config

    def _base_encoder(self) -> nn.Module:
        """The transformers model under any peft wrapper."""
        enc = self.encoder
        if hasattr(enc, "get_base_model"):
            enc = enc.get_base_model()
        return enc

    @classmethod
    def from_base(
        cls, base: str | Path | None, schema: str = "hipaa", head: str = "crf",
        rule_features: bool = False, encoder_layers: int | None = None,
    ) -> TaggerModel:
        """A fresh tagger on a public base encoder (``None``: the embedded MiniLM), train mode;
        ``rule_features`` adds the rule-feature input (:mod:`dphub.rule_features`);
        ``encoder_layers`` keeps only the base's first N transformer layers
        (:func:`truncate_encoder`)."""
        loadable, public_id = resolve_base_model(None if base is None else str(base))
        encoder = _load_encoder(loadable)
        if encoder_layers is not None:
            truncate_encoder(encoder, encoder_layers)
        tags = get_schema(schema).bioes_tags()
        tok_src = Path(loadable) if isinstance(loadable, Path) or Path(loadable).is_dir() else None
        spec = None
        if rule_features:
            spec = feature_spec()
        model = cls(encoder, tags, head, schema=schema, base_public_id=public_id,
                    tokenizer_source=tok_src, rule_features=spec)
        model.train()
        return model

    def add_rule_features(self, spec: dict[str, Any] | None = None) -> None:
        """Give the model the rule-feature input (``spec``: this dphub's rules by default).

        ``rule_proj`` starts at zero, so the model's predictions are unchanged until training
        (public warm start, then DP) learns how much each rule flag is worth per tag.
        """
        if self.rule_proj is not None:
            raise ConfigError("this model already takes rule features")
        self.rule_features = copy.deepcopy(spec) if spec is not None else feature_spec()
        self.rule_proj = nn.Linear(NUM_FEATURES, len(self.tags))
        nn.init.zeros_(self.rule_proj.weight)
        nn.init.zeros_(self.rule_proj.bias)
        self.rule_proj.to(self.classifier.weight.device)

    # ------------------------------------------------------------------ forward passes

    def emissions(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        rule_features: Tensor | None = None,
    ) -> Tensor:
        """Per-position tag scores ``[B, L, T]``.

        ``token_type_ids``/``position_ids`` default to batch-shaped, contiguous tensors: BERT's own
        defaults are ``[1, L]`` buffers, which break per-sample gradients of the embeddings.
        ``rule_features`` ``[B, L, F]`` is required exactly when the model takes rule features.
        """
        batch, length = input_ids.shape
        if batch == 0:
            # an empty Poisson batch: BERT cannot reshape zero rows; the shapes still make sense
            hidden = self.classifier.in_features
            zeros = torch.zeros((0, length, hidden), dtype=self.classifier.weight.dtype,
                                device=self.classifier.weight.device)
            if self.rule_proj is not None and rule_features is None:
                rule_features = zeros.new_zeros((0, length, self.rule_proj.in_features))
            return self.head_emissions(zeros, rule_features)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if position_ids is None:
            position_ids = torch.arange(length, device=input_ids.device).expand(batch, length)
        out = self.encoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids.contiguous(),
            position_ids=position_ids.contiguous(),
        )
        hidden = out[0] if isinstance(out, tuple) else out.last_hidden_state
        return self.head_emissions(hidden, rule_features)

    def head_emissions(self, hidden: Tensor, rule_features: Tensor | None = None) -> Tensor:
        """Tag scores from the encoder's last hidden states (the part that differs between
        members trained on one shared encoder), plus the rule features' projection when the
        model takes them (they belong to the head: the encoder never sees them)."""
        em = self.classifier(self.dropout(hidden))
        if self.rule_proj is None:
            return em
        if rule_features is None:
            raise ModelError("internal: this model takes rule features and none were given")
        return em + self.rule_proj(rule_features.to(em.dtype))

    def encode(self, batch: dict[str, Tensor]) -> Tensor:
        """The encoder's last hidden states ``[B, L, H]`` of a collated batch (inference)."""
        length = batch["input_ids"].shape[1]
        n = batch["input_ids"].shape[0]
        position_ids = batch.get("position_ids")
        if position_ids is None:
            position_ids = torch.arange(length, device=batch["input_ids"].device).expand(n, length)
        token_type_ids = batch.get("token_type_ids")
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(batch["input_ids"])
        out = self.encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                           token_type_ids=token_type_ids.contiguous(),
                           position_ids=position_ids.contiguous())
        return out[0] if isinstance(out, tuple) else out.last_hidden_state

    def _batch_emissions(self, batch: dict[str, Tensor]) -> Tensor:
        return self.emissions(*(batch.get(k) for k in ENCODER_INPUTS),
                              rule_features=batch.get("rule_features"))

    def per_sample_loss(
        self, batch: dict[str, Tensor], tags: Tensor, weights: Tensor | None = None,
        confidence: Tensor | None = None,
    ) -> Tensor:
        """One loss per window ``[B]``: CRF negative log-likelihood or summed token cross-entropy.

        ``tags`` is ``[B, L]`` with ``-100`` at special/padding positions (the CRF runs over the
        remaining positions, left-aligned). ``weights`` ``[B]`` multiply each window's loss (recall
        weighting; they must be constants computed from that window alone). A window without
        labelled positions contributes 0. ``confidence`` ``[B, L]`` makes the labels *soft*
        (:func:`soft_targets`, :func:`soft_crf_nll`): local, non-private training only, because
        the CRF's per-sample gradient rule (:mod:`dphub.privacy`) covers the hard-label
        likelihood.
        """
        em = self._batch_emissions(batch)
        valid = tags != IGNORE_INDEX
        o_index = self.tags.index("O") if confidence is not None else 0
        if self.crf is None:
            if confidence is None:
                ce = nn.functional.cross_entropy(
                    em.reshape(-1, em.shape[-1]), tags.reshape(-1).clamp(min=0), reduction="none"
                ).view(tags.shape)
            else:
                q = soft_targets(tags.clamp(min=0), confidence.to(em.dtype), em.shape[-1], o_index)
                ce = -(q * em.log_softmax(-1)).sum(-1)
            loss = (ce * valid.to(ce.dtype)).sum(dim=1)
        else:
            index, mask, counts = _compact(valid)
            em_c = em.gather(1, index.unsqueeze(-1).expand(-1, -1, em.shape[-1]))
            tags_c = tags.gather(1, index).clamp(min=0)
            tags_c = torch.where(mask, tags_c, torch.zeros_like(tags_c))
            if confidence is None:
                # positional (emissions, tags, mask): what Opacus saves for the grad sampler
                nll = -self.crf(em_c, tags_c, mask, reduction="none")
            else:
                conf_c = torch.where(mask, confidence.gather(1, index).to(em.dtype),
                                     torch.ones_like(em_c[..., 0]))
                nll = soft_crf_nll(self.crf, em_c, soft_targets(tags_c, conf_c, em.shape[-1],
                                                                o_index), mask)
            loss = nll * (counts > 0).to(nll.dtype)
        if weights is not None:
            loss = loss * weights.to(loss.dtype)
        return loss

    def forward(
        self, batch: dict[str, Tensor], tags: Tensor, weights: Tensor | None = None
    ) -> Tensor:
        return self.per_sample_loss(batch, tags, weights)

    def _marginals_from_emissions(self, em: Tensor, valid: Tensor) -> Tensor:
        """``[B, L, T]`` tag probabilities at ``valid`` positions, zeros elsewhere."""
        out = torch.zeros_like(em)
        if self.crf is None:
            return torch.where(valid.unsqueeze(-1), em.softmax(-1), out)
        index, mask, counts = _compact(valid)
        e = em.gather(1, index.unsqueeze(-1).expand(-1, -1, em.shape[-1]))
        probs = crf_marginals(e, mask, self.crf.start_transitions, self.crf.end_transitions,
                              self.crf.transitions)
        keep = mask & (counts > 0).unsqueeze(1)
        probs = probs * keep.unsqueeze(-1).to(probs.dtype)
        # scatter back; padded slots of `index` point at invalid positions and carry zeros
        return out.scatter_add(1, index.unsqueeze(-1).expand_as(probs), probs)

    def marginals(self, batch: dict[str, Tensor]) -> Tensor:
        """Per-position tag probabilities ``[B, L, T]`` (CRF: forward-backward; softmax: softmax).

        Real word pieces are found by :func:`_token_mask`; other positions are all-zero rows.
        """
        return self._marginals_from_emissions(self._batch_emissions(batch), _token_mask(batch))

    def _decode_from_emissions(self, em: Tensor, valid: Tensor) -> list[list[int]]:
        if self.crf is None:
            best = em.argmax(-1)
            return [best[b][valid[b]].tolist() for b in range(em.shape[0])]
        index, mask, counts = _compact(valid)
        e = em.gather(1, index.unsqueeze(-1).expand(-1, -1, em.shape[-1]))
        paths = self.crf.decode(e, mask)
        return [p[: int(c)] for p, c in zip(paths, counts.tolist(), strict=True)]

    def decode(self, batch: dict[str, Tensor]) -> list[list[int]]:
        """Best tag ids per window (Viterbi for CRF, argmax for softmax), one per real word piece
        in order (special and padding positions left out)."""
        return self._decode_from_emissions(self._batch_emissions(batch), _token_mask(batch))

    # ------------------------------------------------------------------ what trains

    def set_trainable(self, train_layers: int | None = 2, lora_rank: int | None = None) -> None:
        """Choose the parameters DP-SGD updates (fewer parameters, less noise in total).

        Embeddings (word, position, token type and their LayerNorm) and all but the top
        ``train_layers`` encoder layers are frozen; ``None`` trains the whole encoder,
        ``0`` only the head. Classifier and CRF always train. With ``lora_rank`` the trainable
        layers get peft LoRA adapters on ``query``/``value`` and only the adapters (plus head and
        CRF) train; adapters are merged into the weights by :meth:`save`.
        """
        if self.lora_rank is not None:
            raise ConfigError("set_trainable was already called with LoRA on this model")
        base = self._base_encoder()
        layers = _encoder_layers(base)
        n_layers = len(layers)
        if train_layers is not None and not 0 <= train_layers <= n_layers:
            raise ConfigError(f"train_layers must be between 0 and {n_layers}, got {train_layers}")
        if lora_rank is not None and lora_rank < 1:
            raise ConfigError(f"lora rank must be >= 1, got {lora_rank}")
        top = list(range(n_layers)) if train_layers is None else list(
            range(n_layers - train_layers, n_layers))
        for p in base.parameters():
            p.requires_grad_(train_layers is None and lora_rank is None)
        if lora_rank is None:
            for i in top:
                for p in layers[i].parameters():
                    p.requires_grad_(True)
        elif top:
            from peft import LoraConfig, get_peft_model

            cfg = LoraConfig(
                r=lora_rank,
                lora_alpha=2 * lora_rank,
                lora_dropout=0.0,
                target_modules=["query", "value"],
                layers_to_transform=top,
                bias="none",
            )
            self.encoder = get_peft_model(self.encoder, cfg)
        for p in self.classifier.parameters():
            p.requires_grad_(True)
        if self.crf is not None:
            for p in self.crf.parameters():
                p.requires_grad_(True)
        if self.rule_proj is not None:
            for p in self.rule_proj.parameters():
                p.requires_grad_(True)
        self.train_layers = train_layers
        self.lora_rank = lora_rank

    # ------------------------------------------------------------------ persistence

    def _merged_encoder(self) -> nn.Module:
        """The encoder with LoRA adapters merged (a copy; the training model is untouched)."""
        if hasattr(self.encoder, "merge_and_unload"):
            return copy.deepcopy(self.encoder).merge_and_unload()
        return self.encoder

    def export_state_dict(self) -> dict[str, Tensor]:
        """Tensors as stored in ``model.safetensors``: ``<prefix>.*``, ``classifier.*``,
        ``crf.*``, with LoRA merged."""
        enc = self._merged_encoder()
        prefix = getattr(enc, "base_model_prefix", "bert") or "bert"
        out: dict[str, Tensor] = {}
        for k, v in enc.state_dict().items():
            out[f"{prefix}.{k}"] = v
        for k, v in self.classifier.state_dict().items():
            out[f"classifier.{k}"] = v
        if self.crf is not None:
            for k, v in self.crf.state_dict().items():
                out[f"crf.{k}"] = v
        if self.rule_proj is not None:
            for k, v in self.rule_proj.state_dict().items():
                out[f"rule_proj.{k}"] = v
        return {k: v.detach().to("cpu").contiguous().clone() for k, v in out.items()}

    def config_dict(self, base_public_id: str | None = None) -> dict[str, Any]:
        """The ``config.json`` content: the encoder config as a token-classification model plus
        the ``dphub`` block."""
        from transformers.models.auto.modeling_auto import (
            MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES,
        )

        cfg = copy.deepcopy(self._encoder_config())
        model_type = cfg.model_type
        arch = MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES.get(model_type)
        if arch is None:
            raise ModelError(f"encoder type {model_type!r} has no token-classification class")
        cfg.architectures = [arch]
        cfg.id2label = dict(enumerate(self.tags))
        cfg.label2id = {t: i for i, t in enumerate(self.tags)}
        d = cfg.to_dict()
        d.pop("_name_or_path", None)  # may be a local path; the public id is in the dphub block
        d["dphub"] = {
            "head": self.head,
            "label_schema": self.schema,
            "max_length": self.max_length,
            "stride": self.stride,
            "format_version": BASIC_FORMAT_VERSION if self.rule_features is None
            else FORMAT_VERSION,
            "base_model": base_public_id or self.base_public_id,
        }
        if self.rule_features is not None:
            d["dphub"]["rule_features"] = copy.deepcopy(self.rule_features)
        return d

    def save(
        self,
        model_dir: Path,
        base_public_id: str | None = None,
        tokenizer_source: Path | None = None,
    ) -> None:
        """Write ``model.safetensors``, ``config.json`` and the base tokenizer files.

        Each file is written atomically; build the whole directory inside
        ``dphub.io.atomic_directory`` to make the directory itself appear atomically.
        ``base_public_id``/``tokenizer_source`` default to what :meth:`from_base` recorded.
        """
        from safetensors.torch import save

        model_dir = Path(model_dir)
        model_dir.mkdir(parents=True, exist_ok=True)
        src = Path(tokenizer_source) if tokenizer_source else self.tokenizer_source
        if src is None or not (src / "tokenizer.json").is_file():
            raise ModelError(
                f"tokenizer source {src} has no tokenizer.json (pass the public base model dir)"
            )
        public = base_public_id or self.base_public_id
        atomic_write_bytes(model_dir / "model.safetensors",
                           save(self.export_state_dict(), metadata={"format": "pt"}))
        atomic_write_text(model_dir / "config.json",
                          json.dumps(self.config_dict(public), indent=2, sort_keys=True) + "\n")
        for name in TOKENIZER_FILES:
            if (src / name).is_file() and (src.resolve() != model_dir.resolve()):
                atomic_write_bytes(model_dir / name, (src / name).read_bytes())

    @classmethod
    def load(cls, model_dir: Path) -> TaggerModel:
        """Load a model directory written by :meth:`save` (safetensors only, no remote code).

        The model is returned in train mode, like :meth:`from_base`; call ``.eval()`` for
        inference.
        """
        from safetensors import SafetensorError
        from safetensors.torch import load_file
        from transformers import AutoConfig, AutoModel

        model_dir = Path(model_dir)
        weights = model_dir / "model.safetensors"
        if not (model_dir / "config.json").is_file() or not weights.is_file():
            raise ModelError(f"{model_dir}: not a dphub model (needs config.json and "
                             "model.safetensors)")
        pickles = sorted(p.name for p in model_dir.iterdir() if p.suffix in PICKLE_SUFFIXES)
        if pickles:
            raise ModelError(f"{model_dir}: refusing a model directory with pickle files "
                             f"({', '.join(pickles)})")
        try:
            raw = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise ModelError(f"{model_dir}/config.json is not valid JSON") from None
        block = raw.get("dphub")
        if not isinstance(block, dict) or block.get("head") not in HEADS:
            raise ModelError(f"{model_dir}/config.json has no valid 'dphub' block")
        if int(block.get("format_version", 0)) > FORMAT_VERSION:
            raise ModelError(f"{model_dir}: model format {block.get('format_version')} is newer "
                             "than this dphub understands")
        id2label = raw.get("id2label") or {}
        tags = [id2label[k] for k in sorted(id2label, key=int)]
        spec = block.get("rule_features")
        if spec is not None:
            check_spec(spec, str(model_dir))
        config = AutoConfig.from_pretrained(model_dir, trust_remote_code=False)
        with _quiet_transformers():
            try:
                encoder = AutoModel.from_config(config, add_pooling_layer=False)
            except TypeError:
                encoder = AutoModel.from_config(config)
        if getattr(encoder, "pooler", None) is not None:
            encoder.pooler = None
        model = cls(encoder, tags, block["head"], schema=block.get("label_schema", "hipaa"),
                    max_length=int(block.get("max_length", DEFAULT_MAX_LENGTH)),
                    stride=int(block.get("stride", DEFAULT_STRIDE)),
                    base_public_id=block.get("base_model"), tokenizer_source=model_dir,
                    rule_features=spec)
        try:
            state = load_file(str(weights))
        except (SafetensorError, OSError):
            raise ModelError(f"{weights}: not a readable safetensors file") from None
        prefix = getattr(encoder, "base_model_prefix", "bert") or "bert"
        mapped: dict[str, Tensor] = {}
        for k, v in state.items():
            if k.startswith(prefix + "."):
                mapped["encoder." + k[len(prefix) + 1:]] = v
            elif k.startswith(("classifier.", "crf.", "rule_proj.")):
                mapped[k] = v
        missing, unexpected = model.load_state_dict(mapped, strict=False)
        missing = [k for k in missing if not k.endswith(("position_ids", "token_type_ids"))]
        if missing or unexpected:
            raise ModelError(
                f"{weights}: weights do not match the config "
                f"({len(missing)} missing, {len(unexpected)} unexpected tensors)"
            )
        check_finite(model, str(weights))
        model.train()
        return model


def _encoder_layers(encoder: nn.Module) -> nn.ModuleList:
    """The stack of transformer blocks (``encoder.layer`` for BERT-like models)."""
    for path in ("encoder.layer", "transformer.layer", "layers", "layer"):
        obj: Any = encoder
        for part in path.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if isinstance(obj, nn.ModuleList):
            return obj
    raise ModelError(f"cannot find the layer stack of {type(encoder).__name__}")


def truncate_encoder(encoder: nn.Module, layers: int) -> None:
    """Keep the first ``layers`` transformer blocks of ``encoder`` (and say so in its config).

    Why: the encoder is nearly all of inference time, and its cost is proportional to the
    number of blocks. Under the default recipe (warm start of all layers on public synthetic
    notes, then a DP head over the frozen encoder) the first 3 of MiniLM's 6 blocks gave the same
    inner-split F1 as all 6 and ~1.5 points less recall on held-out patients (docs/speed.md, "A
    shallower encoder"). The saved ``config.json`` records the new depth, so the model loads as
    the smaller encoder everywhere.
    """
    stack = _encoder_layers(encoder)
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= len(stack):
        raise ConfigError(f"--encoder-layers must be between 1 and the base model's {len(stack)} "
                          f"layers (got {layers!r})")
    del stack[layers:]  # in place: the encoder's own ModuleList loses its upper blocks
    config = getattr(encoder, "config", None)
    if config is not None and hasattr(config, "num_hidden_layers"):
        config.num_hidden_layers = layers


def crf_marginals(
    emissions: Tensor, mask: Tensor, start: Tensor, end: Tensor, transitions: Tensor
) -> Tensor:
    """Posterior tag marginals ``P(y_t = j | x)`` ``[B, L, T]`` by scaled forward-backward.

    ``mask`` is a prefix mask starting at position 0 (pytorch-crf convention); positions past a
    row's length get meaningless values, which callers zero out.

    Why scaled, not log-space: each time step is then one ``[B, T] @ [T, T]`` matmul plus a
    renormalisation instead of a ``[B, T, T]`` logsumexp, about 4x faster on CPU at equal
    accuracy in float64 (the per-step normalisation keeps values in range; the constant factors
    cancel in the final normalisation). Exponentials are taken of max-shifted scores, so nothing
    overflows; a tag whose transition weight underflows to 0 simply gets probability 0.
    """
    batch, length, num_tags = emissions.shape
    tiny = torch.finfo(emissions.dtype).tiny
    start, end, transitions = (x.to(emissions.dtype) for x in (start, end, transitions))
    pe = torch.exp(emissions - emissions.amax(-1, keepdim=True))  # [B, L, T] in (0, 1]
    trans = torch.exp(transitions - transitions.max())
    trans_t = trans.t().contiguous()
    alpha = torch.empty_like(pe)
    a = torch.exp(start - start.max()) * pe[:, 0]
    a = a / a.sum(-1, keepdim=True).clamp_min(tiny)
    alpha[:, 0] = a
    for t in range(1, length):
        nxt = (a @ trans) * pe[:, t]
        nxt = nxt / nxt.sum(-1, keepdim=True).clamp_min(tiny)
        a = torch.where(mask[:, t : t + 1], nxt, a)
        alpha[:, t] = a
    pend = torch.exp(end - end.max())
    end_b = (pend / pend.sum().clamp_min(tiny)).expand(batch, num_tags)
    beta = torch.empty_like(pe)
    b = end_b
    beta[:, length - 1] = b
    for t in range(length - 2, -1, -1):
        nxt = (pe[:, t + 1] * b) @ trans_t
        nxt = nxt / nxt.sum(-1, keepdim=True).clamp_min(tiny)
        b = torch.where(mask[:, t + 1 : t + 2], nxt, end_b)
        beta[:, t] = b
    post = alpha * beta
    return post / post.sum(-1, keepdim=True).clamp_min(tiny)
