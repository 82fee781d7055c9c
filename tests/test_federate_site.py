"""The site's side of a federation (issue 37): nothing runs at a site but dphub's installed
ClientApp, node keys and TLS by default, the site's own privacy policy, one process per state
directory, `join`'s options checked before any work, errors sent as categories.

The deployment tests start real Flower processes on loopback (a SuperLink, `dphub federate
join`) and a server app that tries to read the site's notes; they clean up every process they
start and check that none is left."""

from __future__ import annotations

import contextlib
import datetime
import io
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import time
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from federate_fixtures import OPTIONS, one_thread  # noqa: F401 (an autouse fixture)

from dphub import formats, synth
from dphub.cli.main import main as cli_main
from dphub.errors import ConfigError
from dphub.federate.site import (
    STATE_FILE,
    PolicyRefused,
    RoundOrder,
    Site,
    SiteAccounts,
    SitePolicy,
    hold_state_dir,
    init_state,
)
from dphub.federate.terms import FederationTerms

pytestmark = pytest.mark.filterwarnings("ignore")

BIN = Path(sys.executable).parent


def _flwr() -> None:
    pytest.importorskip("flwr")


@pytest.fixture(scope="module")
def notes_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    notes = synth.generate(8, kind="nursing", seed=5, patients=3)
    path = tmp_path_factory.mktemp("site") / "notes.jsonl"
    formats.write(notes, path, "jsonl")
    return path


def _order(rnd: int, digest: str, target: float = 8.0) -> RoundOrder:
    return RoundOrder(round=rnd, rounds=2, local_steps=2, target_epsilon=target,
                      frozen_digest=digest)


# ------------------------------------------------------------------ the site's own policy


def test_round_asking_more_than_the_policy_is_refused_accountant_unchanged(
        notes_file: Path, tiny_base_model: Path, tmp_path: Path) -> None:
    """The server's ε, σ, δ and unit are requests: a round asking for more than the site's
    policy is refused and the accountant (its state file) is exactly as before."""
    state = tmp_path / "s"
    opts = {**OPTIONS, "base_model": str(tiny_base_model)}
    policy = SitePolicy(max_epsilon=8.0, min_noise=0.3)
    site = Site(notes_file, state, opts, policy)
    weights = {n: p.detach().clone() for n, p in site.model.named_parameters()
               if p.requires_grad}
    _, rep = site.train_round(_order(1, site.frozen_digest), weights)
    assert json.loads(rep["policy"]) == policy.to_dict()  # the card's site row records it
    before = (state / STATE_FILE).read_bytes()
    for target in (1e6, 8.5, float("nan"), float("inf"), 1e30):  # and its neighbours
        with pytest.raises(PolicyRefused, match="epsilon"):
            site.train_round(_order(2, site.frozen_digest, target), weights)
        assert (state / STATE_FILE).read_bytes() == before
    # a fresh site whose planned σ would fall under the floor spends nothing either
    strict = SitePolicy(max_epsilon=8.0, min_noise=50.0)
    fresh = tmp_path / "fresh"
    other = Site(notes_file, fresh, opts, strict)
    with pytest.raises(PolicyRefused, match="noise"):
        other.train_round(_order(1, other.frozen_digest), weights)
    assert not (fresh / STATE_FILE).exists()
    # the recipe's requests: a fixed σ under the floor, another unit, a larger δ
    for extra, what in (({"noise": 0.2}, "noise"), ({"privacy_unit": "note"}, "unit"),
                        ({"delta": 1e-3}, "delta")):
        with pytest.raises(PolicyRefused, match=what):
            Site(notes_file, tmp_path / f"r-{what}", {**opts, **extra},
                 SitePolicy(delta=1e-5))
        assert not (tmp_path / f"r-{what}" / STATE_FILE).exists()


@pytest.mark.parametrize("bad", [
    {"max_epsilon": float("nan")}, {"max_epsilon": float("inf")}, {"max_epsilon": 1e30},
    {"max_epsilon": 0}, {"max_epsilon": -1.0}, {"max_epsilon": True},
    {"min_noise": 0}, {"min_noise": float("-inf")}, {"min_noise": "1"},
    {"delta": 0.5}, {"delta": float("nan")}, {"delta": 0}, {"unit": "hospital"},
])
def test_policy_values_are_checked(bad: dict) -> None:
    with pytest.raises(ConfigError, match="site policy"):
        SitePolicy(**bad)


def test_policy_file_toml_and_json(tmp_path: Path) -> None:
    toml = tmp_path / "policy.toml"
    toml.write_text('max_epsilon = 4.0\nmin_noise = 0.8\ndelta = 1e-6\nunit = "patient"\n')
    assert SitePolicy.from_file(toml) == SitePolicy(4.0, 0.8, 1e-6, "patient")
    js = tmp_path / "policy.json"
    js.write_text(json.dumps({"max_epsilon": 2}))
    assert SitePolicy.from_file(js).max_epsilon == 2
    for text, what in (('{"max_epsilon": 2, "target": 9}', "unknown"), ("[1]", "table"),
                       ("{", "not a site policy")):
        js.write_text(text)
        with pytest.raises(ConfigError, match=what):
            SitePolicy.from_file(js)



def test_card_site_row_records_the_site_policy(notes_file: Path, tiny_base_model: Path,
                                               tmp_path: Path) -> None:
    from dphub import card
    from dphub.federate.server import FederationConfig, FederationServer, site_policy_row
    from dphub.hub.validate import validate_card

    opts = {**OPTIONS, "base_model": str(tiny_base_model)}
    cfg = FederationConfig(out=tmp_path / "m", options=opts, rounds=1, local_steps=2)
    server = FederationServer(cfg)
    policy = SitePolicy(max_epsilon=6.0, min_noise=0.4, delta=1e-5)
    site = Site(notes_file, tmp_path / "site", opts, policy)
    order = RoundOrder(round=1, rounds=1, local_steps=2, target_epsilon=6.0,
                       frozen_digest=server.frozen_digest)
    server.aggregate(1, [site.train_round(order, server.weights)])
    server.write()
    validate_card(tmp_path / "m")
    rows = card.load_card(tmp_path / "m").meta["differential_privacy"]["federation"][
        "site_accounting"]
    assert [r["policy"] for r in rows] == [policy.to_dict()]
    # what a report claims as its policy is checked, never copied as is
    for bad in ("not json", '{"max_epsilon": NaN}', '{"max_epsilon": 1e30}', '{"x": 1}',
                '"str"', "[]", None, 5, '{"unit": "patient", "max_epsilon": 2, "pad": "' +
                "a" * 2000 + '"}'):
        assert site_policy_row(bad) is None, bad

# ------------------------------------------------------------------ one accountant, one process


def _holder(state: Path) -> subprocess.Popen[str]:
    """Another process that holds the state directory (as a running site would)."""
    code = ("import sys, time; from dphub.federate.site import hold_state_dir; "
            "hold_state_dir(sys.argv[1]); print('held', flush=True); time.sleep(120)")
    p = subprocess.Popen([sys.executable, "-c", code, str(state)], stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


def test_second_process_on_a_state_directory_is_refused(notes_file: Path,
                                                        tiny_base_model: Path,
                                                        tmp_path: Path) -> None:
    state = tmp_path / "s"
    opts = {**OPTIONS, "base_model": str(tiny_base_model)}
    site = Site(notes_file, state, opts)  # built before the other process took the directory
    holder = _holder(state)
    try:
        with pytest.raises(ConfigError, match="in use by another dphub process"):
            Site(notes_file, state, opts)
        with pytest.raises(ConfigError, match="in use by another dphub process"):
            site.train_round(_order(1, site.frozen_digest), {})
        assert not (state / STATE_FILE).exists()  # nothing counted
        with pytest.raises(ConfigError, match="in use"):
            hold_state_dir(state)
    finally:
        holder.kill()
        holder.wait()
    hold_state_dir(state)  # a killed holder releases it (the OS's lock)
    assert state.stat().st_mode & 0o077 == 0



def test_state_of_another_node_key_is_refused(notes_file: Path, tiny_base_model: Path,
                                              tmp_path: Path) -> None:
    """A deployed site's id is its node key's digest: a state directory whose accountant was
    written under another key (a replaced key or directory) is refused, not continued."""
    _flwr()
    from dphub.federate.deploy import ensure_node_key, node_key_id

    state = tmp_path / "s"
    state.mkdir()
    key, created = ensure_node_key(state)
    assert created and ensure_node_key(state) == (key, False)
    assert key.stat().st_mode & 0o077 == 0
    opts = {**OPTIONS, "base_model": str(tiny_base_model)}
    init_state(state, node_key_id(key), notes_file)  # as join does with a new key
    site = Site(notes_file, state, opts, site_id=node_key_id(key))
    st = site.state(_order(1, site.frozen_digest))
    acc = site.accounts()
    assert st is not None and acc is not None and acc.site_id == node_key_id(key)
    other = Site(notes_file, state, opts, site_id="0" * 16)
    with pytest.raises(ConfigError, match="another site id"):
        other.state(_order(1, other.frozen_digest))

# ------------------------------------------------------------------ the app a site runs


def _fab(files: dict[str, str]) -> tuple[bytes, str]:
    import hashlib

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    data = buf.getvalue()
    return data, hashlib.sha256(data).hexdigest()


DPHUB_PYPROJECT = """[project]
name = "dphub-federation"
version = "1.0.0"
[tool.flwr.app]
publisher = "dphub"
[tool.flwr.app.components]
serverapp = "dphub.federate.apps:server_app"
clientapp = "dphub.federate.apps:client_app"
[tool.flwr.app.config]
federation = "{}"
"""


def test_app_bundle_check() -> None:
    """Only dphub's app, with no file that could be code, under its own (or the pinned) hash."""
    _flwr()
    from dphub.federate.site_runner import AppRefused, check_fab

    ok = {"pyproject.toml": DPHUB_PYPROJECT, ".info/CONTENT": "pyproject.toml,x,1",
          "flwr-home/config.toml": "[superlink]\n"}
    data, digest = _fab(ok)
    check_fab(data, digest)
    check_fab(data, digest, digest)
    with pytest.raises(AppRefused, match="pinned"):
        check_fab(data, digest, "0" * 64)
    with pytest.raises(AppRefused, match="hash"):
        check_fab(data, "1" * 64)
    # code in any form, even under dphub's own module names: refused
    for name in ("evil.py", "dphub/federate/apps.py", "x.pth", "lib.so", "run.sh", "Makefile",
                 "../escape.toml", "/abs.toml"):
        data, digest = _fab({**ok, name: "import os"})
        with pytest.raises(AppRefused):
            check_fab(data, digest)
    for old, new in (("dphub.federate.apps:client_app", "evil:client_app"),
                     ("dphub.federate.apps:server_app", "evil:server_app"),
                     ("dphub.federate.apps:client_app", "dphub.federate.apps:server_app")):
        data, digest = _fab({**ok, "pyproject.toml": DPHUB_PYPROJECT.replace(old, new)})
        with pytest.raises(AppRefused, match="another ClientApp"):
            check_fab(data, digest)
    data, digest = _fab({".info/CONTENT": ""})
    with pytest.raises(AppRefused, match="pyproject"):
        check_fab(data, digest)
    with pytest.raises(AppRefused, match="readable"):
        check_fab(b"not a zip", __import__("hashlib").sha256(b"not a zip").hexdigest())


def test_site_errors_reach_the_server_as_categories(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A refusal's text (paths, note ids) stays at the site; the server reads a category."""
    _flwr()
    from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from dphub.federate import apps

    for name in ("_run_id", "_node_id", "_task_id"):  # as inside a Flower task
        monkeypatch.setattr(TaskIdentity, name, 1, raising=False)

    secret = tmp_path / "patient-4711" / "notes.jsonl"
    apps.use_local_site(secret, tmp_path / "st", SitePolicy())
    try:
        msg = Message(RecordDict({"config": ConfigRecord({"round": 1, "rounds": 1,
                                                          "local_steps": 1,
                                                          "target_epsilon": 8.0,
                                                          "frozen_digest": "0",
                                                          "options": "{}"})}),
                      dst_node_id=1, message_type=MessageType.TRAIN)
        msg.metadata.__dict__["_message_id"] = msg.object_id
        ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
        reply = apps.site_train(msg, ctx)
    finally:
        apps._LOCAL.clear()
        apps._SITES.clear()
    assert reply.has_error()
    assert reply.error.reason in apps.SITE_ERRORS.values()
    assert "4711" not in reply.error.reason and str(tmp_path) not in reply.error.reason


# ------------------------------------------------------------------ join's options


def test_join_options_are_checked_before_any_work(notes_file: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    _flwr()
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    busy = taken.getsockname()[1]
    ca = tmp_path / "ca.crt"
    ca.write_text("x")
    terms = tmp_path / "federation.json"
    FederationTerms(rounds=2, local_steps=2, target_epsilon=4.0, aggregation="mean",
                    options={"warm_start": "none"}, frozen_digest="a" * 64).write(terms)
    base = ["federate", "join", str(notes_file), "--state", str(tmp_path / "st"),
            "--federation", str(terms)]
    cases = [
        (["--server", "10.1.2.3:8000", "--insecure"], "loopback"),
        (["--server", "example.org:8000", "--insecure"], "loopback"),
        (["--server", "127.0.0.1:8000"], "--root-certificates"),
        (["--server", "127.0.0.1:8000", "--root-certificates", str(tmp_path / "no.crt")],
         "no such file"),
        (["--server", "127.0.0.1:8000", "--insecure", "--root-certificates", str(ca)],
         "choose one"),
        (["--server", "127.0.0.1", "--insecure"], "HOST:PORT"),
        (["--server", "127.0.0.1:99999", "--insecure"], "HOST:PORT"),
        (["--server", "127.0.0.1:8000", "--insecure", "--port", str(busy)], "in use"),
        (["--server", "127.0.0.1:8000", "--insecure", "--port", "0"], "1-65535"),
        (["--server", "127.0.0.1:8000", "--insecure", "--max-epsilon", "nan"], "policy"),
        (["--server", "127.0.0.1:8000", "--insecure", "--min-noise", "-1"], "policy"),
        (["--server", "127.0.0.1:8000", "--insecure", "--unit", "note", "--max-delta", "1"],
         "policy"),
        (["--server", "127.0.0.1:8000", "--insecure", "--app-hash", "abc"], "64 hex"),
        (["--server", "127.0.0.1:8000", "--insecure", "--policy", str(tmp_path / "no.toml")],
         "cannot read"),
    ]
    try:
        for extra, what in cases:
            assert cli_main([*base, *extra]) == 2, extra
            err = capsys.readouterr().err
            assert what in err and "Traceback" not in err, (extra, err)
            assert len(err.strip().splitlines()) == 1, err
    finally:
        taken.close()
    assert not (tmp_path / "st" / "node_key").exists()  # nothing made for a refused join
    missing = cli_main(["federate", "join", str(tmp_path / "none.jsonl"), "--state",
                        str(tmp_path / "st2"), "--server", "127.0.0.1:8000", "--insecure",
                        "--federation", str(terms)])
    assert missing == 2 and not (tmp_path / "st2").exists()


# ------------------------------------------------------------------ deployments on loopback


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ours(marker: str) -> list[int]:
    """Processes still alive whose command line names ``marker`` (this test's tmp_path)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if marker in cmd and stat[0] != "Z":
            pids.append(int(d.name))
    return pids


class Procs:
    """Processes a test starts; each in its own session, all stopped at the end."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.procs = tmp, []
        bindir = str(BIN)
        self.env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
                    "FLWR_HOME": str(tmp / "flwr-home"), "TOKENIZERS_PARALLELISM": "false",
                    "EVIL_MARKER": str(tmp / "evil-ran")}

    def start(self, argv: list[str], log: str) -> subprocess.Popen[bytes]:
        with open(self.tmp / log, "wb") as fh:
            p = subprocess.Popen(argv, env=self.env, stdout=fh, stderr=subprocess.STDOUT,
                                 start_new_session=True, cwd=self.tmp)
        self.procs.append(p)
        return p

    def log(self, name: str) -> str:
        return (self.tmp / name).read_text(errors="replace")

    def wait_for(self, name: str, text: str, timeout: float = 240) -> None:
        t0 = time.monotonic()
        while text not in self.log(name):
            assert time.monotonic() - t0 < timeout, self.log(name)[-3000:]
            time.sleep(1)

    def stop(self) -> None:
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        # a SuperLink's own children (its flower-superexec) are in its session
        t0 = time.monotonic()
        while _ours(str(self.tmp)) and time.monotonic() - t0 < 20:
            time.sleep(0.5)


@contextlib.contextmanager
def _procs(tmp: Path) -> Iterator[Procs]:
    procs = Procs(tmp)
    try:
        yield procs
    finally:
        procs.stop()


def _insecure_terms(tmp: Path, **change: object) -> Path:
    """Federation terms for a loopback test federation (no server CA)."""
    values: dict = dict(rounds=1, local_steps=2, target_epsilon=4.0, aggregation="mean",
                        options={"warm_start": "none"}, frozen_digest="a" * 64)
    path = tmp / "federation.json"
    FederationTerms(**{**values, **change}).write(path)
    return path


def _join(procs: Procs, notes: Path, state: Path, server: str, port: int, log: str,
          *extra: str) -> subprocess.Popen[bytes]:
    return procs.start([str(BIN / "dphub"), "federate", "join", str(notes), "--server", server,
                        "--state", str(state), "--port", str(port), *extra], log)


def _acquire_status(address: str, secret: bytes | None = None) -> int:
    """The HTTP status of one AcquireTask on a local Runtime API (as a task poller asks)."""
    import httpx
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.constant import TaskType
    from flwr.supercore.interceptors import (
        RuntimeVersionHttpInterceptor,
        SuperExecAuthHttpInterceptor,
    )
    from flwr.supercore.runtime import RuntimeHttpClient

    interceptors: list = [RuntimeVersionHttpInterceptor(component_name="SuperExec")]
    if secret is not None:
        interceptors.append(SuperExecAuthHttpInterceptor(
            master_secret=secret, protected_methods={"/flwr.proto.Runtime/AcquireTask"}))
    # no retry invoker: Flower's answers a 401 with SIGINT to its own process
    client = RuntimeHttpClient.from_server_address(server_address=address, insecure=True,
                                                   root_certificates=None,
                                                   interceptors=interceptors)
    try:
        # a type no site serves: a served request takes no real task away from the site
        client.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.MODEL.value]))
        return 200
    except httpx.HTTPStatusError as e:
        return e.response.status_code
    finally:
        client.close()


EVIL_APP = '''"""A server app that reads the site's notes and sends them back."""
import os
from pathlib import Path

from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

client_app = ClientApp()


@client_app.train()
def steal(msg: Message, context: Context) -> Message:
    Path(os.environ["EVIL_MARKER"]).write_text("ran")
    text = " ".join(str(v) for v in context.node_config.values())
    return Message(RecordDict({"loot": ConfigRecord({"text": text})}), reply_to=msg)


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    import json
    import time
    nodes = []
    for _ in range(120):
        nodes = list(grid.get_node_ids())
        if nodes:
            break
        time.sleep(1)
    msgs = [Message(RecordDict({"c": ConfigRecord({"x": 1})}), dst_node_id=n,
                    message_type=MessageType.TRAIN) for n in nodes]
    replies = list(grid.send_and_receive(msgs, timeout=180))
    Path(context.run_config["out"]).write_text(json.dumps(
        [{"error": r.has_error(), "reason": r.error.reason if r.has_error() else None,
          "content": None if r.has_error() else str(dict(r.content["loot"]))}
         for r in replies]))
'''


def _evil_app(tmp: Path) -> Path:
    app = tmp / "evil"
    app.mkdir()
    (app / "evil_app.py").write_text(EVIL_APP)
    (app / "pyproject.toml").write_text(f"""[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "evil"
version = "1.0.0"
description = "reads notes"
license = "Apache-2.0"
dependencies = []

[tool.flwr.app]
publisher = "someone"

[tool.flwr.app.components]
serverapp = "evil_app:server_app"
clientapp = "evil_app:client_app"

[tool.flwr.app.config]
out = "{tmp / 'evil-out.json'}"
""")
    return app


@pytest.mark.slow
def test_server_app_reading_notes_is_refused_and_join_stops_cleanly(notes_file: Path,
                                                                    tmp_path: Path) -> None:
    """On a SuperLink anyone can submit to, an app whose ClientApp reads the site's notes is
    refused: its code never runs at the site and the server gets a category, no text. The
    same site's state directory cannot be taken by a second `join`, nor its port; SIGTERM
    to `join` leaves no process behind."""
    _flwr()
    link = _free_port()
    server = f"127.0.0.1:{link}"
    home = tmp_path / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "local"\n[superlink.local]\naddress = "{server}"\n'
        "insecure = true\n")
    with _procs(tmp_path) as procs:
        procs.start([str(BIN / "flower-superlink"), "--insecure", "--port", str(link),
                     "--disable-runtime-dependency-installation"], "superlink.log")
        port = _free_port()
        fed = _insecure_terms(tmp_path)
        site = _join(procs, notes_file, tmp_path / "st", server, port, "join.log", "--insecure",
                     "--federation", str(fed))
        procs.wait_for("join.log", "SuperNode ID")
        assert "loopback only" in procs.log("join.log")
        # another local user polls the site's task API: refused without the site's secret
        # (0600 in its state directory); with it, the same request is served
        assert _acquire_status(f"127.0.0.1:{port}") == 401
        secret = tmp_path / "st" / "superexec_secret"
        assert secret.stat().st_mode & 0o077 == 0
        assert _acquire_status(f"127.0.0.1:{port}", secret.read_bytes()) == 200
        # a second process on the same state directory, and one on the same port
        for state, p, what in ((tmp_path / "st", _free_port(), "in use by another dphub"),
                               (tmp_path / "st-b", port, f"--port {port} is in use")):
            r = subprocess.run([str(BIN / "dphub"), "federate", "join", str(notes_file),
                                "--server", server, "--state", str(state), "--port", str(p),
                                "--insecure", "--federation", str(fed)], env=procs.env,
                               capture_output=True, text=True, timeout=300)
            assert r.returncode == 2 and what in r.stderr, r.stderr
            assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
        # the malicious app
        app = _evil_app(tmp_path)
        t0 = time.monotonic()
        while True:  # the SuperLink needs a moment before it takes runs
            r = subprocess.run([str(BIN / "flwr"), "run", str(app), "local"], env=procs.env,
                               capture_output=True, text=True, timeout=120)
            if "Successfully started run" in r.stdout or time.monotonic() - t0 > 120:
                break
            time.sleep(3)
        assert "Successfully started run" in r.stdout, r.stdout[-1000:]
        out = tmp_path / "evil-out.json"
        while not out.exists():
            assert time.monotonic() - t0 < 300, procs.log("join.log")[-3000:]
            time.sleep(1)
        replies = json.loads(out.read_text())
        assert replies and all(x["error"] for x in replies), replies
        assert all(x["reason"].startswith("app:") for x in replies)
        assert not (tmp_path / "evil-ran").exists()  # its ClientApp never ran at the site
        assert "refused the server's app" in procs.log("join.log")
        notes_text = json.loads(notes_file.read_text().splitlines()[0])["text"]
        assert notes_text[:30] not in out.read_text()
        # SIGTERM to join: the SuperNode goes with it
        os.killpg(site.pid, signal.SIGTERM)
        assert site.wait(timeout=60) == 0
        log = procs.log("join.log")
        assert "Traceback" not in log and "stopped" in log
        assert not [p for p in _ours(str(tmp_path / "st")) if p != site.pid]
    assert not _ours(str(tmp_path))


def _certificates(d: Path) -> None:
    """A test CA and a server certificate for 127.0.0.1 (the SuperLink's TLS)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dphub test ca")])

    def build(subject: x509.Name, key: ec.EllipticCurvePrivateKey) -> x509.CertificateBuilder:
        return (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_name)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1)))

    ca = build(ca_name, ca_key).add_extension(
        x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(
        ca_key, hashes.SHA256())
    key = ec.generate_private_key(ec.SECP256R1())
    cert = build(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]),
                 key).add_extension(x509.SubjectAlternativeName(
                     [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                     critical=False).sign(ca_key, hashes.SHA256())
    pem = serialization.Encoding.PEM
    (d / "ca.crt").write_bytes(ca.public_bytes(pem))
    (d / "server.pem").write_bytes(cert.public_bytes(pem))
    (d / "server.key").write_bytes(key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


def start_superlink(procs: Procs, tmp: Path) -> tuple[str, Path]:
    """`dphub federate superlink` as docs/federated.md runs it, on 127.0.0.1 with the test CA
    (:func:`_certificates`); returns its address and server directory once the gate answers."""
    import ssl

    import httpx

    _certificates(tmp)
    address = f"127.0.0.1:{_free_port()}"
    server_dir = tmp / "server"
    procs.start([str(BIN / "dphub"), "federate", "superlink", "--dir", str(server_dir),
                 "--address", address, "--ssl-certfile", str(tmp / "server.pem"),
                 "--ssl-keyfile", str(tmp / "server.key")], "superlink.log")
    ctx = ssl.create_default_context(cafile=str(tmp / "ca.crt"))
    t0 = time.monotonic()
    while True:
        try:
            if httpx.get(f"https://{address}/health", verify=ctx, timeout=5).status_code == 200:
                return address, server_dir
        except httpx.HTTPError:
            pass
        assert time.monotonic() - t0 < 180, procs.log("superlink.log")[-3000:]
        time.sleep(1)


def operator_home(tmp: Path, address: str, server_dir: Path) -> Path:
    """The operator's flwr-home: what `dphub federate serve --server-dir` writes (without an
    app's training settings: only the connection and the operator's token)."""
    from dphub.federate.deploy import CONNECTION, write_operator_credentials
    from dphub.federate.superlink import read_operator_token

    home = tmp / "operator-home"
    home.mkdir()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "{CONNECTION}"\n[superlink.{CONNECTION}]\n'
        f'address = "{address}"\nroot-certificates = "{tmp / "ca.crt"}"\n')
    write_operator_credentials(home, address, read_operator_token(server_dir))
    return home


@pytest.mark.slow
def test_unauthenticated_supernode_is_refused(notes_file: Path, tmp_path: Path) -> None:
    """The documented server (`dphub federate superlink`: TLS, node authentication): a site
    whose node key is not registered is refused and `join` ends with one line; once the
    operator registers it, the same site joins."""
    _flwr()
    with _procs(tmp_path) as procs:
        server, server_dir = start_superlink(procs, tmp_path)
        from dphub.io import file_sha256

        fed = _insecure_terms(tmp_path, server_ca_sha256=file_sha256(tmp_path / "ca.crt"))
        tls = ["--root-certificates", str(tmp_path / "ca.crt"), "--federation", str(fed)]
        site = _join(procs, notes_file, tmp_path / "st", server, _free_port(), "join.log", *tls)
        assert site.wait(timeout=300) == 2
        log = procs.log("join.log")
        assert "flwr supernode register" in log  # the new key, and what to do with it
        assert log.strip().splitlines()[-1].startswith("error: the SuperNode stopped")
        assert "Traceback" not in log
        assert "No SuperNode found with the given public key" in procs.log("superlink.log")
        # the operator registers the site's key: the same site now joins
        home = operator_home(tmp_path, server, server_dir)
        r = subprocess.run([str(BIN / "flwr"), "supernode", "register",
                            str(tmp_path / "st" / "node_key.pub"), "dphub"],
                           env={**procs.env, "FLWR_HOME": str(home)},
                           capture_output=True, text=True, timeout=120)
        assert "registered successfully" in r.stdout, r.stdout + r.stderr
        again = _join(procs, notes_file, tmp_path / "st", server, _free_port(), "join2.log",
                      *tls)
        procs.wait_for("join2.log", "SuperNode ID")
        # issue 53: the site killed outright (join and its SuperNode, as an OOM kill or a
        # power cut would): the SuperLink still counts it online; a new join waits for the
        # SuperLink to drop it and joins, instead of blaming the key
        children = [int(p) for p in (Path("/proc") / str(again.pid) / "task" /
                                     str(again.pid) / "children").read_text().split()]
        for pid in [*children, again.pid]:
            os.kill(pid, signal.SIGKILL)
        again.wait(timeout=30)
        third = _join(procs, notes_file, tmp_path / "st", server, _free_port(), "join3.log",
                      *tls)
        procs.wait_for("join3.log", "SuperNode ID", timeout=300)
        log = procs.log("join3.log")
        assert "error:" not in log and "node key registered" not in log, log[-2000:]
        assert third.poll() is None
        os.killpg(third.pid, signal.SIGTERM)
        assert third.wait(timeout=60) == 0
        assert not (tmp_path / "st" / ".join-running").exists()  # a clean stop
    assert not _ours(str(tmp_path))


@pytest.mark.slow
def test_deployed_run_config_of_another_federation_is_refused(tiny_base_model: Path,
                                                               notes_file: Path,
                                                               tmp_path: Path) -> None:
    """The finding (issue 53), end to end: the site pins the bundle (`--app-hash`) and agrees
    to the federation `serve` published (ε 4); `flwr run --run-config` replaces the
    federation block (ε 50, 40 rounds) under the same bundle hash. The site refuses every
    round (the server reads the category `federation`) and its accountant plans nothing."""
    _flwr()
    import hashlib

    import tomli_w

    link = _free_port()
    server = f"127.0.0.1:{link}"
    with _procs(tmp_path) as procs:
        procs.start([str(BIN / "flower-superlink"), "--insecure", "--port", str(link),
                     "--disable-runtime-dependency-installation"], "superlink.log")
        app = tmp_path / "app"
        assert cli_main(["federate", "serve", "--app-dir", str(app), "--out",
                         str(tmp_path / "m"), "--min-sites", "1", "--control", server,
                         "--state-dir", str(tmp_path / "server"), "--base-model",
                         str(tiny_base_model), "--warm-start", "none", "--accountant", "rdp",
                         "--batch-size", "2", "--max-length", "48", "--stride", "8",
                         "--no-rule-features", "--rounds", "1", "--local-steps", "2",
                         "--target-epsilon", "4"]) == 0
        # the bundle flwr builds from the app directory: the hash the site pins
        from flwr.cli.build import build_fab_from_disk

        fab = build_fab_from_disk(app)
        pin = hashlib.sha256(fab).hexdigest()
        _join(procs, notes_file, tmp_path / "st", server, _free_port(), "join.log",
              "--insecure", "--max-epsilon", "50", "--federation", str(app / "federation.json"),
              "--app-hash", pin)
        fed = json.loads(tomllib.loads((app / "pyproject.toml").read_text())["tool"]["flwr"][
            "app"]["config"]["federation"])
        override = tmp_path / "override.toml"
        override.write_text(tomli_w.dumps({"federation": json.dumps(
            {**fed, "target_epsilon": 50.0, "rounds": 40}, sort_keys=True)}))
        env = {**procs.env, "FLWR_HOME": str(app / "flwr-home")}
        t0 = time.monotonic()
        while True:
            r = subprocess.run([str(BIN / "flwr"), "run", str(app), "dphub", "--run-config",
                                str(override)], env=env, capture_output=True, text=True,
                               timeout=120)
            if "Successfully started run" in r.stdout or time.monotonic() - t0 > 120:
                break
            time.sleep(3)
        assert "Successfully started run" in r.stdout, r.stdout[-1000:]
        procs.wait_for("join.log", "round refused (federation)", timeout=400)
        log = procs.log("join.log")
        assert "refused the server's app" not in log  # the bundle passed its pin
        assert "target_epsilon" in log and "rounds" in log
        acc = SiteAccounts.load(tmp_path / "st" / STATE_FILE)
        assert acc is None or not acc.plans  # the accountant planned nothing
        server_state = tmp_path / "server" / "server_state.json"
        while not server_state.exists():  # the server's round 1: no site's accounting in it
            assert time.monotonic() - t0 < 400
            time.sleep(1)
        assert json.loads(server_state.read_text())["sites"] == {}
        assert not (tmp_path / "m" / "README.md").exists()
    assert not _ours(str(tmp_path))


@contextlib.contextmanager
def _http_server(ssl_dir: Path | None) -> Iterator[int]:
    """A local HTTP server answering /health, with TLS on ``ssl_dir``'s server certificate."""
    import http.server
    import ssl
    import threading

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    httpd.handle_error = lambda *a: None  # a refused handshake is the point here
    if ssl_dir is not None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(ssl_dir / "server.pem", ssl_dir / "server.key")
        httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_join_towards_the_wrong_protocol_is_one_line(notes_file: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    """`--insecure` towards a TLS SuperLink, TLS towards a plain one, a certificate another CA
    signed: `join` ends at once with one line (Flower's SuperNode retried them silently,
    forever), and nothing is made in the state directory."""
    _flwr()
    _certificates(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    _certificates(other)  # another CA and its server certificate
    from dphub.io import file_sha256

    plain_terms = _insecure_terms(tmp_path)
    tls_dir = tmp_path / "tls-terms"
    tls_dir.mkdir()
    tls_terms = _insecure_terms(tls_dir, server_ca_sha256=file_sha256(tmp_path / "ca.crt"))
    tls = ["--root-certificates", str(tmp_path / "ca.crt"), "--federation", str(tls_terms)]
    cases = [(tmp_path, ["--insecure", "--federation", str(plain_terms)], "speaks TLS"),
             (None, tls, "does not speak TLS"),
             (other, tls, "certificate is not valid")]
    for ssl_dir, extra, what in cases:
        with _http_server(ssl_dir) as port:
            rc = cli_main(["federate", "join", str(notes_file), "--server",
                           f"127.0.0.1:{port}", "--state", str(tmp_path / "st"), "--port",
                           str(_free_port()), *extra])
        err = capsys.readouterr().err
        assert rc == 2, (what, err[-2000:])
        assert what in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "st" / "node_key").exists()
