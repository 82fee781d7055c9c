"""``dphub review``: a page to read a finished de-identification run and correct it (issue 40).

* :mod:`~dphub.review.run`         a run (``run.json``, ``audit.jsonl``) read back with its notes
* :mod:`~dphub.review.doubt`       the order of review (members disagree, near a threshold, the
  inverse rule's words)
* :mod:`~dphub.review.corrections` the reviewer's corrections as labelled notes (JSONL, 0600)
* :mod:`~dphub.review.page`        the page (Jinja2, plain CSS/JS, no external request)
* :mod:`~dphub.review.units`       the page boundary: code points <-> UTF-16 offsets, the schema
  of what the page saves (issue 54)
* :mod:`~dphub.review.safe_words`  rejected words as site-local safe words of the inverse rule
  (issue 54)
* :mod:`~dphub.review.server`      serving it on loopback (Starlette + uvicorn, token, Host check)

The web modules import the optional ``review`` extra (starlette, uvicorn, jinja2); this package's
``__init__`` imports none of them.
"""
