"""The server runs dphub's installed ServerApp and nothing a run submits (issue 53).

Flower 1.42's SuperLink normally starts ``flower-superexec``, which starts ``flwr-serverapp``,
which installs the submitted app bundle (FAB) and imports the ServerApp it names: whoever can
submit a run executes Python on the server machine as the SuperLink's user (its TLS key, its
database). ``dphub federate superlink`` therefore starts the SuperLink with ``--isolation
process`` (Flower starts no app process) and ``--superexec-auth-secret-file`` (only a holder of
the secret may take a ServerApp task from its Runtime API), and takes the ServerApp tasks itself,
here, as :mod:`dphub.federate.site_runner` does for a site: it pulls the run and its bundle
through Flower's Runtime API client, checks the bundle (:func:`site_runner.check_fab`: dphub's
components, no file that could be code, the pinned hash if the operator set one), refuses a run
that overrides the bundle's config, never installs or imports anything from it, and calls the
installed :data:`dphub.federate.apps.server_app`.
"""

from __future__ import annotations

import logging
import ssl
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
from flwr.common.config import get_fused_config_from_fab
from flwr.common.constant import SubStatus
from flwr.common.serde import context_from_proto, context_to_proto, fab_from_proto, run_from_proto
from flwr.proto.runtime_pb2 import (  # Flower's Runtime API messages
    PullTaskInputRequest,
    PushTaskOutputRequest,
)
from flwr.supercore.constant import TaskType
from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor, SuperExecAuthHttpInterceptor
from flwr.supercore.retry import make_simple_http_retry_invoker
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supercore.task_identity import TaskIdentity
from flwr.superlink.grid import HttpGrid

from dphub.errors import ConfigError
from dphub.federate import apps
from dphub.federate.site_runner import AppRefused, check_fab, poll_tasks

log = logging.getLogger(__name__)

ACQUIRE = "/flwr.proto.Runtime/AcquireTask"


#: the host name in the SuperLink's loopback certificate (its TLS runs over the Unix socket)
_TLS_NAME = "127.0.0.1"


def over_socket(client: RuntimeHttpClient, path: Path, ca: bytes) -> RuntimeHttpClient:
    """Make a Runtime API client of Flower's dial the SuperLink's Unix socket ``path``.

    Flower's client takes an address only (``https://HOST:PORT``); its HTTP client is an
    ``httpx.Client``, replaced here by one with a Unix-socket transport and the same TLS check
    (the loopback CA, the name ``127.0.0.1``). A Flower whose client is built otherwise is
    refused rather than left dialling TCP.
    """
    old = getattr(client, "_client", None)
    if not isinstance(old, httpx.Client):
        raise ConfigError("this Flower's Runtime API client cannot dial a Unix socket: "
                          "install the Flower version dphub names (flwr 1.42)")
    ctx = ssl.create_default_context(cadata=ca.decode("ascii"))
    client._client = httpx.Client(  # noqa: SLF001 - see above
        transport=httpx.HTTPTransport(uds=str(path), verify=ctx), timeout=old.timeout,
        follow_redirects=True)
    old.close()
    return client


def _poll_client(path: Path, secret: bytes, ca: bytes) -> RuntimeHttpClient:
    """The Runtime API client that asks for ServerApp tasks, signing with the shared secret."""
    retry = make_simple_http_retry_invoker()
    retry.max_tries = 1  # the polling loop retries itself (and notices a dead SuperLink)
    return over_socket(RuntimeHttpClient.from_server_address(
        server_address=_TLS_NAME, insecure=False, root_certificates=ca,
        interceptors=[RuntimeVersionHttpInterceptor(component_name="SuperExec"),
                      SuperExecAuthHttpInterceptor(master_secret=secret,
                                                   protected_methods={ACQUIRE})],
        retry_invoker=retry), path, ca)


def run_server_task(path: Path, token: str, ca: bytes, *, app_hash: str | None = None) -> str:
    """One ServerApp task: check its bundle and run config, run dphub's installed ServerApp.

    Returns what happened (``completed``, ``refused: ...``, ``failed``) for the server's log.
    """
    grid = HttpGrid(runtime_api_address=_TLS_NAME, insecure=False, root_certificates=ca,
                    token=token)
    # Flower's own flwr-serverapp talks to the Runtime API through the grid's client too;
    # made once here, and the grid keeps it (it reconnects only after close)
    client = over_socket(grid._runtime_client, path, ca)  # noqa: SLF001
    heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
    heartbeat.start()
    context = None
    status, details, outcome = SubStatus.FAILED, "refused", "failed"
    try:
        res = client.PullTaskInput(PullTaskInputRequest())
        TaskIdentity.task_id = res.task_id
        TaskIdentity.run_id = res.run.run_id
        TaskIdentity.node_id = res.context.node_id
        context = context_from_proto(res.context)
        run = run_from_proto(res.run)
        fab = fab_from_proto(res.fab)
        grid.set_run(run)
        try:
            check_fab(fab.content, fab.hash_str, app_hash)
            if run.override_config:
                raise AppRefused("the run overrides the app's config (flwr run --run-config): "
                                 "the server runs the app's own config only")
        except AppRefused as e:
            log.warning("server: refused run %s: %s", run.run_id, e.message)
            details = "refused: this SuperLink runs only dphub's installed ServerApp"
            return "refused: " + e.message
        context.run_config = get_fused_config_from_fab(fab.content, run)
        apps.server_app(grid=grid, context=context)
        status, details, outcome = SubStatus.COMPLETED, "", "completed"
    except Exception as e:  # noqa: BLE001 - the ServerApp's or Flower's; its text may be long
        log.error("server: the run failed (%s)", type(e).__name__)
        details = f"ServerApp failed ({type(e).__name__})"
    finally:
        heartbeat.stop()
        grid._retry_invoker.max_tries = 1  # noqa: SLF001 - as flwr-serverapp's exit handler
        try:
            client.PushTaskOutput(PushTaskOutputRequest(
                context=context_to_proto(context) if context is not None else None,
                sub_status=status, details=details))
        except Exception as e:  # noqa: BLE001
            log.error("server: could not report the run's end (%s)", type(e).__name__)
        grid.close()
    return outcome


def serve_server_tasks(path: Path, stop: threading.Event, *, secret: bytes, ca: bytes,
                       app_hash: Callable[[], str | None] = lambda: None,
                       alive: Callable[[], bool] = lambda: True, poll: float = 1.0) -> None:
    """Take the SuperLink's ServerApp tasks, one at a time, until ``stop`` is set; each run's
    bundle must have the hash ``app_hash()`` gives at that moment (when it gives one)."""
    poll_tasks(_poll_client(path, secret, ca), TaskType.SERVER_APP.value,
               lambda token: run_server_task(path, token, ca, app_hash=app_hash()), stop,
               alive=alive, gone="the SuperLink stopped (see its log above)", poll=poll,
               who="server")
