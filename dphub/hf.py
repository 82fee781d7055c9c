"""A dphub model through transformers' ``pipeline`` API, with its CRF and rule features.

Why: a dphub model directory loads into transformers as a ``*ForTokenClassification`` model, but
that class has no place for two of its parts. transformers reports ``crf.*`` (the CRF's
transition scores) and ``rule_proj.*`` (the projection of the rule member's flags, the model's
second input) as unexpected weights and drops them, so the plain ``token-classification``
pipeline scores each word piece from the encoder's emissions alone: no transition constraints,
no rule features (the model was trained with them: its emissions alone are a different, weaker
tagger), and BIOES tags on word pieces (``S-NAME`` on ``"##ll"``) that its ``aggregation_strategy``
(written for ``B-``/``I-`` tags) does not join into entities.

Importing this module registers the pipeline task :data:`TASK` (``"dphub-phi"``) with
``transformers.pipelines.PIPELINE_REGISTRY``; its class runs dphub's own tagger
(:class:`dphub.tagger.Tagger`: windows over the whole note, rule features, CRF Viterbi decoding)
and returns entity spans in character offsets, widened to whole words::

    import dphub.hf  # registers "dphub-phi"
    from transformers import pipeline

    phi = pipeline("dphub-phi", model="path/to/model")
    # a model pulled with `dphub pull`: model=str(dphub.hf.model_dir("org/name[@revision]"))
    phi("Seen by Dr. Jonathan Smith on 03/14/2021.")
    # [{"entity_group": "DOCTOR", "start": 12, "end": 26, "word": "Jonathan Smith",
    #   "score": 0.98}, {"entity_group": "DATE", ...}]

No remote code runs: the pipeline class is this installed module, the model is loaded from
safetensors by dphub's loader (``trust_remote_code`` stays off), and a hub model is one that
``dphub pull`` verified (:func:`model_dir` finds it), never a download by transformers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dphub.encoders import quiet_transformers as _quiet_transformers
from dphub.errors import DphubError, ModelError
from dphub.notes import Note
from dphub.registry import resolve_model
from dphub.tagger import Tagger

#: The pipeline task name this module registers.
TASK = "dphub-phi"


def _word_char(c: str) -> bool:
    return c.isalnum()


def whole_words(text: str, start: int, end: int) -> tuple[int, int]:
    """``[start, end)`` widened to the word boundaries around it.

    The tagger labels word pieces; a span that begins or ends inside a word (``Jo`` of ``John``
    when only the first piece was flagged) is widened, so the caller never gets or hides half a
    word.
    """
    while start > 0 and _word_char(text[start - 1]) and _word_char(text[start]):
        start -= 1
    while end < len(text) and _word_char(text[end]) and _word_char(text[end - 1]):
        end += 1
    return start, end


def model_dir(spec: str | Path) -> Path:
    """The directory of a model: a directory, or a pulled ``org/name[@revision]`` (never a
    download: ``dphub pull`` verifies the weights and the card first)."""
    try:
        return Path(resolve_model(str(spec)))
    except DphubError as e:
        raise ModelError(f"{TASK}: {e.message} (pull a hub model with `dphub pull` first)") \
            from None


class DphubPipelineModel:
    """The ``pt_model`` of the task: loads the model with dphub's loader for the pipeline.

    ``pipeline(TASK, model=...)`` calls :meth:`from_pretrained`, which returns the transformers
    ``*ForTokenClassification`` model of the same weights (the pipeline machinery expects a
    ``PreTrainedModel``), sharing its encoder and classifier modules with the dphub tagger and
    carrying the CRF and ``rule_proj`` as submodules, so the pipeline's ``device`` moves all of
    them and no weight is left behind.
    """

    @classmethod
    def from_pretrained(cls, model: str | Path, *args: Any, **kwargs: Any) -> Any:
        from transformers import AutoConfig, AutoModelForTokenClassification

        path = model_dir(model)
        tagger = Tagger.load(path)
        with _quiet_transformers():
            config = AutoConfig.from_pretrained(path, trust_remote_code=False)
            hf = AutoModelForTokenClassification.from_config(config)
        tm = tagger.model
        prefix = getattr(hf, "base_model_prefix", "bert") or "bert"
        encoder = tm._base_encoder()
        if getattr(hf, prefix, None) is None or not hasattr(hf, "classifier"):
            raise ModelError(f"{TASK}: the model's architecture has no {prefix}/classifier layout")
        setattr(hf, prefix, encoder)
        hf.classifier = tm.classifier
        hf.dphub_crf = tm.crf
        hf.dphub_rule_proj = tm.rule_proj
        hf.dphub_tagger = tagger
        hf.eval()
        return hf


def _pipeline_class() -> type:
    from transformers import Pipeline

    class DphubPhiPipeline(Pipeline):
        """transformers pipeline over a dphub tagger: whole-word PHI entity spans.

        Call with a string (or a list of strings); each result is a list of
        ``{"entity_group", "start", "end", "word", "score"}`` in character offsets. Options:
        ``threshold`` (``None``: the CRF's decoded tags, the model's default; a number: flag
        every word piece whose P(PHI) reaches it), ``batch_size`` of windows.
        """

        _load_tokenizer = True
        _load_feature_extractor = False
        _load_image_processor = False
        _load_processor = False

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            tagger = getattr(self.model, "dphub_tagger", None)
            if tagger is None:
                raise ModelError(f"{TASK}: the model was not loaded by dphub.hf (pass a model "
                                 "directory or a pulled org/name as model=)")
            tagger.device = self.device
            tagger.model.to(self.device)
            self._tagger = tagger

        def _sanitize_parameters(self, threshold: float | None = None,
                                 window_batch_size: int | None = None,
                                 **kwargs: Any) -> tuple[dict, dict, dict]:
            forward: dict[str, Any] = {}
            if threshold is not None:
                forward["threshold"] = float(threshold)
            if window_batch_size is not None:
                forward["batch_size"] = int(window_batch_size)
            return {}, forward, {}

        def preprocess(self, inputs: str, **_: Any) -> dict[str, Any]:
            if not isinstance(inputs, str):
                raise ModelError(f"{TASK}: inputs must be strings (note texts)")
            return {"text": inputs}

        def _forward(self, model_inputs: dict[str, Any], threshold: float | None = None,
                     batch_size: int = 16) -> dict[str, Any]:
            text = model_inputs["text"]
            spans = self._tagger.tag([Note(id="input", text=text)], threshold=threshold,
                                     batch_size=batch_size)[0]
            return {"text": text, "spans": spans}

        def postprocess(self, model_outputs: dict[str, Any], **_: Any) -> list[dict[str, Any]]:
            text = model_outputs["text"]
            out: list[dict[str, Any]] = []
            for s in sorted(model_outputs["spans"], key=lambda s: (s.start, s.end)):
                start, end = whole_words(text, s.start, s.end)
                if out and start < out[-1]["end"]:  # widening met the previous span: one entity
                    prev = out[-1]
                    prev["end"] = max(prev["end"], end)
                    prev["word"] = text[prev["start"]:prev["end"]]
                    prev["score"] = max(prev["score"], float(s.score or 0.0))
                    continue
                out.append({"entity_group": s.label, "start": start, "end": end,
                            "word": text[start:end], "score": float(s.score or 0.0)})
            return out

    return DphubPhiPipeline


def register() -> type:
    """Register :data:`TASK` with transformers (idempotent); return the pipeline class."""
    from transformers.pipelines import PIPELINE_REGISTRY

    existing = PIPELINE_REGISTRY.supported_tasks.get(TASK)
    if existing is not None:
        return existing["impl"]
    cls = _pipeline_class()
    PIPELINE_REGISTRY.register_pipeline(TASK, pipeline_class=cls, pt_model=DphubPipelineModel,
                                        type="text")
    return cls


DphubPhiPipeline = register()
