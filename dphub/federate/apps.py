"""Flower's ServerApp and ClientApp around :mod:`dphub.federate.server` and ``.site``.

One code path for both ways of running (Flower 1.42's Message API): the simulation engine
(:func:`dphub.federate.simulate.simulate`, ``flwr.simulation.run_simulation``) and a deployment
(``flower-superlink`` + ``flower-supernode`` + ``flwr run`` of the app directory that
``dphub federate serve`` writes) load these same two objects.

Where a site finds its data: in a deployment, ``dphub federate join`` runs this ClientApp in
its own process (:mod:`dphub.federate.site_runner`, never code the server ships) and sets
:func:`use_local_site`; the SuperNode itself never holds the paths. In the simulation,
partition ``i`` is the ``i``-th site of ``$DPHUB_FEDERATE_SITES`` (set by ``simulate``). The
server's configuration comes from the run config's ``federation`` value (deployment) or
``$DPHUB_FEDERATE_SERVER`` (simulation).

What a site sends the server when it does not train is a category (:data:`SITE_ERRORS`), never
the error's text: that may name paths or note ids. The site logs the details locally.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from dphub.errors import ConfigError, DphubError, InputError, PrivacyError
from dphub.federate.server import FederationConfig, FederationServer
from dphub.federate.site import PolicyRefused, RoundOrder, Site, SitePolicy
from dphub.federate.terms import FederationRefused, FederationTerms

log = logging.getLogger(__name__)

SITES_ENV = "DPHUB_FEDERATE_SITES"
SERVER_ENV = "DPHUB_FEDERATE_SERVER"
#: tests only: "PARTITION:ROUND" makes that simulated site fail from that round on (a dropout)
DROP_ENV = "DPHUB_FEDERATE_TEST_DROP"
#: Flower error code of a site's refusal; its reason is one of SITE_ERRORS' values
SITE_REFUSED = 4270
#: what a site tells the server when it does not train: a category, never paths or note ids
SITE_ERRORS = {
    "policy": "policy: the round asks for more than this site's privacy policy allows",
    "app": "app: this site runs only dphub's installed federation ClientApp",
    "federation": "federation: the run is not the federation this site agreed to",
    "privacy": "privacy: the site's accounting refused the round",
    "data": "data: the site's notes could not be used",
    "config": "config: the round's recipe or base does not match this site",
    "internal": "internal: the site failed (details in the site's own log)",
}

_SITES: dict[tuple[str, str, str], Site] = {}
_LOCAL: dict[str, Any] = {}


def use_local_site(data: Path, state: Path, policy: SitePolicy, *,
                   site_id: str | None = None, terms: FederationTerms | None = None) -> None:
    """This process is one deployed site (``dphub federate join``): its notes, state, policy,
    the site id bound to its node key and the federation it agreed to (``--federation``)."""
    _LOCAL.update(data=str(Path(data).resolve()), state=str(Path(state).resolve()),
                  policy=policy, site_id=site_id, terms=terms)


def error_category(e: BaseException) -> str:
    """The category a site sends for an error (its text stays in the site's log)."""
    if isinstance(e, FederationRefused):
        return "federation"
    if isinstance(e, PolicyRefused):
        return "policy"
    if isinstance(e, PrivacyError):
        return "privacy"
    if isinstance(e, InputError):
        return "data"
    if isinstance(e, DphubError):
        return "config"
    return "internal"


def site_error(category: str, msg: Message) -> Message:
    """The error reply the server gets: a fixed sentence per category."""
    return Message(Error(code=SITE_REFUSED, reason=SITE_ERRORS[category]), reply_to=msg)


def _site_paths(context: Context) -> tuple[str, str, int | None]:
    if _LOCAL:
        return _LOCAL["data"], _LOCAL["state"], None
    cfg = context.node_config
    sites = json.loads(os.environ.get(SITES_ENV, "[]"))
    pid = int(cfg.get("partition-id", -1))
    if not 0 <= pid < len(sites):
        raise ConfigError("this node has no site: run it with dphub federate join")
    data, state = sites[pid]
    return str(data), str(state), pid


def _dropped(pid: int | None, rnd: int) -> bool:
    spec = os.environ.get(DROP_ENV)
    if pid is None or not spec:
        return False
    p, r = (int(x) for x in spec.split(":"))
    return pid == p and rnd >= r


client_app = ClientApp()


@client_app.train()
def site_train(msg: Message, context: Context) -> Message:
    """One round at one site: DP-SGD from the global weights, reply with the new weights."""
    try:
        cfg = msg.content["config"]
        data, state, pid = _site_paths(context)
        order = RoundOrder.from_config(cfg)  # an absurd order is refused before anything
        if _dropped(pid, order.round):
            raise ConfigError("site dropped out (test)")
        try:
            options = json.loads(str(cfg["options"]))
            if not isinstance(options, dict):
                raise ValueError
        except (KeyError, ValueError):
            raise ConfigError("the round's recipe is not a table of options") from None
        terms: FederationTerms | None = _LOCAL.get("terms")
        if terms is not None:  # the run pinned whole: its config and its order, before a step
            terms.check_run_config(dict(context.run_config or {}))
            terms.check_order(rounds=order.rounds, local_steps=order.local_steps,
                              target_epsilon=order.target_epsilon,
                              frozen_digest=order.frozen_digest, options=options)
        key = (data, state, json.dumps(options, sort_keys=True))
        if key not in _SITES:
            _SITES[key] = Site(Path(data), Path(state), options, _LOCAL.get("policy"),
                               site_id=_LOCAL.get("site_id"), terms=terms)
        site = _SITES[key]
        weights, report = site.train_round(order, msg.content["arrays"].to_torch_state_dict())
    except Exception as e:  # noqa: BLE001 - the server gets a category, the site the details
        category = error_category(e)
        if isinstance(e, DphubError):
            log.warning("site: round refused (%s): %s", category, e.message)
        else:  # not ours: its text may quote a note, so only its type is logged
            log.error("site: round failed (%s)", type(e).__name__)
        return site_error(category, msg)
    content = RecordDict({"report": ConfigRecord(report)})
    if weights is not None:
        content["arrays"] = ArrayRecord(weights)
    return Message(content=content, reply_to=msg)


def _server_config(context: Context) -> FederationConfig:
    text = context.run_config.get("federation") if context.run_config else None
    text = text or os.environ.get(SERVER_ENV)
    if not text:
        raise ConfigError("no federation configuration (run config 'federation')")
    return FederationConfig.from_json(str(text))


def _wait_for_sites(grid: Grid, want: int, timeout: float) -> list[int]:
    t0 = time.monotonic()
    while True:
        nodes = list(grid.get_node_ids())
        if len(nodes) >= want or time.monotonic() - t0 > timeout:
            return nodes
        time.sleep(1.0)


def _error_category(reply: Message) -> str:
    """What the server logs of a site's error: a short category, never the site's free text
    (which could name paths or note ids)."""
    reason = str(reply.error.reason or "")
    if reply.error.code == SITE_REFUSED:  # one of dphub's fixed sentences: its category
        known = [k for k, v in SITE_ERRORS.items() if v == reason]
        if known:
            return f"refused: {known[0]}"
    if reply.error.code == SITE_REFUSED and re.fullmatch(r"[a-z][a-z -]{0,39}", reason):
        return f"refused: {reason}"
    return "refused" if reply.error.code == SITE_REFUSED else f"Flower error {reply.error.code}"


def run_federation(grid: Grid, cfg: FederationConfig) -> dict[str, Any]:
    """All rounds (from the last checkpointed one), then the model directory."""
    server = FederationServer(cfg)
    nodes = _wait_for_sites(grid, cfg.min_sites, cfg.round_timeout)
    if len(nodes) < cfg.min_sites:
        raise ConfigError(f"only {len(nodes)} site(s) connected, --min-sites is {cfg.min_sites}")
    for rnd in range(server.round + 1, cfg.rounds + 1):
        nodes = list(grid.get_node_ids())  # sites that joined late take part from here
        order = server.order(rnd)
        msgs = []
        for node in nodes:
            content = RecordDict({"arrays": ArrayRecord(server.weights),
                                  "config": ConfigRecord(order)})
            msgs.append(Message(content=content, dst_node_id=node,
                                message_type=MessageType.TRAIN, group_id=str(rnd)))
        sent = sum(m.content["arrays"].count_bytes() for m in msgs)
        replies = list(grid.send_and_receive(msgs, timeout=cfg.round_timeout))
        parsed, failed, received = [], 0, 0
        for r in replies:
            if r.has_error():
                failed += 1
                log.warning("round %d: a site did not train (%s)", rnd, _error_category(r))
                continue
            try:
                arrays = r.content.array_records.get("arrays")
                weights = arrays.to_torch_state_dict() if arrays is not None else None
                received += arrays.count_bytes() if arrays is not None else 0
                report = dict(r.content.config_records["report"])
            except Exception as e:  # noqa: BLE001 - any malformed reply drops that site only
                failed += 1
                log.warning("round %d: a site's reply is malformed (%s): dropped", rnd,
                            type(e).__name__)
                continue
            parsed.append((weights, report, int(r.metadata.src_node_id)))
        failed += len(nodes) - len(replies)
        server.bytes_per_round.append(sent + received)
        n = server.aggregate(rnd, parsed)
        log.info("round %d: %d site(s) trained, %d did not, %d bytes", rnd, n, failed,
                 sent + received)
        if n == 0 and server.all_spent(len(nodes)):
            log.info("every site's budget is spent: stopping after round %d", rnd)
            break
    return server.write()


server_app = ServerApp()


@server_app.main()
def server_main(grid: Grid, context: Context) -> None:
    run_federation(grid, _server_config(context))
