"""The rule engine: patterns and dictionaries over a note's text, no training data (ε = 0).

Why a package of its own, in the model layer: the ensemble's rule member (``rules:default``) and
the tagger's rule features (:mod:`dphub.rule_features`) read the same matches, so the engine sits
below both.

* :mod:`~dphub.rules.engine`   :class:`~dphub.rules.engine.RuleMember`, its options, overlap resolution
* :mod:`~dphub.rules.lexicon`  word lists and word-context vocabulary
* :mod:`~dphub.rules.patterns` structured patterns (dates, phones, ids, ages) and their number checks
"""
