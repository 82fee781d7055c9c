"""Federated DP training with Flower (``dphub federate``; optional: ``pip install dphub[federate]``).

Sites train one patient-level DP model together without sending notes, labels or raw
gradients: each runs dphub's own DP-SGD on its patients with one accountant over all rounds
(:mod:`.site`), the server averages the DP-trained weights (:mod:`.server`), Flower moves the
messages (:mod:`.apps`, :mod:`.simulate`). The guarantee is checked without Flower
(:mod:`dphub.privacy.federation`). Training layer: imports dphub.train, dphub.privacy,
dphub.card; nothing below imports it.
"""
