"""Hugging Face protocol backend: huggingface.co, any ``HF_ENDPOINT``, or olah serving a local hub.

Everything goes through :class:`huggingface_hub.HfApi` and ``snapshot_download``; tokens come
from the usual places (``HF_TOKEN``, ``hf auth login``). Downloads are checked file by file
against the hub's own listing (``list_repo_tree``): the git blob id for regular files, the LFS
sha256 for LFS files. Nothing is loaded by repo id: olah answers a missing file with 401 rather
than 404, so callers load from the verified snapshot directory instead.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from dphub.errors import HubError, PullRefused
from dphub.hub.common import DP_TAG, CardSummary, RepoRevision, check_relative_path, file_git_sha1
from dphub.io import file_sha256
from dphub.repo_ids import check_repo_id, check_revision


def _hub_error(repo_id: str, e: Exception) -> HubError:
    """Map huggingface_hub errors to one line (their messages hold URLs, not note text)."""
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    if isinstance(e, RevisionNotFoundError):
        return HubError(f"revision not found in {repo_id}")
    if isinstance(e, RepositoryNotFoundError):
        return HubError(f"repo {repo_id} not found (or not accessible with your token)")
    first = str(e).strip().splitlines()[:1] or [type(e).__name__]
    return HubError(f"hub request for {repo_id} failed: {first[0]}")


#: Reachability probe before the first request: at most this many tries, each with this timeout
#: (per connect/read phase), and this pause between them: an unreachable hub is reported within
#: 4.5 s. huggingface_hub's own retries (5 tries with backoff up to 8 s, a WARNING line each) took
#: 24 s to report it (issue 16, fault 15); they still apply, silently, to a hub that answered the
#: probe and then fails.
PROBE_TRIES = 2
PROBE_TIMEOUT_S = 2.0
PROBE_PAUSE_S = 0.5
#: Loggers that report retries and connection trouble on the user's terminal.
_NOISY_LOGGERS = ("huggingface_hub", "urllib3", "httpx", "httpx2", "httpcore", "filelock")


@contextlib.contextmanager
def quiet_http() -> Iterator[None]:
    """Silence the HTTP stack's warnings while dphub talks to a hub (the library never prints;
    failures reach the user as one ``HubError`` line instead)."""
    saved = [(lg, lg.level) for lg in map(logging.getLogger, _NOISY_LOGGERS)]
    for lg, _ in saved:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in saved:
            lg.setLevel(level)


def probe(url: str, *, tries: int = PROBE_TRIES, timeout: float = PROBE_TIMEOUT_S,
          pause: float = PROBE_PAUSE_S) -> None:
    """Raise :class:`HubError` naming ``url`` unless it answers an HTTP request (any status).

    Uses huggingface_hub's session, so proxies and TLS settings are the ones later calls use.
    """
    from huggingface_hub.utils import get_session

    reason = "no answer"
    for attempt in range(tries):
        if attempt:
            time.sleep(pause)
        try:
            with quiet_http():
                # "Connection: close": the probe's connection must not be reused by the calls
                # after it (olah resets a kept-alive connection after its root page).
                get_session().get(url, timeout=timeout, headers={"Connection": "close"})
            return
        except Exception as e:  # noqa: BLE001 - connection refused, DNS, TLS, timeout, offline
            text = str(e).strip().splitlines()[:1]
            reason = text[0][:200] if text else type(e).__name__
    raise HubError(f"hub {url} is unreachable ({reason}); check the URL, that the server is "
                   "running, and the network")


_F = TypeVar("_F", bound=Callable[..., Any])


def _hub_call(method: _F) -> _F:
    """Run an :class:`HFHub` method inside :meth:`HFHub._call` (probe once, quiet logs)."""

    @functools.wraps(method)
    def wrapper(self: HFHub, *args: Any, **kwargs: Any) -> Any:
        with self._call():
            return method(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


class HFHub:
    """One Hugging Face protocol endpoint (``endpoint=None``: ``HF_ENDPOINT`` or huggingface.co)."""

    def __init__(self, endpoint: str | None = None, api: Any = None,
                 token: str | None = None) -> None:
        from huggingface_hub import HfApi, constants

        self.endpoint = endpoint.rstrip("/") if endpoint else None
        self.token = token
        self.api = api if api is not None else HfApi(endpoint=self.endpoint, token=token)
        self.name = self.endpoint or constants.ENDPOINT
        # An injected api (a test stub, a caller's own client) is its own transport: no probe.
        self._probed = api is not None

    @contextlib.contextmanager
    def _call(self) -> Iterator[None]:
        """Around every request: probe the endpoint once (fail fast), keep retry logs quiet."""
        if not self._probed:
            probe(self.name)
            self._probed = True
        with quiet_http():
            yield

    @_hub_call
    def publish(self, model_dir: Path, repo_id: str, message: str, tag: str | None = None) -> str:
        """create_repo + upload_folder (one commit) + optional create_tag; returns the sha."""
        check_repo_id(repo_id)
        if tag is not None:
            check_revision(tag)
        try:
            self.api.create_repo(repo_id, repo_type="model", exist_ok=True)
            info = self.api.upload_folder(
                repo_id=repo_id, folder_path=str(model_dir), repo_type="model",
                commit_message=message,
                # Files removed since the previous publish must not linger in the new revision.
                delete_patterns=["*"],
            )
            sha = info.oid
            if tag is not None:
                self.api.create_tag(repo_id, tag=tag, revision=sha, repo_type="model")
        except HubError:
            raise
        except Exception as e:  # noqa: BLE001 - network/HTTP errors become one line
            raise _hub_error(repo_id, e) from None
        return sha

    @_hub_call
    def resolve(self, repo_id: str, revision: str | None) -> str:
        check_repo_id(repo_id)
        rev = check_revision(revision) if revision else "main"
        try:
            return self.api.model_info(repo_id, revision=rev).sha
        except Exception as e:  # noqa: BLE001
            raise _hub_error(repo_id, e) from None

    @_hub_call
    def listing(self, repo_id: str, sha: str) -> dict[str, Any]:
        """path -> RepoFile of commit ``sha`` (the hashes downloads are checked against)."""
        from huggingface_hub.hf_api import RepoFile

        try:
            items = self.api.list_repo_tree(repo_id, recursive=True, revision=sha,
                                            repo_type="model")
            return {f.path: f for f in items if isinstance(f, RepoFile)}
        except Exception as e:  # noqa: BLE001
            raise _hub_error(repo_id, e) from None

    @_hub_call
    def download_verified(self, repo_id: str, sha: str, dest: Path) -> dict[str, str]:
        """snapshot_download into a scratch dir, then move each listed, verified file to dest."""
        from huggingface_hub import snapshot_download
        from huggingface_hub import utils as hf_utils

        listing = self.listing(repo_id, sha)
        for path in listing:
            check_relative_path(path)
        scratch = Path(tempfile.mkdtemp(prefix=".dl.", dir=dest.parent))
        try:
            # The library never prints: no progress bars on the user's terminal.
            was_disabled = hf_utils.are_progress_bars_disabled()
            hf_utils.disable_progress_bars()
            try:
                snap = Path(snapshot_download(
                    repo_id, revision=sha, local_dir=scratch, endpoint=self.endpoint,
                    token=self.token, repo_type="model",
                ))
            except Exception as e:  # noqa: BLE001
                raise PullRefused(f"download of {repo_id}@{sha[:12]} failed: "
                                  f"{_hub_error(repo_id, e).message}") from None
            finally:
                if not was_disabled:
                    hf_utils.enable_progress_bars()
            hashes = {}
            for path, f in listing.items():
                src = snap / path
                if src.is_symlink() or not src.is_file():
                    raise PullRefused(f"{repo_id}@{sha[:12]}: {path} missing from the download")
                if f.lfs is not None:
                    ok, digest = file_sha256(src) == f.lfs.sha256, f.lfs.sha256
                else:
                    ok, digest = file_git_sha1(src) == f.blob_id, f.blob_id
                if not ok:
                    raise PullRefused(f"{repo_id}@{sha[:12]}: {path} does not match the hub's "
                                      "hash (interrupted or tampered download)")
                target = dest / path
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(src, target)
                hashes[path] = digest
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return hashes

    def same_as_head(self, model_dir: Path, repo_id: str) -> str | None:
        """The head commit of ``repo_id`` when it holds exactly the files of ``model_dir`` (same
        names; LFS files by SHA-256, others by git blob id), else None."""
        try:
            sha = self.resolve(repo_id, None)
            listing = self.listing(repo_id, sha)
        except HubError:
            return None
        root = Path(model_dir).resolve()
        local = {p.relative_to(root).as_posix(): p for p in root.rglob("*") if p.is_file()}
        if set(local) != set(listing):
            return None
        for path, f in listing.items():
            if f.lfs is not None:
                if file_sha256(local[path]) != f.lfs.sha256:
                    return None
            elif file_git_sha1(local[path]) != f.blob_id:
                return None
        return sha

    @_hub_call
    def card_summary(self, repo_id: str, sha: str) -> CardSummary:
        """The card summary of commit ``sha`` from the server's card data (no download)."""
        try:
            info = self.api.model_info(repo_id, revision=sha)
        except Exception as e:  # noqa: BLE001
            raise _hub_error(repo_id, e) from None
        return self._summary(info.card_data)

    @_hub_call
    def repo_ids(self) -> list[str]:
        """The ids of the hub's DP models (what a did-you-mean chooses among)."""
        return [r.repo for r in self.latest()]

    def _summary(self, card_data: Any) -> CardSummary:
        """Card summary from the server's card data; ε is verified by recomputation here,
        because whatever sits in a repo may never have gone through dphub's publish gate."""
        if card_data is None:
            return CardSummary.checked({})
        try:
            meta = card_data.to_dict() if hasattr(card_data, "to_dict") else dict(card_data)
            meta = json.loads(json.dumps(meta, default=str))  # plain JSON types, as parse_card
        except (TypeError, ValueError):
            return CardSummary.checked({})
        return CardSummary.checked(meta)

    @_hub_call
    def revisions(self, repo_id: str) -> list[RepoRevision]:
        """Commits of ``main`` newest first (with tags and card summaries).

        olah's mirror answers the commits API with a payload huggingface_hub cannot parse (its
        authors lack ``user``); then the revisions the refs point at (branch heads, tags) are listed.
        """
        check_repo_id(repo_id)
        try:
            refs = self.api.list_repo_refs(repo_id, repo_type="model")
            tags: dict[str, list[str]] = {}
            for t in refs.tags:
                tags.setdefault(t.target_commit, []).append(t.name)
            try:
                commits = [(c.commit_id, str(c.created_at), c.title)
                           for c in self.api.list_repo_commits(repo_id, repo_type="model")]
            except (KeyError, TypeError, ValueError):
                heads = [b.target_commit for b in refs.branches if b.name == "main"]
                commits = [(sha, None, None) for sha in dict.fromkeys([*heads, *tags])]
            out = []
            for sha, date, title in commits:
                info = self.api.model_info(repo_id, revision=sha)
                out.append(RepoRevision(repo_id, sha, self._summary(info.card_data), date, title,
                                        tuple(tags.get(sha, ()))))
            return out
        except HubError:
            raise
        except Exception as e:  # noqa: BLE001
            raise _hub_error(repo_id, e) from None

    @_hub_call
    def latest(self) -> list[RepoRevision]:
        """Every model tagged ``differential-privacy`` (server-side filter), with its card data."""
        try:
            models = self.api.list_models(filter=DP_TAG, cardData=True)
            return [RepoRevision(m.id, m.sha or "", self._summary(m.card_data)) for m in models]
        except Exception as e:  # noqa: BLE001
            raise _hub_error("(search)", e) from None
