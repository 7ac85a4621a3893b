"""A trainer's client of the feed service (``python launcher.py feed``): iterate a job's ready
groups from a cursor and resume after a restart (docs/feed.md).

    client = FeedClient("http://127.0.0.1:8766")
    for group in client.groups("job-1", cursor_file=CursorFile("runs/trainer.cursor")):
        train_on(group)          # the cursor is saved once the loop asks for the next group

Delivery is at-least-once from the saved cursor: a group whose processing was cut by a crash is
served again. Save the cursor together with the trainer's own state (``after=`` + your checkpoint,
as ``examples/trainer_loop.py`` does) for exactly-once.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from rollout.errors import RolloutError
from rollout.results.feed_schema import FeedGroupOut, GroupPage, JobProgress, Normalize, View
from rollout.results.groups import check_min_valid, check_version_bound


class FeedError(RolloutError, RuntimeError):
    """The feed refused the request (unknown job, bad parameter): the message has its answer."""


class FeedUnavailable(FeedError):
    """The feed service could not be reached for longer than the client's ``unavailable_s``."""


class CursorFile:
    """A cursor kept in a small file (the text of one integer), written atomically (temporary
    file, fsync, rename), so a crash leaves the old or the new value, never a torn one."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def load(self) -> int:
        """The saved cursor, 0 when the file does not exist. ValueError for a file that does not
        hold a cursor."""
        try:
            text = self.path.read_text().strip()
        except FileNotFoundError:
            return 0
        if not text.isdigit():
            raise ValueError(f"{self.path} does not hold a feed cursor (an integer >= 0): {text[:40]!r}")
        return int(text)

    def save(self, cursor: int) -> None:
        """Replace the saved cursor by ``cursor``."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name + ".")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(f"{cursor}\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _error_text(r: httpx.Response) -> str:
    """``code: message`` of an answer in the gateway's error shape, else its first 500 characters."""
    try:
        err = r.json()["error"]
        return f"{err['code']}: {err['message']}"
    except (ValueError, KeyError, TypeError):
        return r.text[:500]


class FeedClient:
    """Synchronous client of a feed service at ``base_url`` (``http://HOST:PORT``). Connection
    failures are retried with backoff (the feed restarting is normal) for up to
    ``unavailable_s`` seconds, then FeedUnavailable; answers other than 200 raise FeedError."""

    def __init__(
        self, base_url: str, *, unavailable_s: float = 60.0, http: httpx.Client | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.unavailable_s = unavailable_s
        self._http = http or httpx.Client(timeout=httpx.Timeout(10.0, read=90.0))
        self._own = http is None

    def close(self) -> None:
        """Close the HTTP client (when this object made it)."""
        if self._own:
            self._http.close()

    def __enter__(self) -> FeedClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _get(self, path: str, params: dict[str, Any]) -> Any:
        delay, t0 = 0.2, time.monotonic()
        while True:
            try:
                r = self._http.get(
                    self.base_url + path, params={k: v for k, v in params.items() if v is not None}
                )
            except httpx.TransportError as e:
                if time.monotonic() - t0 > self.unavailable_s:
                    raise FeedUnavailable(
                        f"the feed at {self.base_url} is unreachable: {type(e).__name__}: {e}"
                    ) from e
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            if r.status_code != 200:
                raise FeedError(f"GET {path}: HTTP {r.status_code} {_error_text(r)}")
            return r.json()

    def progress(self, job_id: str) -> JobProgress:
        """The job's sessions and groups, total, finished and ready."""
        return JobProgress.model_validate(self._get(f"/v1/jobs/{job_id}", {}))

    def page(
        self,
        job_id: str,
        after: int = 0,
        *,
        limit: int = 50,
        wait_s: float = 0.0,
        min_valid: int | None = None,
        normalize: Normalize = "std",
        view: View = "full",
        max_policy_lag: int | None = None,
        policy_version: int | None = None,
    ) -> GroupPage:
        """One page of ready groups after ``after``; with ``wait_s`` > 0 the feed holds the request
        until a group is ready, the job is done, or ``wait_s`` seconds passed (at most 60).
        ``max_policy_lag`` (versions) flags a group ``stale`` (not trainable) whose oldest step is
        more than that many versions behind ``policy_version`` (default: the newest version
        stamped in the job), or whose lag is unknown. ValueError for a ``min_valid`` below 1 (a
        trainable group needs a valid sample) or a negative lag or version."""
        check_version_bound("max_policy_lag", max_policy_lag)
        check_version_bound("policy_version", policy_version)
        if min_valid is not None:
            check_min_valid(min_valid)
        return GroupPage.model_validate(
            self._get(
                f"/v1/jobs/{job_id}/groups",
                {
                    "after": after,
                    "limit": limit,
                    "wait": wait_s,
                    "min_valid": min_valid,
                    "normalize": normalize,
                    "view": view,
                    "max_policy_lag": max_policy_lag,
                    "policy_version": policy_version,
                },
            )
        )

    def groups(
        self,
        job_id: str,
        *,
        after: int | None = None,
        cursor_file: CursorFile | None = None,
        wait_s: float = 30.0,
        limit: int = 50,
        stop_when_done: bool = True,
        only_trainable: bool = False,
        min_valid: int | None = None,
        normalize: Normalize = "std",
        view: View = "full",
        max_policy_lag: int | None = None,
        policy_version: int | None = None,
    ) -> Iterator[FeedGroupOut]:
        """Iterate ready groups in ready order from ``after`` (default: the cursor in
        ``cursor_file``, else 0). With ``cursor_file``, each group's cursor is saved when the loop
        asks for the next one (so a crash while processing a group serves it again). Stops when
        the job is done and every ready group was given (``stop_when_done``), else waits for
        more for ever. ``only_trainable`` skips groups flagged untrainable, stale ones included
        (their cursor still advances). ``max_policy_lag``/``policy_version``: as :meth:`page`."""
        cursor = after if after is not None else (cursor_file.load() if cursor_file else 0)
        while True:
            page = self.page(
                job_id,
                cursor,
                limit=limit,
                wait_s=wait_s,
                min_valid=min_valid,
                normalize=normalize,
                view=view,
                max_policy_lag=max_policy_lag,
                policy_version=policy_version,
            )
            for g in page.groups:
                if g.trainable or not only_trainable:
                    yield g
                cursor = g.cursor if g.cursor is not None else cursor
                if cursor_file is not None:
                    cursor_file.save(cursor)
            if not page.groups and page.progress.done and stop_when_done:
                return
