"""Owner-side training: models a data owner trains for itself from the ensemble and its notes.

Why a package of its own, above :mod:`dphub.ensemble`: these modules train (they import
:mod:`dphub.train` and the hub's gate checks), while the ensemble only combines members.

* :mod:`~dphub.owner.distill`        Scenario A students on ensemble labels (``ensemble distill``),
  Scenario B models on the owner's labels (``ensemble train``); local-only cards the gate refuses
* :mod:`~dphub.owner.public_student` ``ensemble distill-public``: one DP model + the rules label
  public synthetic notes; the student carries its teacher's ε
"""
