"""The built-in member kinds, one module each, registered in :mod:`dphub.ensemble.kinds` on
import (in this order: the manifest's error lists the kinds so).

* :mod:`.model`    a DP model: ``org/name[@rev]`` (kind ``registry``) or a directory (``dir``)
* :mod:`.rules`    ``rules:default`` (:mod:`dphub.rules`, ε = 0)
* :mod:`.deidpl`   ``deidpl:DIR[/CONFIG]``: deid.pl run as a separate program
* :mod:`.presidio` ``presidio:default``: presidio-analyzer, if installed
"""

# registration order = the order the manifest's error lists the kinds in
# isort: off
from dphub.ensemble.member_kinds import model
from dphub.ensemble.member_kinds import rules
from dphub.ensemble.member_kinds import deidpl
from dphub.ensemble.member_kinds import presidio
# isort: on

__all__ = ["deidpl", "model", "presidio", "rules"]
