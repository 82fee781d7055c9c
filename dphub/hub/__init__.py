"""dphub.hub: publish gate, local git hub and Hugging Face protocol backends, verified pull
(see docs/hub.md). The local registry of pulled models is :mod:`dphub.registry` (below the hub,
so that training reads it too); its names are re-exported here.

Entry points: :func:`publish`, :func:`pull`, :func:`search`, :func:`info`, :func:`list_models`
(``dphub.hub.ops``); :class:`Registry`, :class:`Entry` and :func:`resolve_model`
(``dphub.registry``) for the ensemble; :func:`check_publishable` (``dphub.hub.gate``).
"""

from dphub.hub.gate import check_publishable
from dphub.hub.ops import info, list_models, open_hub, publish, pull, search
from dphub.registry import Entry, Registry, resolve_model

__all__ = ["Entry", "Registry", "check_publishable", "info", "list_models", "open_hub", "publish",
           "pull", "resolve_model", "search"]
