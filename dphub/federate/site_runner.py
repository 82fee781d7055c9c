"""A deployed site runs dphub's installed ClientApp and nothing the server ships.

Flower 1.42's SuperNode normally starts ``flower-superexec``, which starts ``flwr-clientapp``,
which installs the app bundle (FAB) the SuperLink sends and imports the ClientApp it names:
whoever can submit a run to the SuperLink runs code at every site (the review's critical
finding). Flower's own defence, ``--trusted-entities``, accepts only FABs signed through
Flower's platform (a local SuperLink sends none), so it cannot pin a self-hosted app.

So ``dphub federate join`` starts the SuperNode with ``--isolation process`` (Flower then starts
no app process at all) and takes the SuperNode's tasks itself, here: for each task it pulls the
message, the context and the FAB through the SuperNode's Runtime API (Flower's own client
functions), checks the FAB (:func:`check_fab`: only dphub's app, no file that could be code,
the pinned hash if the site set one), never installs or imports anything from it, and calls
dphub's installed :data:`dphub.federate.apps.client_app` in this process. A refused task gets
an error reply with a category (``app``), and the site logs why.
"""

from __future__ import annotations

import hashlib
import io
import logging
import threading
import tomllib
import zipfile
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Any

from flwr.common.constant import SubStatus
from flwr.proto.runtime_pb2 import AcquireTaskRequest  # Flower's Runtime API messages
from flwr.supercore.constant import TaskType
from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
from flwr.supercore.interceptors import (
    RuntimeTokenHttpInterceptor,
    RuntimeVersionHttpInterceptor,
    SuperExecAuthHttpInterceptor,
)
from flwr.supercore.retry import make_simple_http_retry_invoker
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supernode.runtime.run_clientapp import pull_task_input, push_message, push_task_output

from dphub.errors import ConfigError
from dphub.federate import apps

log = logging.getLogger(__name__)

#: the only ClientApp a site runs (its installed copy, never the FAB's)
CLIENTAPP_REF = "dphub.federate.apps:client_app"
SERVERAPP_REF = "dphub.federate.apps:server_app"
#: files a dphub app bundle may hold: its pyproject, Flower's manifest, data files; no code
_DATA_SUFFIXES = (".toml", ".md", ".json", ".yaml", ".yml", ".txt")
_MANIFEST = ".info/CONTENT"
_MAX_FAB_BYTES = 1 << 20


class AppRefused(ConfigError):
    """The server asked this site to run an app that is not dphub's federation app."""


def check_fab(content: bytes, fab_hash: str, pin: str | None = None) -> None:
    """Refuse any app bundle but dphub's: no code, dphub's components, the pinned hash.

    Nothing from the bundle is installed or imported either way; this says *which* runs are
    dphub's federation (its settings travel in the bundle's run config) and refuses the rest.
    """
    digest = hashlib.sha256(content).hexdigest()
    if digest != fab_hash:
        raise AppRefused("the app bundle does not match its hash")
    if pin is not None and digest != pin:
        raise AppRefused(f"the app bundle's hash {digest} is not the pinned {pin} "
                         "(--app-hash)")
    if len(content) > _MAX_FAB_BYTES:
        raise AppRefused("the app bundle is larger than a dphub app (it holds no code)")
    try:
        with zipfile.ZipFile(io.BytesIO(content)) as z:
            names = z.namelist()
            for name in names:
                path = PurePosixPath(name)
                if name == _MANIFEST or name.endswith("/"):
                    continue
                if path.is_absolute() or ".." in path.parts \
                        or not name.endswith(_DATA_SUFFIXES):
                    raise AppRefused("the app bundle holds a file that is not data "
                                     f"({path.suffix or 'no suffix'}): dphub's app has no code")
            if "pyproject.toml" not in names:
                raise AppRefused("the app bundle has no pyproject.toml")
            project = tomllib.loads(z.read("pyproject.toml").decode("utf-8"))
    except (zipfile.BadZipFile, UnicodeDecodeError, tomllib.TOMLDecodeError, KeyError):
        raise AppRefused("the app bundle is not a readable Flower app") from None
    app = project.get("tool", {}).get("flwr", {}).get("app", {})
    components = app.get("components", {}) if isinstance(app, dict) else {}
    if not isinstance(components, dict) or components.get("clientapp") != CLIENTAPP_REF \
            or components.get("serverapp") != SERVERAPP_REF:
        raise AppRefused("the app bundle names another ClientApp or ServerApp than dphub's")


#: the Runtime API call that hands out a task: signed with the site's secret
ACQUIRE = "/flwr.proto.Runtime/AcquireTask"


def _client(address: str, token: str | None = None,
            secret: bytes | None = None) -> RuntimeHttpClient:
    interceptors: list[Any] = [RuntimeVersionHttpInterceptor(component_name="SuperExec")]
    if secret is not None:
        interceptors.append(SuperExecAuthHttpInterceptor(master_secret=secret,
                                                         protected_methods={ACQUIRE}))
    retry = make_simple_http_retry_invoker()
    if token is not None:
        interceptors = [RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
                        RuntimeTokenHttpInterceptor(token)]
    else:
        retry.max_tries = 1  # the polling loop retries itself (and notices a dead SuperNode)
    return RuntimeHttpClient.from_server_address(
        server_address=address, insecure=True, root_certificates=None,
        interceptors=interceptors, retry_invoker=retry)


def run_task(address: str, token: str, *, app_hash: str | None = None) -> str:
    """One task of the SuperNode: check its app, run dphub's ClientApp, push the reply.

    Returns what happened (``trained``, ``refused: app``, ...) for the site's log.
    """
    client = _client(address, token)
    heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
    heartbeat.start()
    context = None
    status, details, outcome = SubStatus.FAILED, "refused", "refused: app"
    try:
        message, context, _run, fab = pull_task_input(client)
        try:
            check_fab(fab.content, fab.hash_str, app_hash)
        except AppRefused as e:
            log.warning("site: refused the server's app: %s", e.message)
            reply = apps.site_error("app", message)
        else:
            try:
                reply = apps.client_app(message=message, context=context)
            except Exception as e:  # noqa: BLE001 - e.g. a message type dphub does not serve
                log.error("site: the ClientApp failed (%s)", type(e).__name__)
                reply = apps.site_error("internal", message)
            status, details = SubStatus.COMPLETED, ""
            outcome = ("trained" if not reply.has_error() else
                       "refused: " + reply.error.reason.split(":", 1)[0])
        push_message(client, reply, context)
    except Exception as e:  # noqa: BLE001 - Flower's transport; its text may not be ours
        log.error("site: a task failed in transport (%s)", type(e).__name__)
        outcome = "failed"
    finally:
        heartbeat.stop()
        try:
            push_task_output(client, context, status, details)
        finally:
            client.close()
    return outcome


def poll_tasks(client: Any, task_type: str, handle: Callable[[str], str], stop: threading.Event,
               *, alive: Callable[[], bool], gone: str, poll: float, who: str) -> None:
    """Take the tasks of ``task_type`` one at a time until ``stop`` is set (``join``'s ClientApp
    tasks, the server's ServerApp tasks); ``handle(token)`` runs one and names its outcome. A
    process that stopped (``alive()`` false) ends the loop with ``gone``; a refused poll (the
    process starting or stopping) is retried after ``poll`` seconds."""
    try:
        while not stop.is_set():
            if not alive():
                raise ConfigError(gone)
            try:
                res = client.AcquireTask(AcquireTaskRequest(supported_task_types=[task_type]))
            except Exception:  # noqa: BLE001 - the process is starting or stopping
                stop.wait(poll)
                continue
            if res.HasField("task") and res.token:
                log.info("%s: task done (%s)", who, handle(res.token))
                continue
            stop.wait(poll)
    finally:
        client.close()


def serve_tasks(address: str, stop: threading.Event, *, app_hash: str | None = None,
                alive: Callable[[], bool] = lambda: True, poll: float = 1.0,
                secret: bytes | None = None) -> None:
    """Take the SuperNode's ClientApp tasks until ``stop`` is set or the SuperNode is gone
    (asking for them signed with the site's task ``secret``, :func:`deploy.task_secret`)."""
    poll_tasks(_client(address, secret=secret), TaskType.CLIENT_APP.value,
               lambda token: run_task(address, token, app_hash=app_hash), stop, alive=alive,
               gone="the SuperNode stopped (see its log above: an unregistered key, a wrong "
                    "certificate or an unreachable server)", poll=poll, who="site")

