"""The versions of one served model: which are loaded, which were rejected, and why.

Mirrors TF Serving's availability-preserving swap: a new version is loaded
and warmed up (`load_servable`) before the old one is unloaded, so a swap
never leaves a gap, and a version that fails to load or warm up is rejected
while the old one keeps serving. Where the real server's `latest` policy
serves nothing because the newest version fails (after a restart), this one
serves the newest version that loads. As the real server holds a version
until the last request that resolved it ends (its `ServableHandle`s), an
unloaded version's memory is returned (`release_memory`) once its requests
in flight have ended: a request still running on it would keep the old
index alive past the collection, in reference cycles that nothing collects
until much later (the server's RSS was that of two versions after a swap
under load). Every load, rejection, swap and unload is
logged on the `static_keras.serving` logger.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time

from static_keras.serving.config import ServedModel
from static_keras.serving.servable import Servable
from static_keras.serving.servable import load_servable
from static_keras.serving.servable import release_memory
from static_keras.serving.status import ServingFailure
from static_keras.serving.versions import list_versions

logger = logging.getLogger("static_keras.serving")

#: How long an unload waits for the requests still running on the old version.
DRAIN_SECONDS = 60.0


class VersionManager:
    """Loads, serves and unloads the versions of one model.

    Without specific versions in the config (TF Serving's `latest` policy)
    it serves the newest version that loads: a newer version that fails
    leaves the current one serving, and on start, with nothing served yet,
    it falls back to the next newest, and so on (TF Serving itself serves
    nothing then; `publish` moves such versions out of the way). A version
    that failed is tried again only when its directory changes.
    """

    def __init__(self, config: ServedModel, xla_enabled: bool):
        self.config = config
        self.xla_enabled = xla_enabled
        self._lock = threading.Lock()
        self._drained = threading.Condition(self._lock)  # a request ended
        self._in_flight: dict[int, int] = {}  # id(servable) -> requests running on it
        self._served: dict[int, Servable] = {}
        self._status: dict[int, tuple[str, str]] = {}  # version -> (state, error)
        self._failed: dict[int, float] = {}  # version -> mtime of the failed dir

    def poll(self) -> None:
        """Loads wanted versions that are new on disk, then unloads the others."""
        present = list_versions(self.config.base_path)
        if self.config.versions is None:
            wanted = self._newest_loadable(present)
        else:
            wanted = [v for v in self.config.versions if v in present]
            for version in wanted:
                self._load(version)
        # Unload only after a wanted version is up: a rejected new version
        # leaves the old one serving.
        if any(v in self._served for v in wanted):
            self._unload([v for v in sorted(self._served) if v not in wanted])

    def _newest_loadable(self, present: list[int]) -> list[int]:
        """`[the newest version that is served or loads]`, trying from the newest down
        and stopping at the one already served; `[]` when none loads."""
        rejected = []
        for version in reversed(present):
            if version in self._served:
                return [version]
            if self._load(version):
                if rejected:
                    logger.warning(
                        "model %s: serving version %d, not the newest: versions %s were rejected",
                        self.config.name, version, sorted(rejected),
                    )  # fmt: skip
                return [version]
            rejected.append(version)
        return []

    def _load(self, version: int) -> bool:
        """Whether `version` is served after loading it (if it is not yet)."""
        if version in self._served:
            return True
        name = self.config.name
        path = os.path.join(self.config.base_path, str(version))
        try:
            mtime = os.path.getmtime(path)
        except OSError:  # removed or moved out since it was listed
            return False
        if self._failed.get(version) == mtime:
            return False  # already rejected; retried only if the dir changes
        self._set_status(version, "LOADING", "")
        start = time.perf_counter()
        servable, message = None, ""
        try:
            servable = load_servable(path, version, xla_enabled=self.xla_enabled)
        except Exception as error:  # any load or warmup failure rejects the version
            message = f"{type(error).__name__}: {error}".strip()
        if servable is None:
            self._failed[version] = mtime
            release_memory()  # what the failed load left (its traceback is gone now)
            self._set_status(version, "END", message)
            logger.warning("model %s version %d rejected: %s", name, version, message)
            return False
        with self._lock:
            self._served[version] = servable
        self._set_status(version, "AVAILABLE", "")
        logger.info(
            "model %s version %d loaded and warmed up in %.1f s: available",
            name, version, time.perf_counter() - start,
        )  # fmt: skip
        return True

    def _unload(self, versions: list[int]) -> None:
        """Drops every reference to `versions`, waits for their requests in
        flight, then returns their memory."""
        if not versions:
            return
        unloaded = []
        for version in versions:
            self._set_status(version, "UNLOADING", "")
            with self._lock:
                unloaded.append(self._served.pop(version))

        def running() -> list[int]:
            return [servable.version for servable in unloaded if self._in_flight.get(id(servable))]

        with self._lock:
            if not self._drained.wait_for(lambda: not running(), timeout=DRAIN_SECONDS):
                logger.warning(
                    "model %s: requests still running on versions %s after %.0f s; their "
                    "memory is returned when they end", self.config.name, running(), DRAIN_SECONDS,
                )  # fmt: skip
        still_running = running()
        for servable in unloaded:
            if servable.version not in still_running:
                servable.close()  # its session: graph, variables, instantiated functions
        unloaded.clear()  # the last references (a session still running closes when collected)
        release_memory()
        for version in versions:
            self._set_status(version, "END", "")
            logger.info(
                "model %s version %d unloaded (now serving %s)",
                self.config.name, version, sorted(self._served),
            )  # fmt: skip

    def _set_status(self, version: int, state: str, error: str) -> None:
        with self._lock:
            self._status[version] = (state, error)

    @contextlib.contextmanager
    def serving(self, version: int | None, label: str | None):
        """The servable a request for `version` or `label` (or the latest)
        runs on, held until the request ends (an unload waits for it)."""
        with self._lock:
            servable = self._resolve(dict(self._served), version, label)
            self._in_flight[id(servable)] = self._in_flight.get(id(servable), 0) + 1
        try:
            yield servable
        finally:
            with self._lock:
                left = self._in_flight.pop(id(servable)) - 1
                if left:
                    self._in_flight[id(servable)] = left
                self._drained.notify_all()

    def resolve(self, version: int | None, label: str | None) -> Servable:
        """The servable a request for `version` or `label` (or the latest)
        gets now (a request runs on it inside `serving`)."""
        with self._lock:
            served = dict(self._served)
        return self._resolve(served, version, label)

    def _resolve(self, served: dict, version: int | None, label: str | None) -> Servable:
        name = self.config.name
        if label is not None:
            if label not in self.config.labels:
                raise ServingFailure(
                    "NOT_FOUND", f"Unrecognized servable version label: {label} (model {name!r})"
                )
            version = self.config.labels[label]
        if version is not None:
            if version not in served:
                raise ServingFailure(
                    "NOT_FOUND", f"Servable not found for request: Specific({name}, {version})"
                )
            return served[version]
        if not served:
            raise ServingFailure("UNAVAILABLE", f"Servable not found for request: Latest({name})")
        return served[max(served)]

    def status(self, version: int | None, label: str | None) -> list[tuple[int, str, str]]:
        """`[(version, state, error)]`, as GetModelStatus reports them."""
        with self._lock:
            status = dict(self._status)
        if label is not None:
            if label not in self.config.labels:
                raise ServingFailure("NOT_FOUND", f"Unrecognized version label: {label}")
            version = self.config.labels[label]
        if version is not None:
            if version not in status:
                raise ServingFailure(
                    "NOT_FOUND", f"Could not find version {version} of model {self.config.name}"
                )
            return [(version, *status[version])]
        return [(v, *status[v]) for v in sorted(status)]
