"""``dphub federate serve``: the Flower app directory of a deployment (Flower 1.42's way).

A Flower 1.42 deployment is three long-running processes and one submission: a SuperLink
(``flower-superlink``) on the server machine, one SuperNode per site (``flower-supernode``,
each with ``--node-config "data='NOTES' state='STATE_DIR'"``), and ``flwr run APP_DIR dphub``,
which bundles the app directory written here and starts its ServerApp on the SuperLink. The app
directory holds no code: its components are dphub's own ServerApp and ClientApp
(:mod:`dphub.federate.apps`), which every machine has installed; the federation's settings
travel in its run config. ``flwr-home/config.toml`` names the SuperLink connection (TLS with
``root-certificates``, else insecure: localhost only). Commands: docs/federated.md.

The site's side (``dphub federate join``): :func:`plan_join` checks every option before any
process starts and locks the state directory; :func:`run_join` runs ``flower-supernode`` with
process isolation, TLS and the site's node key, and takes its tasks with dphub's own ClientApp
(:mod:`dphub.federate.site_runner`), so no code the server ships runs at the site.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import ipaddress
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tomli_w

from dphub.errors import ConfigError, InputError
from dphub.federate.server import FederationConfig
from dphub.federate.site import (
    NODE_KEY,
    SitePolicy,
    check_state_present,
    hold_state_dir,
    init_state,
    options_for,
)
from dphub.federate.terms import FederationTerms
from dphub.io import atomic_write_bytes, atomic_write_text, private_key

CONNECTION = "dphub"
FLWR_HOME = "flwr-home"


def _is_host_port(address: str) -> bool:
    host, _, port = address.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


def write_app_dir(app_dir: Path, cfg: FederationConfig, *, control: str,
                  root_certificates: Path | None, operator_token: str | None = None) -> None:
    """Write ``pyproject.toml`` (the Flower app) and ``flwr-home/config.toml`` (the connection).

    With ``operator_token`` (``dphub federate serve --server-dir``), ``flwr-home`` also gets
    the operator's credential store (0600): Flower's CLI then sends the token as a bearer
    token, which the gate of ``dphub federate superlink`` asks of every Control API call.
    ``flwr-home`` is kept out of the app bundle (``fab-exclude``): the token never travels.
    """
    cfg.validate()  # every option before anything is written
    if root_certificates is not None and not Path(root_certificates).is_file():
        raise ConfigError(f"{root_certificates}: no such certificate file")
    if not _is_host_port(control):
        raise ConfigError(f"--control must be HOST:PORT, got {control!r}")
    app_dir = Path(app_dir)
    if app_dir.exists() and any(app_dir.iterdir()) and not (app_dir / "pyproject.toml").exists():
        raise ConfigError(f"{app_dir}: exists and is not a dphub federation app directory")
    project = {
        "build-system": {"requires": ["hatchling"], "build-backend": "hatchling.build"},
        "project": {"name": "dphub-federation", "version": "1.0.0",
                    "description": "dphub federated DP training (dphub federate serve)",
                    # no dependencies: every machine runs its installed dphub (start the
                    # SuperLink with --disable-runtime-dependency-installation)
                    "dependencies": []},
        "tool": {"flwr": {"app": {
            "publisher": "dphub",
            # the operator's flwr-home (connection, credentials) never goes into the bundle
            "fab-exclude": [f"{FLWR_HOME}/**"],
            "components": {"serverapp": "dphub.federate.apps:server_app",
                           "clientapp": "dphub.federate.apps:client_app"},
            "config": {"federation": cfg.to_json()},
        }}},
    }
    conn: dict[str, object] = {"address": control}
    if root_certificates is not None:
        conn["root-certificates"] = str(Path(root_certificates).resolve())
    else:
        conn["insecure"] = True
    flwr_config = {"superlink": {"default": CONNECTION, CONNECTION: conn}}
    atomic_write_text(app_dir / "pyproject.toml", tomli_w.dumps(project))
    atomic_write_text(app_dir / FLWR_HOME / "config.toml", tomli_w.dumps(flwr_config))
    if operator_token is not None:
        write_operator_credentials(app_dir / FLWR_HOME, control, operator_token)


def app_bundle_hash(app_dir: Path) -> str:
    """The SHA-256 of the bundle ``flwr run APP_DIR`` builds (Flower's own builder: the
    bundle is deterministic, its dates fixed), for ``--app-hash`` at the sites and the pin at
    the server."""
    from flwr.cli.build import build_fab_from_disk  # optional dependency: Flower

    return hashlib.sha256(build_fab_from_disk(Path(app_dir))).hexdigest()


def write_operator_credentials(flwr_home: Path, address: str, token: str) -> None:
    """The operator's token in Flower's own credential store (``credentials.yaml``, 0600).

    Flower's CLI sends a stored OIDC access token as ``Authorization: Bearer``; the token is
    stored under that type so that the unmodified ``flwr`` sends it. Flower's SuperLink (no
    account plugin in the open-source release) ignores it; the gate checks it.
    """
    # optional dependency: Flower (dphub[federate])
    from flwr.cli.constant import (
        ACCESS_TOKEN_STORE_KEY,
        AUTHN_TYPE_STORE_KEY,
        REFRESH_TOKEN_STORE_KEY,
    )
    from flwr.common.constant import AuthnType
    from flwr.supercore.credential_store import FileCredentialStore

    path = Path(flwr_home) / "credentials.yaml"
    path.unlink(missing_ok=True)  # a fresh store: only this connection's entries
    store = FileCredentialStore(path)
    store.set(AUTHN_TYPE_STORE_KEY % address, AuthnType.OIDC.encode())
    store.set(ACCESS_TOKEN_STORE_KEY % address, token.encode())
    # never sent (the gate has no refresh route); Flower's CLI wants a pair
    store.set(REFRESH_TOKEN_STORE_KEY % address, b"none")
    os.chmod(path, 0o600)


# ---------------------------------------------------------------------- the site: `join`

#: the shared secret of the SuperNode's local Runtime API (``--superexec-auth-secret-file``)
TASK_SECRET = "superexec_secret"
SUPERNODE_LOG_NOTE = ("the SuperNode never holds the notes' path: dphub's ClientApp runs in "
                      "this process")


def split_address(address: str, what: str = "--server") -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too), checked before any work."""
    host, sep, port = str(address).rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(f"{what} {address!r}: expected HOST:PORT (port 1-65535)")
    return host, int(port)


def is_loopback(host: str) -> bool:
    """Only these hosts may take an insecure (no TLS, no node key) connection."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_port_free(port: int) -> None:
    """The SuperNode's local Runtime API port (one line when taken, not a traceback)."""
    if not 1 <= port <= 65535:
        raise ConfigError(f"--port {port}: must be 1-65535")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # as uvicorn binds: a port left in TIME_WAIT by a stopped site is free, a listening
        # one is not
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise ConfigError(f"--port {port} is in use on this machine: choose another "
                              "(one per site)") from None


def _ssl_error(e: BaseException) -> ssl.SSLError | None:
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, ssl.SSLError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def probe_superlink(server: str, root_certificates: Path | None) -> None:
    """One request to the SuperLink's ``/health`` before the SuperNode starts: a server that
    speaks TLS to an ``--insecure`` site (or plain HTTP to a TLS one, or a certificate the CA
    did not sign) is one line now, where Flower's SuperNode would retry it silently forever.

    A server that does not answer at all is not an error: the site may start first, and its
    SuperNode waits for it.
    """
    import httpx  # comes with Flower (dphub[federate])

    host, port = split_address(server)
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if root_certificates is None:
        url, verify = f"http://{netloc}/health", False
    else:
        url = f"https://{netloc}/health"
        try:
            verify = ssl.create_default_context(cafile=str(root_certificates))
        except (ssl.SSLError, ValueError):
            raise ConfigError(f"--root-certificates {root_certificates}: not a PEM "
                              "certificate") from None
    try:
        httpx.get(url, verify=verify, timeout=5.0)
    except (httpx.RemoteProtocolError, httpx.ReadError):
        if root_certificates is None:
            raise ConfigError(f"--insecure: the SuperLink at {server} speaks TLS; give "
                              "--root-certificates CA.crt (the CA of its certificate)") from None
        raise ConfigError(f"the SuperLink at {server} broke off the TLS connection") from None
    except httpx.HTTPError as e:
        err = _ssl_error(e)
        if err is None:
            return  # not reachable yet: the SuperNode waits for it
        if isinstance(err, ssl.SSLCertVerificationError):
            raise ConfigError(f"the SuperLink at {server}: its certificate is not valid for "
                              f"--root-certificates {root_certificates} ("
                              f"{err.verify_message})") from None
        raise ConfigError(f"the SuperLink at {server} does not speak TLS (--root-certificates "
                          "given): check the address") from None


def ensure_node_key(state_dir: Path) -> tuple[Path, bool]:
    """The site's node key (EC P-384, OpenSSH format, 0600) in its state directory.

    It is the site's identity at the SuperLink (``--enable-supernode-auth``: only registered
    keys join) and it lives with the accountant: a lost or replaced state directory has a new
    key, which the SuperLink refuses until the operator registers it (a new site, knowingly).
    Returns the private key's path and whether it was created now (then register its ``.pub``).
    """
    # optional dependency: cryptography comes with Flower (dphub[federate])
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = Path(state_dir) / NODE_KEY
    if key.exists():
        return key, False
    private = ec.generate_private_key(ec.SECP384R1())
    atomic_write_bytes(key, private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption()))
    atomic_write_bytes(key.with_suffix(".pub"), private.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n")
    return key, True


def node_key_id(key: Path) -> str:
    """A stable id for the site (its public key's digest): the same id as long as the key."""
    pub = Path(key).with_suffix(".pub").read_bytes().split()[1]
    return hashlib.sha256(pub).hexdigest()[:16]


@dataclass
class JoinPlan:
    """A site's checked `join` options (everything validated before any process starts)."""

    data: Path
    state: Path
    server: str
    port: int
    policy: SitePolicy
    root_certificates: Path | None = None
    key: Path | None = None
    key_created: bool = False
    app_hash: str | None = None
    terms: FederationTerms | None = None
    secret: Path | None = None

    @property
    def insecure(self) -> bool:
        return self.root_certificates is None


def plan_join(data: Path, state: Path, server: str, *, port: int,
              root_certificates: Path | None, insecure: bool, policy: SitePolicy,
              federation: Path, app_hash: str | None = None) -> JoinPlan:
    """Validate `join`'s options, lock the state directory, make the node key if needed.

    TLS and a node key are the default; ``insecure`` (neither) is allowed only towards a
    loopback SuperLink, so it can only be a test on one machine. ``federation``: the terms
    the site agrees to (``serve`` writes them), checked here against the site's policy and
    CA certificate; every order is compared with them.
    """
    data, state = Path(data), Path(state)
    if not data.is_file():
        raise InputError(f"{data}: no such file")
    host, _ = split_address(server)
    if app_hash is not None and (len(app_hash) != 64
                                 or any(c not in "0123456789abcdef" for c in app_hash)):
        raise ConfigError("--app-hash: expected the app bundle's SHA-256 (64 hex digits)")
    if insecure:
        if root_certificates is not None:
            raise ConfigError("--insecure and --root-certificates: choose one")
        if not is_loopback(host):
            raise ConfigError(f"--insecure: only towards a loopback SuperLink (127.0.0.1, "
                              f"::1, localhost), not {host}; give --root-certificates")
    elif root_certificates is None:
        raise ConfigError("--root-certificates CA.crt is required (TLS); --insecure only "
                          "for a test on this machine")
    elif not Path(root_certificates).is_file():
        raise ConfigError(f"--root-certificates {root_certificates}: no such file")
    terms = _agreed_terms(federation, data, state, policy,
                          None if insecure else Path(root_certificates))
    check_port_free(port)
    if state.exists() and not state.is_dir():
        raise ConfigError(f"--state {state}: not a directory")
    hold_state_dir(state)
    check_state_present(state)  # a key without its accountant: refused, never restarted
    # the local checks first, then the network: the SuperLink speaks our protocol, our CA
    probe_superlink(server, None if insecure else Path(root_certificates))
    key, created = (None, False) if insecure else ensure_node_key(state)
    if created:
        assert key is not None
        init_state(state, node_key_id(key), data)
    return JoinPlan(data=data.resolve(), state=state.resolve(), server=server, port=port,
                    policy=policy, root_certificates=(None if insecure else
                                                      Path(root_certificates).resolve()),
                    key=key, key_created=created, app_hash=app_hash, terms=terms,
                    secret=task_secret(state))


def _agreed_terms(federation: Path, data: Path, state: Path, policy: SitePolicy,
                  root_certificates: Path | None) -> FederationTerms:
    """The federation's terms, refused at once when the site's policy or CA rule them out."""
    terms = FederationTerms.load(federation)
    terms.check_server_ca(root_certificates)
    opts = options_for(terms.options, data=data, out=state / "unused")
    opts.validate()
    policy.check_options(opts)
    if not terms.target_epsilon <= policy.max_epsilon:
        raise ConfigError(f"--federation: epsilon {terms.target_epsilon:g} over all rounds; "
                          f"this site's policy is at most {policy.max_epsilon:g}")
    return terms


def task_secret(state: Path) -> Path:
    """The secret that the SuperNode's local Runtime API asks of whoever takes a task
    (``STATE/superexec_secret``, 0600, made on first use).

    The SuperNode's task API is a loopback port any local user can reach: without it, another
    user of the site's machine could poll the site's tasks and answer them (issue 53). With
    ``--superexec-auth-secret-file``, Flower hands a task (and so its token) only to a
    request signed with the secret, which only the site's user can read.
    """
    path = Path(state) / TASK_SECRET
    try:
        private_key(path, 32)
    except ValueError as e:
        raise ConfigError(f"{path}: {e}") from None
    return path.resolve()


def supernode_argv(plan: JoinPlan, exe: str) -> list[str]:
    """``flower-supernode`` as a site runs it: process isolation (no app process of Flower's),
    its Runtime API on loopback only (no dependency installation: its default) behind the
    site's task secret, TLS and the node key."""
    argv = [exe, "--superlink", plan.server, "--isolation", "process",
            "--host", "127.0.0.1", "--port", str(plan.port)]
    if plan.secret is not None:
        argv += ["--superexec-auth-secret-file", str(plan.secret)]
    if plan.insecure:
        return [*argv, "--insecure"]
    assert plan.key is not None and plan.root_certificates is not None
    return [*argv, "--root-certificates", str(plan.root_certificates),
            "--auth-supernode-private-key", str(plan.key)]


class _Stopped(Exception):
    """SIGTERM/SIGINT reached `join`."""


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """The SuperNode ends when `join` does, even on SIGKILL (Linux's parent-death signal)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


#: written while `join` runs its SuperNode, removed when it stops: found at start, the last
#: `join` was killed (SIGKILL), and the SuperLink may still count its SuperNode online
RUNNING_MARK = ".join-running"
#: how long a `join` after a killed one retries a refused activation: the SuperLink drops a
#: silent SuperNode after two missed heartbeats (Flower 1.42: 2 x 30 s, so about 60-90 s)
STILL_ONLINE_WAIT_S = 150.0
RETRY_S = 10.0
_ACTIVATION_REFUSED = b"Failed to activate SuperNode"


def run_join(plan: JoinPlan, supernode: str, *, env: dict[str, str] | None = None,
             still_online_wait: float = STILL_ONLINE_WAIT_S,
             echo: Callable[[str], None] | None = None) -> None:
    """Run the site until stopped: the SuperNode as a child, dphub's ClientApp here.

    SIGTERM or SIGINT stop both (the SuperNode's process group is terminated and waited for,
    so nothing is left running); a SuperNode that exits on its own (refused key, bad
    certificate) ends `join` with one line that says which. After a killed `join` the
    SuperLink refuses the same key until it drops the old connection: `join` then retries
    for up to ``still_online_wait`` seconds instead of blaming the key.
    """
    from dphub.federate import apps, site_runner  # optional dependency: Flower

    site_id = node_key_id(plan.key) if plan.key is not None else None
    apps.use_local_site(plan.data, plan.state, plan.policy, site_id=site_id, terms=plan.terms)
    stop = threading.Event()
    mark = plan.state / RUNNING_MARK
    killed_before = mark.exists()
    deadline = time.monotonic() + still_online_wait
    say = echo or (lambda line: print(line, file=sys.stderr, flush=True))

    def on_signal(signum: int, frame: object) -> None:
        stop.set()
        raise _Stopped

    child: subprocess.Popen[bytes] | None = None
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            child, pump, tail = _start_supernode(plan, supernode, env)
            mark.touch(mode=0o600)
            try:
                site_runner.serve_tasks(f"127.0.0.1:{plan.port}", stop,
                                        app_hash=plan.app_hash,
                                        alive=lambda c=child: c.poll() is None,
                                        secret=(plan.secret.read_bytes() if plan.secret
                                                else None))
                break
            except ConfigError:
                pump.join(timeout=10)
                refused = any(_ACTIVATION_REFUSED in line for line in tail)
                if not refused:
                    raise ConfigError("the SuperNode stopped (see its log above: a wrong "
                                      "certificate or an unreachable server)") from None
                if killed_before and time.monotonic() < deadline:
                    say("the SuperLink refused this site's SuperNode: the last join here "
                        "was killed and the SuperLink has not dropped its connection yet "
                        f"(it does within about 90 s); retrying in {RETRY_S:g} s")
                    _stop_group(child)
                    child = None
                    stop.wait(RETRY_S)
                    continue
                key = plan.key.with_suffix(".pub") if plan.key is not None else "its key"
                raise ConfigError("the SuperNode stopped: the SuperLink refused to activate "
                                  "it: is this site's node key registered? (flwr supernode "
                                  f"register {key})") from None
    except _Stopped:
        pass
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if child is not None:
            _stop_group(child)
        mark.unlink(missing_ok=True)  # a clean stop: the SuperNode deactivated itself


def _start_supernode(plan: JoinPlan, supernode: str, env: dict[str, str] | None
                     ) -> tuple[subprocess.Popen[bytes], threading.Thread, deque[bytes]]:
    """The SuperNode, its output copied to ours line by line (the last lines kept: why it
    stopped). It never holds a note or the notes' path."""
    child = subprocess.Popen(supernode_argv(plan, supernode), env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True,
                             preexec_fn=_die_with_parent)
    tail: deque[bytes] = deque(maxlen=50)

    def copy() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            tail.append(line)
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.buffer.write(line)
                sys.stderr.buffer.flush()

    pump = threading.Thread(target=copy, daemon=True)
    pump.start()
    return child, pump, tail


def _stop_group(child: subprocess.Popen[bytes]) -> None:
    """Terminate the SuperNode's whole process group and wait (then kill what is left)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGTERM)
    try:
        child.wait(timeout=15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
