"""The operator's role (issue 53): a stranger who holds only the SuperLink's address and the
public CA certificate can neither register nor unregister a node, list or read runs, nor
submit one, and no code a run submits runs on the server.

A real `dphub federate superlink` (Flower's SuperLink on loopback behind dphub's gate) and a
real site on 127.0.0.1; every process is stopped at the end and checked gone."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from federate_fixtures import one_thread  # noqa: F401 (an autouse fixture)
from test_federate_site import (
    BIN,
    _evil_app,
    _free_port,
    _join,
    _ours,
    _procs,
    start_superlink,
)

from dphub.cli.main import main as cli_main

pytestmark = pytest.mark.filterwarnings("ignore")


def _home(d: Path, name: str, address: str, ca: Path) -> Path:
    """A flwr connection with nothing but the address and the CA certificate."""
    d.mkdir(parents=True)
    (d / "config.toml").write_text(
        f'[superlink]\ndefault = "{name}"\n[superlink.{name}]\naddress = "{address}"\n'
        f'root-certificates = "{ca}"\n')
    return d


def _flwr(env: dict[str, str], home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "flwr"), *args], env={**env, "FLWR_HOME": str(home)},
                          capture_output=True, text=True, timeout=120)


def _wait_count(procs, log: str, text: str, n: int, timeout: float = 120) -> None:
    t0 = time.monotonic()
    while procs.log(log).count(text) < n:
        assert time.monotonic() - t0 < timeout, procs.log(log)[-3000:]
        time.sleep(1)


def _refusals(procs) -> list[str]:
    return [line for line in procs.log("superlink.log").splitlines() if "refused run" in line]


def _nodes(env: dict[str, str], home: Path) -> list[dict]:
    r = _flwr(env, home, "supernode", "list", "dphub", "--format", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)["nodes"]


@pytest.mark.slow
def test_stranger_at_the_port_is_not_the_operator(notes_file_op: Path, tiny_base_model: Path,
                                                  tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    """The deployment as docs/federated.md runs it, attacked from outside with the CA
    certificate and the address: no node registered, no site removed, no run listed, read or
    submitted, no code run on the server; the operator (its token) does all of it."""
    pytest.importorskip("flwr")
    from dphub.federate.deploy import ensure_node_key, write_app_dir
    from dphub.federate.server import FederationConfig

    ca = tmp_path / "ca.crt"
    with _procs(tmp_path) as procs:
        address, server_dir = start_superlink(procs, tmp_path)
        superlink = procs.procs[-1]
        assert (server_dir / "operator_token").stat().st_mode & 0o077 == 0
        assert server_dir.stat().st_mode & 0o077 == 0
        # the operator's app directory and flwr-home (with the token)
        app = tmp_path / "app"
        assert cli_main(["federate", "serve", "--app-dir", str(app), "--out",
                         str(tmp_path / "m"), "--control", address, "--root-certificates",
                         str(ca), "--server-dir", str(server_dir), "--min-sites", "1",
                         "--base-model", str(tiny_base_model), "--rounds", "1"]) == 0
        pinned = (server_dir / "app_hash").read_text().strip()
        assert json.loads(capsys.readouterr().out)["app_hash"] == pinned
        operator = app / "flwr-home"
        assert (operator / "credentials.yaml").stat().st_mode & 0o077 == 0
        # an honest site: the operator registers its key, it joins
        site = _join(procs, notes_file_op, tmp_path / "site", address, _free_port(),
                     "join.log", "--root-certificates", str(ca), "--federation",
                     str(app / "federation.json"))
        t0 = time.monotonic()
        while not (tmp_path / "site" / "node_key.pub").exists():
            assert time.monotonic() - t0 < 240, procs.log("join.log")
            time.sleep(1)
        r = _flwr(procs.env, operator, "supernode", "register",
                  str(tmp_path / "site" / "node_key.pub"), "dphub")
        assert "registered successfully" in r.stdout, r.stdout + r.stderr
        # the first join either activates now or has already been refused (it tried before the
        # key was registered; under load its refusal can come after this point): wait for one
        t0 = time.monotonic()
        while site.poll() is None and "SuperNode ID" not in procs.log("join.log"):
            assert time.monotonic() - t0 < 240, procs.log("join.log")
            time.sleep(1)
        if site.poll() is not None:  # it tried before the key was registered: start again
            site = _join(procs, notes_file_op, tmp_path / "site", address, _free_port(),
                         "join2.log", "--root-certificates", str(ca), "--federation",
                         str(app / "federation.json"))
            procs.wait_for("join2.log", "SuperNode ID")
        honest = _nodes(procs.env, operator)
        assert len(honest) == 1
        honest_id = str(honest[0]["node-id"])

        # the stranger: the address, the CA certificate, a key of their own, an app
        stranger = _home(tmp_path / "stranger-home", "dphub", address, ca)
        key, _ = ensure_node_key(tmp_path / "stranger-state")
        evil = _evil_app(tmp_path)
        attempts = {
            "register": ("supernode", "register", str(key.with_suffix(".pub")), "dphub"),
            "unregister": ("supernode", "unregister", honest_id, "dphub"),
            "list nodes": ("supernode", "list", "dphub"),
            "list runs": ("ls", "dphub"),
            "logs": ("log", "1", "dphub", "--show"),
            "run": ("run", str(evil), "dphub"),
        }
        for what, args in attempts.items():
            r = _flwr(procs.env, stranger, *args)
            out = r.stdout + r.stderr
            assert r.returncode != 0, (what, out)
            assert "operator's token" in out, (what, out)
            assert "successfully" not in out, (what, out)
        # a bearer token that is not the operator's, and the routes behind the gate
        ctx = ssl.create_default_context(cafile=str(ca))
        with httpx.Client(base_url=f"https://{address}", verify=ctx, timeout=10) as c:
            r = c.post("/v1/control/list-runs", content=b"",
                       headers={"Authorization": "Bearer " + "0" * 64})
            assert r.status_code == 403
            for path in ("/v1/runtime/acquire-task", "/v1/runtime/get-nodes",
                         "/v1/runtime/responses", "/v1/fleet/nothing", "/v1/fleet/get-run/x"):
                assert c.post(path, content=b"").status_code == 404, path
            for path in ("/v1/fleet/../control/list-runs", "/v1/fleet%2F..%2Fcontrol/list-runs",
                         "/v1/control%2Flist-runs", "/v1/fleet/get-run/../../control/list-runs"):
                assert c.post(path, content=b"").status_code in (403, 404), path
            for path in ("/docs", "/openapi.json"):
                assert c.get(path).status_code == 404, path

        # nothing happened: the honest site is registered, the stranger's key is not, no run
        assert [str(n["node-id"]) for n in _nodes(procs.env, operator)] == [honest_id]
        r = _flwr(procs.env, operator, "ls", "dphub", "--format", "json")
        assert r.returncode == 0 and json.loads(r.stdout)["runs"] == [], r.stdout
        # the operator's own run of an app with code: the server refuses it, nothing runs
        r = _flwr(procs.env, operator, "run", str(evil), "dphub")
        assert "Successfully started run" in r.stdout, r.stdout + r.stderr
        procs.wait_for("superlink.log", "refused run")
        time.sleep(3)
        assert not (tmp_path / "evil-out.json").exists()  # its ServerApp never ran
        assert not (tmp_path / "evil-ran").exists()
        assert "Traceback" not in procs.log("superlink.log")
        # the operator's own app with its config overridden at submission: refused too
        r = _flwr(procs.env, operator, "run", str(app), "dphub", "--run-config",
                  'federation="{}"')
        assert "Successfully started run" in r.stdout, r.stdout + r.stderr
        _wait_count(procs, "superlink.log", "refused run", 2)
        assert "overrides the app's config" in _refusals(procs)[1]
        # a bundle other than the one `serve` pinned, even submitted with the token: refused
        other = tmp_path / "other-app"
        write_app_dir(other, FederationConfig(out=tmp_path / "m2", options={}, min_sites=1,
                                              rounds=1), control=address, root_certificates=ca)
        r = _flwr(procs.env, operator, "run", str(other), "dphub")
        assert "Successfully started run" in r.stdout, r.stdout + r.stderr
        _wait_count(procs, "superlink.log", "refused run", 3)
        assert "is not the pinned" in _refusals(procs)[2]
        assert not (tmp_path / "m2").exists() and not (tmp_path / "m").exists()
        # a local user of the server machine, at Flower's SuperLink itself (no gate, no
        # token): there is no port to reach, and its socket is not theirs to open
        _local_user_cannot_reach_the_superlink(procs, superlink, address, server_dir)
        # the operator lists the runs and reads one's log through the gate
        r = _flwr(procs.env, operator, "ls", "dphub", "--format", "json")
        runs = json.loads(r.stdout)["runs"]
        assert len(runs) == 3, r.stdout
        r = _flwr(procs.env, operator, "log", str(runs[0]["run-id"]), "dphub", "--show")
        assert r.returncode == 0 and "operator's token" not in r.stdout + r.stderr, r.stderr
        os.killpg(site.pid, signal.SIGTERM)
        assert site.wait(timeout=60) == 0
    assert not _ours(str(tmp_path))


def _socket_of(log: str) -> Path:
    return Path(log.split("Flower's SuperLink on ", 1)[1].split()[0])


def _listening_inet(root_pid: int) -> set[tuple[str, int]]:
    """Every TCP address a process of ``root_pid``'s tree listens on."""
    import psutil

    top = psutil.Process(root_pid)
    found = set()
    for p in [top, *top.children(recursive=True)]:
        for c in p.net_connections(kind="inet"):
            if c.status == psutil.CONN_LISTEN:
                found.add((c.laddr.ip, c.laddr.port))
    return found


_AS_STRANGER = """
import socket, sys
path, port = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(path)
    print("unix: CONNECTED")
except OSError as e:
    print("unix:", type(e).__name__)
t = socket.socket()
try:
    t.connect(("127.0.0.1", port))
    print("tcp: CONNECTED")
except OSError as e:
    print("tcp:", type(e).__name__)
"""


def _local_user_cannot_reach_the_superlink(procs, superlink: subprocess.Popen, address: str,
                                           server_dir: Path) -> None:
    """Issue 53: on TCP loopback any local user was the operator. Now Flower's SuperLink
    listens on no TCP port at all (only the gate, on the public address, does), and its Unix
    socket lies in a 0700 directory of the server's user: another uid's ``connect`` is refused
    by the kernel (tried for real as ``nobody`` where the test runs as root)."""
    import shutil

    log = procs.log("superlink.log")
    sock = _socket_of(log)
    public_port = int(address.rsplit(":", 1)[1])
    assert _listening_inet(superlink.pid) == {("127.0.0.1", public_port)}
    st = sock.parent.stat()
    assert st.st_uid == os.geteuid() and st.st_mode & 0o777 == 0o700
    # the server's own user reaches the socket, but takes no ServerApp task without the secret
    _no_task_without_secret(sock, server_dir)
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        return
    import sys

    import psutil

    # the Flower process's own loopback port (what it was told to bind): nothing answers
    flower = next(p for p in psutil.Process(superlink.pid).children(recursive=True)
                  if "dphub.federate.unix_superlink" in " ".join(p.cmdline()))
    argv = flower.cmdline()
    port = argv[argv.index("--port") + 1]
    r = subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups",
                        sys.executable, "-I", "-c", _AS_STRANGER, str(sock), port],
                       capture_output=True, text=True, timeout=60, cwd="/")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["unix:", "PermissionError", "tcp:", "ConnectionRefusedError"], \
        r.stdout


def _no_task_without_secret(sock: Path, server_dir: Path) -> None:
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.constant import TaskType
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
    from flwr.supercore.runtime import RuntimeHttpClient

    from dphub.federate.server_runner import over_socket

    ca = (server_dir / "loopback-ca.crt").read_bytes()
    # no retry invoker: Flower's own answers a 401 with SIGINT to its process
    client = over_socket(RuntimeHttpClient.from_server_address(
        server_address="127.0.0.1", insecure=False, root_certificates=ca,
        interceptors=[RuntimeVersionHttpInterceptor(component_name="SuperExec")]), sock, ca)
    try:
        with pytest.raises(httpx.HTTPStatusError) as e:
            client.AcquireTask(AcquireTaskRequest(
                supported_task_types=[TaskType.SERVER_APP.value]))
        assert e.value.response.status_code == 401
    finally:
        client.close()


@pytest.fixture(scope="module")
def notes_file_op(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dphub import formats, synth

    notes = synth.generate(6, kind="nursing", seed=7, patients=3)
    path = tmp_path_factory.mktemp("op") / "notes.jsonl"
    formats.write(notes, path, "jsonl")
    return path


# ------------------------------------------------------------------ the gate and the bundle


@pytest.mark.parametrize(("method", "path", "want"), [
    ("POST", "/v1/fleet/pull-messages", ("fleet", "/v1/fleet/pull-messages")),
    ("POST", "/v1/fleet/register-node", ("fleet", "/v1/fleet/register-node")),
    ("POST", "/v1/control/start-run", ("control", "/v1/control/start-run")),
    ("GET", "/health", ("health", "/health")),
    ("GET", "/v1/fleet/pull-messages", None),
    ("POST", "/v1/runtime/acquire-task", None),
    ("POST", "/v1/runtime/responses", None),
    ("POST", "/v1/fleet/../control/start-run", None),
    ("POST", "/v1/fleet/get-run/../../control/start-run", None),
    ("POST", "/v1/control/../runtime/acquire-task", None),
    ("POST", "/v1/control/START-RUN", None),
    ("POST", "/v1//control/start-run", None),
    ("GET", "/docs", None),
    ("GET", "/openapi.json", None),
    ("POST", "/health", None),
])
def test_gate_forwards_only_fleet_control_and_health(method: str, path: str, want) -> None:
    pytest.importorskip("flwr")
    from dphub.federate.gate import route_kind

    assert route_kind(method, path) == want


def test_gate_knows_every_fleet_route_of_flower() -> None:
    """The gate's Fleet list is Flower's own (a SuperNode that calls a route the gate does not
    know would fail): checked against the installed Flower's router, so an upgrade that adds
    a route fails here first."""
    pytest.importorskip("flwr")
    from flwr.superlink.routers.fleet.router import router

    from dphub.federate.gate import FLEET_ROUTES

    assert {r.path.rsplit("/", 1)[1] for r in router.routes} == set(FLEET_ROUTES)


def test_operator_token_never_travels_in_the_app_bundle(tmp_path: Path) -> None:
    """`serve --server-dir` puts the operator's token in APP/flwr-home (0600); the bundle
    that `flwr run` builds from APP leaves flwr-home out, so the token reaches neither the
    server's database nor any site."""
    pytest.importorskip("flwr")
    import hashlib
    import zipfile
    from io import BytesIO

    from flwr.cli.build import build_fab_from_disk

    from dphub.federate.deploy import write_app_dir
    from dphub.federate.server import FederationConfig
    from dphub.federate.site_runner import check_fab
    from dphub.federate.superlink import operator_token

    (tmp_path / "server").mkdir(mode=0o700)
    token = operator_token(tmp_path / "server")
    ca = tmp_path / "ca.crt"
    ca.write_text("x")
    app = tmp_path / "app"
    write_app_dir(app, FederationConfig(out=tmp_path / "m", options={}), control="h:8000",
                  root_certificates=ca, operator_token=token)
    creds = app / "flwr-home" / "credentials.yaml"
    assert creds.stat().st_mode & 0o077 == 0 and token not in (app / "pyproject.toml").read_text()
    fab = build_fab_from_disk(app)  # as `flwr run` builds it
    with zipfile.ZipFile(BytesIO(fab)) as z:
        names = z.namelist()
        assert not [n for n in names if n.startswith("flwr-home")], names
        assert all(token.encode() not in z.read(n) for n in names)
    check_fab(fab, hashlib.sha256(fab).hexdigest())  # still dphub's app, as sites check it


def test_superlink_and_serve_options_are_checked_before_any_work(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """One `error:` line, exit 2, nothing started and no server directory made."""
    pytest.importorskip("flwr")
    import socket

    from test_federate_site import _certificates

    _certificates(tmp_path)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    busy = taken.getsockname()[1]
    sd = tmp_path / "server"
    tls = ["--ssl-certfile", str(tmp_path / "server.pem"), "--ssl-keyfile",
           str(tmp_path / "server.key")]
    cases = [
        (["--address", "127.0.0.1", *tls], "HOST:PORT"),
        (["--address", f"127.0.0.1:{busy}", *tls], "cannot listen"),
        (["--address", "192.0.2.1:8000", *tls], "cannot listen"),  # not this machine's
        (["--address", "127.0.0.1:8000", "--ssl-certfile", str(tmp_path / "no.pem"),
          "--ssl-keyfile", str(tmp_path / "server.key")], "no such file"),
        (["--address", "127.0.0.1:8000", *tls, "--app-hash", "abc"], "64 hex"),
    ]
    try:
        for extra, what in cases:
            assert cli_main(["federate", "superlink", "--dir", str(sd), *extra]) == 2, extra
            err = capsys.readouterr().err
            assert what in err and "Traceback" not in err, (extra, err)
            assert len(err.strip().splitlines()) == 1, err
    finally:
        taken.close()
    assert not sd.exists()
    rc = cli_main(["federate", "serve", "--app-dir", str(tmp_path / "app"), "--out",
                   str(tmp_path / "m"), "--server-dir", str(sd)])
    err = capsys.readouterr().err
    assert rc == 2 and "operator_token" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "app").exists()


def test_server_pin_follows_serve_and_a_damaged_pin_refuses_every_run(tmp_path: Path) -> None:
    pytest.importorskip("flwr")
    from dphub.federate.superlink import APP_HASH, SuperLinkPlan, pin_app, pinned_app

    d = tmp_path / "server"
    d.mkdir()
    plan = SuperLinkPlan(server_dir=d, host="127.0.0.1", port=1, certfile=d, keyfile=d,
                         app_hash=None, token="t", secret_file=d, loopback=(d, d, d),
                         socket_dir=d)
    assert pinned_app(plan) is None  # no serve --server-dir yet: any dphub bundle
    pin_app(d, "a" * 64)
    assert pinned_app(plan) == "a" * 64
    pin_app(d, "b" * 64)  # serve again: the new bundle, without a restart
    assert pinned_app(plan) == "b" * 64
    (d / APP_HASH).write_text("not a hash")
    assert pinned_app(plan) == "0" * 64  # matches no bundle
    plan.app_hash = "c" * 64  # --app-hash wins
    assert pinned_app(plan) == "c" * 64


def test_flowers_superlink_is_handed_the_socket_never_a_port(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`unix_superlink` runs Flower's own entry point with uvicorn's host and port replaced by
    the socket; a second HTTP server is refused; bad usage is one line."""
    pytest.importorskip("flwr")
    import uvicorn
    from flwr.superlink import cli as flwr_cli

    from dphub.federate import unix_superlink

    seen: list[dict] = []
    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: seen.append(kw))

    def fake_flower() -> None:  # what flwr.superlink.cli.flower_superlink does, in short
        import sys

        assert sys.argv[1:] == ["--host", "127.0.0.1", "--port", "9"]
        uvicorn.run(app="app", host="127.0.0.1", port=9, ssl_keyfile="k", workers=1)
        uvicorn.run(app="app", host="0.0.0.0", port=9)

    monkeypatch.setattr(flwr_cli, "flower_superlink", fake_flower)
    monkeypatch.setattr("sys.argv", ["x"])
    with pytest.raises(RuntimeError, match="second HTTP server"):
        unix_superlink.main(["--uds", "/d/s.sock", "--", "--host", "127.0.0.1", "--port", "9"])
    assert seen == [{"app": "app", "uds": "/d/s.sock", "ssl_keyfile": "k", "workers": 1}]
    with pytest.raises(SystemExit, match="usage"):
        unix_superlink.main(["--host", "127.0.0.1"])


def test_the_socket_directory_is_private_and_short(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("flwr")
    import shutil
    import tempfile

    from dphub.errors import ConfigError
    from dphub.federate.superlink import SOCKET_NAME, socket_dir

    short = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    try:
        monkeypatch.setattr(tempfile, "tempdir", str(short))
        d = socket_dir()
        assert d.parent == short and d.stat().st_mode & 0o777 == 0o700
        assert d.stat().st_uid == os.geteuid() and not (d / SOCKET_NAME).exists()
    finally:
        shutil.rmtree(short)
    deep = tmp_path / ("x" * 100)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    d = socket_dir()  # a TMPDIR too long for a socket: the system's /tmp
    try:
        assert d.parent == Path("/tmp") and d.stat().st_mode & 0o777 == 0o700
    finally:
        d.rmdir()
    assert list(deep.iterdir()) == []  # nothing left behind
    monkeypatch.setattr(os, "fsencode", lambda p: b"x" * 200)
    with pytest.raises(ConfigError, match="too long a path for a Unix socket"):
        socket_dir()
