"""Local hub backend: one bare git repository per model at ``<hub>/models/<org>/<name>``.

Why this layout: it is exactly what ``olah`` serves as an offline mirror (``mirrors-path = [hub]``,
repos looked up as ``<mirror>/<repo_type>/<org>/<repo>``), so ``dphub hub serve`` turns any local hub
into a Hugging Face protocol endpoint without copying anything.

Publishing is crash-safe: file contents are written as git objects and committed through a
temporary index; the branch (and optional tag) move last, in one ``git update-ref --stdin``
transaction that compares against the previous commit. An interrupted publish leaves unreferenced
objects (harmless, ``git gc`` removes them) and the repo at its previous commit. Concurrent
publishers to one repo are serialized by a file lock next to it. Large files are plain git blobs
(no LFS): models here are tens of MB. They are stored as uncompressed loose objects: zlib gains
~8 % on float weights but makes a publish ~5x slower (5 s instead of 1 s for 87 MB) and every read
slower; ``git gc`` still packs them with the usual compression if a hub operator wants it.

Every blob read back is re-hashed (git does not re-check loose objects on read), so an object file
modified on disk is detected on pull.

A hub is data: nothing in it may run. git reads a repository's own config and runs its hooks,
so a hub repository could name programs (``gpg.program`` under ``log.showSignature``,
``core.fsmonitor``, a hooks directory, a promisor remote's ``uploadpack`` fetched from lazily on a
missing object, ...). Every git call here therefore goes through :func:`git_env`: no system or
global config, none of the user's ``GIT_*`` variables, command-line-scope config that overrides
the repository's (hooks, signatures, fsmonitor, pager, transports), and ``PATH`` /
``GIT_EXEC_PATH`` that name no directory, so git can start no sub-process by name (no lazy fetch,
no auto gc, no remote helper, no configured program); git itself is run by absolute path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from filelock import FileLock

from dphub.card import parse_card
from dphub.errors import CardError, HubError, PullRefused
from dphub.hub.common import (
    CardSummary,
    RepoRevision,
    check_relative_path,
    file_git_sha1,
    git_blob_sha1,
    parse_front_matter,
)
from dphub.hub.policy import POLICY_FILE
from dphub.repo_ids import check_repo_id, check_revision

BRANCH = "main"
_ZERO = "0" * 40
#: Commits are authored by the tool, never by the local user (whose name must not leak).
_IDENTITY = {
    "GIT_AUTHOR_NAME": "dphub", "GIT_AUTHOR_EMAIL": "dphub@localhost",
    "GIT_COMMITTER_NAME": "dphub", "GIT_COMMITTER_EMAIL": "dphub@localhost",
}
#: git config for writing model files: loose objects with zlib level 0. Weights barely compress,
#: and level 1 (git's default) costs 4 s per 87 MB.
_STORE_UNCOMPRESSED = (("core.looseCompression", "0"),)
#: Config of the command-line scope (``GIT_CONFIG_COUNT``, git >= 2.31): read after the
#: repository's config file and every file it includes, so these win over whatever a hub
#: repository sets. Transports, credential helpers, remote helpers and auto gc need a sub-process,
#: which :func:`git_env` makes impossible; they are switched off here as well.
SAFE_GIT_CONFIG: tuple[tuple[str, str], ...] = (
    ("core.hooksPath", os.devnull),  # no hook: reference-transaction, post-index-change, ...
    ("core.fsmonitor", "false"),
    ("core.pager", "cat"),
    ("core.sshCommand", "false"),
    ("core.useReplaceRefs", "false"),  # read the objects that are there, not replace refs
    ("log.showSignature", "false"),  # `log` of a gpgsig commit would run gpg.program
    ("log.mailmap", "false"),
    ("commit.gpgSign", "false"),  # commit-tree would sign with gpg.program
    ("tag.gpgSign", "false"),
    ("gpg.program", "false"),
    ("gpg.openpgp.program", "false"),
    ("gpg.x509.program", "false"),
    ("gpg.ssh.program", "false"),
    ("gpg.ssh.defaultKeyCommand", "false"),
    ("credential.helper", ""),  # the empty value clears the list
    ("protocol.allow", "never"),
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
)


def git_executable() -> str:
    """Absolute path of git, looked up in the absolute entries of ``PATH`` only (a relative entry
    such as ``.`` would let the current directory supply a program named git)."""
    dirs = [d for d in os.environ.get("PATH", os.defpath).split(os.pathsep) if os.path.isabs(d)]
    found = shutil.which("git", path=os.pathsep.join(dirs))
    if found is None:
        raise HubError("git was not found on PATH; the local hub needs git (>= 2.31)")
    return found


def git_env(config: Iterable[tuple[str, str]] = (), **extra: str) -> dict[str, str]:
    """Environment for a git process that reads a hub repository and runs nothing from it.

    The user's ``GIT_*`` variables are dropped (``GIT_DIR``, ``GIT_INDEX_FILE``,
    ``GIT_OBJECT_DIRECTORY``, ``GIT_CONFIG_PARAMETERS``, ... are set inside git hooks and would
    redirect reads and writes), system and global config are not read, and
    :data:`SAFE_GIT_CONFIG` plus ``config`` are given in the command-line scope. ``PATH`` and
    ``GIT_EXEC_PATH`` name no directory: git finds no sub-command, remote helper or program by
    name, so a lazy fetch from a promisor remote (``remote.*.promisor``, which would run the
    repository's ``remote.*.uploadpack``) cannot start whatever the repository configures.
    """
    entries = [*SAFE_GIT_CONFIG, *config]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update({
        "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0",
        "GIT_NO_REPLACE_OBJECTS": "1", "GIT_PAGER": "cat",
        "PATH": os.devnull, "GIT_EXEC_PATH": os.devnull,
        "GIT_CONFIG_COUNT": str(len(entries)),
    })
    for i, (key, value) in enumerate(entries):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    env.update(extra)
    return env


@dataclass(frozen=True)
class TreeEntry:
    mode: str
    kind: str
    oid: str
    path: str


class LocalHub:
    """A directory of bare git repos; ``name`` is how registry entries refer to it."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser().resolve()
        self.name = str(self.root)

    # -- plumbing -------------------------------------------------------------------------
    def repo_dir(self, repo_id: str) -> Path:
        org, name = check_repo_id(repo_id).split("/")
        return self.root / "models" / org / name

    def _git(self, repo_dir: Path, *args: str, input: bytes | None = None,
             env: dict[str, str] | None = None, config: Iterable[tuple[str, str]] = (),
             check: bool = True) -> bytes:
        """Run ``git --git-dir=repo_dir args`` safely (:func:`git_env`); the explicit
        ``--git-dir`` means git never discovers a repository from the working directory."""
        proc = subprocess.run(
            [git_executable(), "--no-pager", f"--git-dir={repo_dir}", *args], input=input,
            env=git_env(config, **_IDENTITY, **(env or {})), capture_output=True, check=False,
        )
        if check and proc.returncode != 0:
            # git's stderr names objects and refs, never file contents.
            detail = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
            raise HubError(f"git {args[0]} failed in {repo_dir}: {detail[0]}")
        return proc.stdout

    def exists(self, repo_id: str) -> bool:
        return (self.repo_dir(repo_id) / "HEAD").is_file()

    def check_root(self, *, create: bool = False) -> None:
        """Refuse a hub path that is a file, a non-empty directory that is not a hub, or (unless
        publishing) one that does not exist.

        Why: a mistyped ``--hub`` used to list "no matching models" (exit 0) and a file crashed
        publish. ``publish`` creates a missing local hub (documented in docs/hub.md); reading
        commands never do, so they say the hub does not exist.
        """
        if self.root.exists() and not self.root.is_dir():
            raise HubError(f"hub {self.name} is not a directory (a local hub is a directory; "
                           "a remote hub is an http(s):// or hf:// URL)")
        if not self.root.exists():
            if create:
                try:
                    self.root.mkdir(parents=True, exist_ok=True)
                except OSError as e:
                    raise HubError(f"cannot create hub {self.name}: "
                                   f"{e.strerror or type(e).__name__}") from None
                return
            raise HubError(f"hub {self.name} does not exist (nothing was published there); "
                           "check --hub, [hub] url in dphub.toml or $DPHUB_HUB")
        if not os.access(self.root, os.R_OK | os.X_OK):
            raise HubError(f"hub {self.name} cannot be read (permission denied)")

        # "models" itself is never counted: a concurrent first publish may create it between
        # the two looks at the directory
        foreign = [entry for entry in self.root.iterdir()
                   if not entry.name.startswith(".") and entry.name not in ("models", POLICY_FILE)]
        if foreign and not (self.root / "models").is_dir():
            # e.g. `--hub models/site`: publishing would write git repos into a model directory
            raise HubError(f"{self.name} is not a dphub hub (no models/ directory, and not "
                           "empty); give a hub directory, or a new one for publish to create")

    def _require(self, repo_id: str) -> Path:
        self.check_root()
        d = self.repo_dir(repo_id)
        if not (d / "HEAD").is_file():
            raise HubError(f"repo {repo_id} not found in hub {self.name}")
        return d

    def _init(self, repo_id: str) -> Path:
        """Create the bare repo atomically (init in a temp dir, rename into place)."""
        d = self.repo_dir(repo_id)
        if (d / "HEAD").is_file():
            return d
        d.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{d.name}.", suffix=".init", dir=d.parent))
        try:
            subprocess.run([git_executable(), "init", "--quiet", "--bare",
                            f"--initial-branch={BRANCH}", str(tmp)], check=True,
                           capture_output=True, env=git_env())
            os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide the repo from a shared server
            os.replace(tmp, d)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return d

    def _lock(self, repo_id: str) -> FileLock:
        d = self.repo_dir(repo_id)
        d.parent.mkdir(parents=True, exist_ok=True)
        return FileLock(str(d.parent / f".{d.name}.lock"))

    # -- publish --------------------------------------------------------------------------
    def publish(self, model_dir: Path, repo_id: str, message: str, tag: str | None = None) -> str:
        """Commit every file of ``model_dir`` as the new head of ``repo_id``; return the sha."""
        if tag is not None:
            check_revision(tag)
        self.check_root(create=True)
        model_dir = Path(model_dir).resolve()
        files = sorted(p for p in model_dir.rglob("*") if p.is_file())
        if any("\n" in str(p) for p in files):
            raise HubError(f"{model_dir}: file names must not contain newlines")
        with self._lock(repo_id):
            d = self._init(repo_id)
            old = self._git(d, "rev-parse", "--verify", "--quiet", f"refs/heads/{BRANCH}",
                            check=False).decode().strip() or None
            if tag is not None and self._git(d, "rev-parse", "--verify", "--quiet",
                                             f"refs/tags/{tag}", check=False).strip():
                raise HubError(f"tag {tag} already exists in {repo_id}; tags are immutable")
            rels = [p.relative_to(model_dir).as_posix() for p in files]
            oids = self._git(d, "hash-object", "-w", "--no-filters", "--stdin-paths",
                             input="".join(f"{p}\n" for p in files).encode(),
                             config=_STORE_UNCOMPRESSED).decode().split()
            fd, index = tempfile.mkstemp(prefix=".index.", dir=d)
            os.close(fd)
            os.unlink(index)  # git wants to create it itself
            try:
                env = {"GIT_INDEX_FILE": index}
                info = "".join(f"100644 {oid}\t{rel}\n" for oid, rel in zip(oids, rels, strict=True))
                self._git(d, "update-index", "--add", "--index-info", input=info.encode(), env=env)
                tree = self._git(d, "write-tree", env=env).decode().strip()
            finally:
                Path(index).unlink(missing_ok=True)
            parents = ["-p", old] if old else []
            commit = self._git(d, "commit-tree", "--no-gpg-sign", tree, *parents,
                               input=message.encode()).decode().strip()
            txn = ["start", f"update refs/heads/{BRANCH} {commit} {old or _ZERO}"]
            if tag is not None:
                txn.append(f"create refs/tags/{tag} {commit}")
            txn.append("commit")
            self._git(d, "update-ref", "--stdin", input=("\n".join(txn) + "\n").encode())
            return commit

    # -- read -----------------------------------------------------------------------------
    def resolve(self, repo_id: str, revision: str | None) -> str:
        """Commit sha of ``revision`` (branch, tag, sha or prefix; None = latest)."""
        d = self._require(repo_id)
        rev = check_revision(revision) if revision else f"refs/heads/{BRANCH}"
        out = self._git(d, "rev-parse", "--verify", "--quiet", "--end-of-options",
                        f"{rev}^{{commit}}", check=False).decode().strip()
        if not out:
            raise HubError(f"revision {revision or BRANCH} not found in {repo_id}")
        return out

    def tree(self, repo_id: str, sha: str) -> list[TreeEntry]:
        d = self._require(repo_id)
        out = self._git(d, "ls-tree", "-r", "-z", "--full-tree", sha).decode("utf-8")
        entries = []
        for rec in filter(None, out.split("\0")):
            meta, path = rec.split("\t", 1)
            mode, kind, oid = meta.split()
            entries.append(TreeEntry(mode, kind, oid, path))
        return entries

    def read_blob(self, repo_id: str, oid: str) -> bytes:
        """Blob content, re-hashed: a modified object on disk raises PullRefused."""
        d = self._require(repo_id)
        try:
            data = self._git(d, "cat-file", "blob", oid)
        except HubError:
            raise PullRefused(f"object {oid} of {repo_id} cannot be read (corrupted hub?)") from None
        if git_blob_sha1(data) != oid:
            raise PullRefused(f"object {oid} of {repo_id} does not match its hash (tampered?)")
        return data

    def read_file(self, repo_id: str, sha: str, path: str) -> bytes | None:
        for e in self.tree(repo_id, sha):
            if e.path == path and e.kind == "blob":
                return self.read_blob(repo_id, e.oid)
        return None

    def download_verified(self, repo_id: str, sha: str, dest: Path) -> dict[str, str]:
        """Write the files of commit ``sha`` into ``dest``; each one's git sha1 is re-checked."""
        listing: dict[str, str] = {}
        for e in self.tree(repo_id, sha):
            if e.kind != "blob" or e.mode not in ("100644", "100755"):
                raise PullRefused(f"{repo_id}@{sha[:12]}: {e.path!r} is not a regular file "
                                  f"(mode {e.mode}); refusing links and submodules")
            rel = check_relative_path(e.path)
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(self.read_blob(repo_id, e.oid))
            if file_git_sha1(target) != e.oid:
                raise PullRefused(f"{repo_id}@{sha[:12]}: {e.path} changed while downloading")
            listing[e.path] = e.oid
        return listing

    def same_as_head(self, model_dir: Path, repo_id: str) -> str | None:
        """The head commit of ``repo_id`` when it holds exactly the files of ``model_dir`` (same
        names, same git blob ids: weights, card and all), else None."""
        if not self.exists(repo_id):
            return None
        try:
            sha = self.resolve(repo_id, None)
        except HubError:
            return None
        remote = {e.path: e.oid for e in self.tree(repo_id, sha)}
        root = Path(model_dir).resolve()
        local = {p.relative_to(root).as_posix(): file_git_sha1(p)
                 for p in sorted(root.rglob("*")) if p.is_file()}
        return sha if local == remote else None

    def card_summary(self, repo_id: str, sha: str) -> CardSummary:
        """Summary of the card at ``sha``; its ε counts as verified only if the card passes the
        gate's card checks (schema + accounting recomputation), since a commit can reach the
        hub's git repository without going through ``publish``."""
        data = self.read_file(repo_id, sha, "README.md")
        if data is None:
            return CardSummary.checked({})
        where = f"{repo_id}@{sha[:12]}"
        try:
            text = data.decode("utf-8-sig")
            # the card module's bounded parse: size caps, no YAML anchors/aliases (a listing
            # would otherwise expand an alias bomb that bypassed the gate)
            meta = parse_front_matter(text, where=where)
            validated = parse_card(text, where=where).meta
        except UnicodeDecodeError:
            return replace(CardSummary.from_meta({}), problem="model card is not UTF-8 text")
        except CardError as e:
            return replace(CardSummary.from_meta({}), problem=e.message)
        return CardSummary.checked(meta, validated)

    def revisions(self, repo_id: str, max_count: int | None = None) -> list[RepoRevision]:
        """Commits of the branch (all, or the newest ``max_count``), newest first."""
        d = self._require(repo_id)
        tags: dict[str, list[str]] = {}
        for line in self._git(d, "for-each-ref", "--format=%(objectname) %(refname:short)",
                              "refs/tags").decode().splitlines():
            oid, name = line.split(" ", 1)
            tags.setdefault(oid, []).append(name)
        limit = [f"--max-count={max_count}"] if max_count else []
        out = self._git(d, "log", "--no-show-signature", "--no-mailmap", "--no-notes",
                        "--format=%H%x00%cI%x00%s", *limit, f"refs/heads/{BRANCH}",
                        check=False).decode("utf-8", "replace")
        revs = []
        for line in out.splitlines():
            sha, date, subject = line.split("\0", 2)
            revs.append(RepoRevision(repo_id, sha, self.card_summary(repo_id, sha), date, subject,
                                     tuple(tags.get(sha, ()))))
        return revs

    def repo_ids(self) -> Iterator[str]:
        self.check_root()
        models = self.root / "models"
        if not models.is_dir():
            return
        for org in sorted(models.iterdir()):
            if not org.is_dir() or org.name.startswith("."):
                continue
            for repo in sorted(org.iterdir()):
                if (repo / "HEAD").is_file() and not repo.name.startswith("."):
                    yield f"{org.name}/{repo.name}"

    def latest(self) -> list[RepoRevision]:
        """Head revision of every repo in the hub."""
        rows = []
        for repo_id in self.repo_ids():
            revs = self.revisions(repo_id, max_count=1)
            if revs:
                rows.append(revs[0])
        return rows
