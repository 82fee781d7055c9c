"""``dphub federate superlink``: the server machine's side of a deployment (issue 53).

Flower 1.42's open-source SuperLink gives whoever reaches its port the operator's role (its
Control API has no account authentication) and, by default, runs whatever ServerApp a run
submits. This command sets the SuperLink up so that neither holds:

* Flower's SuperLink listens on **a Unix socket only** (:mod:`dphub.federate.unix_superlink`),
  in a directory of the server's user made 0700, so no other local user can connect to it (on
  TCP loopback any local user was the operator); with TLS on a certificate this command makes
  for ``127.0.0.1`` (Flower requires TLS for ``--enable-supernode-auth``), only registered
  SuperNodes, no dependency installation,
  ``--isolation process`` (it starts no app process of its own) and
  ``--superexec-auth-secret-file`` (only a holder of the secret takes ServerApp tasks);
* the **gate** (:mod:`dphub.federate.gate`) serves the public ``--host``/``--port`` with the
  server's TLS certificate: the Fleet API for SuperNodes, the Control API only with the
  operator's token, nothing else;
* the ServerApp tasks are taken here (:mod:`dphub.federate.server_runner`): dphub's installed
  ServerApp runs, never code a run submits.

The server directory (``--dir``, 0700) holds the operator's token (``operator_token``, 0600;
``dphub federate serve --server-dir`` copies it into the operator's ``flwr`` credential store),
the SuperExec secret and the loopback certificate (keys 0600). It is the operator's role: keep
it like the server's TLS key.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from dphub.errors import ConfigError
from dphub.federate.deploy import _die_with_parent, _stop_group, split_address
from dphub.io import atomic_write_bytes, private_key

log = logging.getLogger(__name__)

OPERATOR_TOKEN = "operator_token"
SUPEREXEC_SECRET = "superexec_secret"
LOOPBACK_CA = "loopback-ca.crt"
LOOPBACK_CERT = "loopback.pem"
LOOPBACK_KEY = "loopback.key"
#: the SHA-256 of the app bundle `serve --server-dir` wrote: the only bundle the server runs
APP_HASH = "app_hash"
_TOKEN_BYTES = 32


def operator_token(server_dir: Path) -> str:
    """The operator's token (hex), made on first use (0600 in the server directory)."""
    path = Path(server_dir) / OPERATOR_TOKEN
    try:
        return private_key(path, _TOKEN_BYTES).hex()
    except ValueError as e:
        raise ConfigError(f"{path}: {e}") from None


def read_operator_token(server_dir: Path) -> str:
    """The token of an existing server directory (``serve --server-dir``); never makes one."""
    path = Path(server_dir) / OPERATOR_TOKEN
    if not path.is_file():
        raise ConfigError(f"--server-dir {server_dir}: no {OPERATOR_TOKEN} (start "
                          "`dphub federate superlink --dir` there first)")
    return operator_token(server_dir)


def is_sha256(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def pin_app(server_dir: Path, app_hash: str) -> None:
    """`serve --server-dir`: from now on the server runs only this bundle (``DIR/app_hash``)."""
    atomic_write_bytes(Path(server_dir) / APP_HASH, app_hash.encode("ascii") + b"\n")


def pinned_app(plan: SuperLinkPlan) -> str | None:
    """The bundle hash the server runs now: ``--app-hash``, else the one ``serve --server-dir``
    pinned last (read at each run, so a re-run of ``serve`` takes effect without a restart)."""
    if plan.app_hash is not None:
        return plan.app_hash
    try:
        text = (plan.server_dir / APP_HASH).read_text("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    # a file that is not a hash pins nothing dphub wrote: refuse every run rather than none
    return text if is_sha256(text) else "0" * 64


def _private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = path.stat()
    if st.st_uid != os.geteuid():
        raise ConfigError(f"--dir {path}: not owned by this user")
    os.chmod(path, 0o700)
    return path


def loopback_certificates(server_dir: Path) -> tuple[Path, Path, Path]:
    """A CA and a certificate for 127.0.0.1 (the SuperLink's loopback TLS), made once."""
    d = Path(server_dir)
    ca_p, cert_p, key_p = d / LOOPBACK_CA, d / LOOPBACK_CERT, d / LOOPBACK_KEY
    if ca_p.is_file() and cert_p.is_file() and key_p.is_file():
        return ca_p, cert_p, key_p
    # optional dependency: cryptography comes with Flower (dphub[federate])
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dphub superlink loopback")])

    def build(subject: x509.Name, key: ec.EllipticCurvePrivateKey) -> x509.CertificateBuilder:
        return (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_name)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=3650)))

    ca = build(ca_name, ca_key).add_extension(
        x509.BasicConstraints(ca=True, path_length=0), critical=True).sign(
        ca_key, hashes.SHA384())
    key = ec.generate_private_key(ec.SECP384R1())
    cert = build(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]),
                 key).add_extension(x509.SubjectAlternativeName(
                     [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                     critical=False).sign(ca_key, hashes.SHA384())
    pem = serialization.Encoding.PEM
    atomic_write_bytes(key_p, key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                serialization.NoEncryption()))
    atomic_write_bytes(cert_p, cert.public_bytes(pem))
    atomic_write_bytes(ca_p, ca.public_bytes(pem))  # last: its presence means all three
    return ca_p, cert_p, key_p


#: a Unix socket's path is at most 107 bytes on Linux
_MAX_SOCKET_PATH = 100
SOCKET_NAME = "superlink.sock"


def socket_dir() -> Path:
    """A fresh directory for the SuperLink's socket: made by this user, 0700 (``mkdtemp``,
    atomic in the sticky temp directory), so the kernel lets no other uid reach the socket."""
    for parent in dict.fromkeys([tempfile.gettempdir(), "/tmp"]):  # noqa: S108 - mkdtemp
        d = Path(tempfile.mkdtemp(prefix="dphub-superlink-", dir=parent))
        if len(os.fsencode(d / SOCKET_NAME)) <= _MAX_SOCKET_PATH:
            break
        os.rmdir(d)  # a long TMPDIR: the system's /tmp instead
    else:
        raise ConfigError(f"{d}: too long a path for a Unix socket (set TMPDIR shorter)")
    st = d.stat()
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise ConfigError(f"{d}: the SuperLink's socket directory is not private")
    return d


def _hold_loopback_port() -> socket.socket:
    """A loopback port held bound (no ``SO_REUSEADDR``, not listening): given to Flower as its
    ``--port``, so that a Flower that bound TCP after all could not (fail-closed)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s


@dataclass
class SuperLinkPlan:
    """`superlink`'s checked options and the server directory's files."""

    server_dir: Path
    host: str
    port: int
    certfile: Path
    keyfile: Path
    app_hash: str | None
    token: str
    secret_file: Path
    loopback: tuple[Path, Path, Path]
    socket_dir: Path

    @property
    def internal(self) -> Path:
        """The SuperLink's Unix socket (only this user can connect)."""
        return self.socket_dir / SOCKET_NAME


def plan_superlink(server_dir: Path, *, address: str, certfile: Path, keyfile: Path,
                   app_hash: str | None = None) -> SuperLinkPlan:
    """Check every option, then make the server directory's secrets (before any process)."""
    host, port = split_address(address, "--address")
    for what, p in (("--ssl-certfile", certfile), ("--ssl-keyfile", keyfile)):
        if not Path(p).is_file():
            raise ConfigError(f"{what} {p}: no such file")
    if app_hash is not None and not is_sha256(app_hash):
        raise ConfigError("--app-hash: expected the app bundle's SHA-256 (64 hex digits)")
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            raise ConfigError(f"--address {address}: cannot listen there (in use, or not an "
                              "address of this machine)") from None
    d = _private_dir(Path(server_dir))
    token = operator_token(d)
    try:
        private_key(d / SUPEREXEC_SECRET, _TOKEN_BYTES)
    except ValueError as e:
        raise ConfigError(f"{d / SUPEREXEC_SECRET}: {e}") from None
    return SuperLinkPlan(server_dir=d.resolve(), host=host, port=port,
                         certfile=Path(certfile).resolve(), keyfile=Path(keyfile).resolve(),
                         app_hash=app_hash, token=token, secret_file=(d / SUPEREXEC_SECRET)
                         .resolve(), loopback=loopback_certificates(d),
                         socket_dir=socket_dir())


def superlink_argv(plan: SuperLinkPlan, held_port: int,
                   python: str = sys.executable) -> list[str]:
    """Flower's SuperLink as this command runs it: on the private Unix socket (``held_port`` is
    a port this process holds, see :func:`_hold_loopback_port`), TLS, registered SuperNodes
    only, no app process of Flower's, the Runtime API's task hand-out behind the shared
    secret."""
    ca, cert, key = plan.loopback
    return [python, "-m", "dphub.federate.unix_superlink", "--uds", str(plan.internal), "--",
            "--host", "127.0.0.1", "--port", str(held_port),
            "--enable-supernode-auth", "--disable-runtime-dependency-installation",
            "--isolation", "process", "--superexec-auth-secret-file", str(plan.secret_file),
            "--ssl-ca-certfile", str(ca), "--ssl-certfile", str(cert), "--ssl-keyfile", str(key)]


def _remove_socket_dir(plan: SuperLinkPlan) -> None:
    shutil.rmtree(plan.socket_dir, ignore_errors=True)


class _Stopped(Exception):
    """SIGTERM/SIGINT reached `superlink`."""


#: Flower's switches for its legacy gRPC servers (TCP): never on here
_FLOWER_GRPC_SWITCHES = ("FLWR_INTERNAL_GRPC_CONTROL_API", "FLWR_INTERNAL_GRPC_FLEET_API")


def run_superlink(plan: SuperLinkPlan, *, env: dict[str, str] | None = None,
                  python: str = sys.executable) -> None:
    """Run the SuperLink (a child), its ServerApp tasks (a thread) and the gate (here) until
    SIGTERM/SIGINT; a SuperLink that exits on its own ends the command with one line."""
    import uvicorn  # comes with Flower (dphub[federate])

    from dphub.federate import gate, server_runner  # optional dependency: Flower

    ca_pem = plan.loopback[0].read_bytes()
    secret = plan.secret_file.read_bytes()
    stop = threading.Event()
    failed: list[str] = []
    env = {k: v for k, v in (os.environ if env is None else env).items()
           if k not in _FLOWER_GRPC_SWITCHES}
    held = _hold_loopback_port()
    try:
        child = subprocess.Popen(superlink_argv(plan, held.getsockname()[1], python), env=env,
                                 start_new_session=True, preexec_fn=_die_with_parent)
    except BaseException:
        held.close()
        _remove_socket_dir(plan)
        raise
    config = uvicorn.Config(
        gate.gate_app(plan.internal, plan.token, ca_pem), host=plan.host,
        port=plan.port, ssl_certfile=str(plan.certfile), ssl_keyfile=str(plan.keyfile),
        log_level="warning", access_log=False, lifespan="on")
    server = uvicorn.Server(config)

    def tasks() -> None:
        try:
            server_runner.serve_server_tasks(plan.internal, stop, secret=secret, ca=ca_pem,
                                             app_hash=lambda: pinned_app(plan),
                                             alive=lambda: child.poll() is None)
        except ConfigError as e:
            failed.append(e.message)
        finally:
            server.should_exit = True

    runner = threading.Thread(target=tasks, name="dphub-serverapp-tasks", daemon=True)
    runner.start()

    def on_signal(signum: int, frame: object) -> None:
        raise _Stopped

    # uvicorn stops the gate on SIGINT/SIGTERM, then raises the signal again under the
    # handlers it found: these, so the SuperLink is stopped below rather than orphaned
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run()
    except _Stopped:
        pass
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        stop.set()
        _stop_group(child)
        runner.join(timeout=10)
        held.close()
        _remove_socket_dir(plan)
    if failed:
        raise ConfigError(failed[0])
