"""dphub inside the pipelines clinical NLP engineers already run (issue 56).

* :mod:`dphub.integrations.presidio`: ``DphubRecognizer``, an ``EntityRecognizer`` for Presidio's
  ``AnalyzerEngine`` (needs the ``presidio`` extra);
* :mod:`dphub.integrations.spacy`: the ``"dphub"`` spaCy pipeline component, registered through
  the ``spacy_factories`` entry point, so ``nlp.add_pipe("dphub", config=...)`` works without
  importing dphub first.

Both run a :class:`dphub.api.Deidentifier` (the CLI's batch path): the spans are those of
``dphub ensemble deid`` on the same text. This package imports nothing itself: spaCy imports the
component's module each time it builds a pipeline, so that module stays light.
"""
