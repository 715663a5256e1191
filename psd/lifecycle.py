"""What a daemon tells its service manager, and how it reloads its log level.

Under systemd (``Type=notify``, see ``deploy/psd@.service``) the daemon says:

- ``STATUS=loading snapshot ...`` before it serves;
- ``READY=1`` once its TCP listener, shm listener and replicator run, so a
  request sent after READY is answered (with replicas, the daemon may still
  be catching up: ``STATUS=catching up from replicas`` until it has, then
  ``STATUS=serving on ADDRESS``; requests for its shards meanwhile go to
  the other replicas);
- ``STATUS=...; snapshotting`` while a periodic snapshot is written;
- ``WATCHDOG=1`` every half ``$WATCHDOG_USEC``, from a task in the event loop;
- ``STOPPING=1`` on SIGTERM or SIGINT, while the final snapshot is written.

SIGHUP re-reads the log level (``RELOADING=1``, then ``READY=1`` again):
``psd --log-level`` when given, else the config file's ``log_level`` key,
else INFO. Without ``$NOTIFY_SOCKET`` only the reload does anything.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

import trio

from irdma.cluster import ClusterConfig, Node, load_config
from irdma.errors import ConfigError
from irdma.sdnotify import Notifier, NotifyError, keep_alive, watchdog_interval

log = logging.getLogger("psd")

DEFAULT_LOG_LEVEL = "INFO"
# How often the status line is brought up to date with the replication state.
STATE_POLL = 0.5


def log_level_for(cli_level: str | None, config: ClusterConfig) -> str:
    """The level in force: ``--log-level``, else the config's ``log_level``, else INFO."""
    return (cli_level or config.log_level or DEFAULT_LOG_LEVEL).upper()


class Lifecycle:
    """One daemon's state as its service manager sees it (all no-ops without a manager)."""

    def __init__(
        self,
        node: Node,
        config: ClusterConfig,
        *,
        cli_log_level: str | None = None,
        notifier: Notifier | None = None,
        set_level: Callable[[str], None] | None = None,
    ) -> None:
        self.node = node
        self.config = config
        self.cli_log_level = cli_log_level
        self.notifier = notifier if notifier is not None else Notifier.from_environ()
        self._set_level = set_level or (lambda level: logging.getLogger().setLevel(level))
        self.ready_sent = False
        self.serving = False  # False while catching up from replicas
        self._activity: str | None = None

    # -- status ----------------------------------------------------------------

    def describe(self) -> str:
        """The current status line."""
        if not self.ready_sent:
            state = "starting"
        elif self.serving:
            state = f"serving on {self.node.address}"
        else:
            state = "catching up from replicas"
        return f"{state}; {self._activity}" if self._activity else state

    def loading(self) -> None:
        """Before the event loop: the last snapshot is being read."""
        self.notifier.status(f"loading snapshot from {self.node.data_dir}")

    def started(self, serving: bool) -> None:
        """Listeners and replicator run: READY=1 (``serving``: caught up already)."""
        self.ready_sent = True
        self.serving = serving
        self.notifier.ready(self.describe())

    def set_serving(self, serving: bool) -> None:
        if serving != self.serving:
            self.serving = serving
            self.notifier.status(self.describe())

    @contextlib.contextmanager
    def activity(self, what: str) -> Iterator[None]:
        """Show ``what`` in the status line while the block runs."""
        self._activity = what
        self.notifier.status(self.describe())
        try:
            yield
        finally:
            self._activity = None
            self.notifier.status(self.describe())

    def stopping(self) -> None:
        self.notifier.stopping("stopping: writing the final snapshot")

    async def follow(self, is_serving: Callable[[], bool]) -> None:
        """Keep the status line in step with ``is_serving()`` (membership), until cancelled."""
        while True:
            self.set_serving(is_serving())
            await trio.sleep(STATE_POLL)

    async def watchdog(self) -> None:
        """WATCHDOG=1 pings from this event loop while the manager asks for them."""
        try:
            interval = watchdog_interval()
        except NotifyError as exc:
            log.warning("%s: %s; sending no watchdog pings", self.node.name, exc)
            return
        if interval is not None and self.notifier.enabled:
            log.info("%s: watchdog pings every %.3g s", self.node.name, interval / 2)
        await keep_alive(self.notifier, interval)

    # -- SIGHUP ------------------------------------------------------------------

    def reload(self) -> None:
        """Apply the log level again (``--log-level``, else the config file's ``log_level``).

        A config file that no longer loads is reported and the level kept.
        Other keys are not applied: they need a restart.
        """
        self.notifier.reloading("reloading the log level")
        try:
            if self.cli_log_level:
                level = self.cli_log_level.upper()
                log.info(
                    "%s: SIGHUP: log level stays %s (set by --log-level)", self.node.name, level
                )
            else:
                try:
                    fresh = load_config(self.config.path)
                except ConfigError as exc:
                    log.error("%s: SIGHUP: %s; log level unchanged", self.node.name, exc)
                    return
                level = log_level_for(None, fresh)
                self._set_level(level)
                # Said at a level the new setting lets through, so it is always seen.
                shown = max(logging.INFO, logging.getLevelName(level))
                log.log(
                    shown, "%s: SIGHUP: log level %s (from %s)", self.node.name, level, fresh.path
                )
        finally:
            self.notifier.ready(self.describe())

    def close(self) -> None:
        self.notifier.close()
