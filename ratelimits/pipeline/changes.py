"""What an operator changes reaches every process at once: published, and heard.

**Published.** A policy change (an edit, a mode switch, an override, an import) bumps
the store's policy version once it commits (`publish`); an operator's reset of a client
writes the policy's reset key (`announce_reset`; on PostgreSQL, a `NOTIFY`). The write
is the message, or sends it in its own transaction: no second command that could fail
after it.

**Heard.** Each process serving requests keeps one connection that the store tells of
those writes (`engine.interfaces.Watch`): Redis, and of a flush too, by client-side
caching's invalidation messages (pub/sub in RESP2); PostgreSQL by the `NOTIFY` that the
write's own transaction sends, on a session that `LISTEN`s. A daemon thread of that
process reads it (`Listener`). On a message the thread drops the refusals the process
remembers and marks the policy snapshot stale, so the next request works from the new
policies: tens of milliseconds after the change commits. While a message has come and
is not yet acted on, remembered refusals are not trusted (`Listener.unheard`), so a
request never answers from them across a change it could have known of.

The thread starts with the first snapshot a process builds (its first request), never at
import, and connects once the store has answered the process (a store out of reach is
the circuit breaker's to try); a process forked after that (gunicorn's workers from a
master that served or warmed up) starts its own (the pid is checked). When the store
goes away the thread connects again with backoff, and acts on whatever may have changed
meanwhile once back. Until it listens, and where no watch is possible (Redis before 6,
a proxy refusing `CLIENT TRACKING`, the in-process engine), changes arrive as before:
each process reads the version at most once a second (`resolver.VERSION_EVERY`) and
trusts a remembered refusal at most `local_first.HOLD`.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import redis
from django.core.signals import setting_changed
from django.dispatch import receiver

from ratelimits import runtime
from ratelimits.engine.interfaces import Watch
from ratelimits.engine.local_first import LocalFirst
from ratelimits.engine.watch import FLUSHED, POLICIES, RESET, Change
from ratelimits.pipeline.engines import get_engine

logger = logging.getLogger("ratelimits")

__all__ = ["Listener", "Publication", "announce_reset", "listener", "publish"]

#: A quiet connection is asked for a sign of life after this many seconds, and given up
#: (then opened again) when none comes within as many more.
PING_EVERY = 5.0
#: After a failure to connect the thread waits this long, doubled each time up to
#: `BACKOFF_MOST`.
BACKOFF_FIRST = 0.1
BACKOFF_MOST = 5.0
#: Until the store answers the process once, the thread looks this often whether it was
#: stopped meanwhile.
FIRST_ANSWER_POLL = 0.5


@dataclass
class Publication:
    """What became of one policy change's publication: `done` once it was tried (at the
    commit of the transaction that saved the change; at once outside one), with the
    policy version it was published as, or the `error` that kept the store from taking
    it (then other processes learn of the change when the store answers again and they
    read the version, or within `resolver.DB_CHECK_EVERY` from the database)."""

    done: bool = False
    version: int | None = None
    error: str = ""

    @property
    def published(self) -> bool:
        """Whether every process is told: tried, and taken by the store."""
        return self.done and not self.error


class Listener:
    """This process's thread hearing the store's changes (one per process; see the
    module's docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.pid: int | None = None
        self.engine: Any = None
        self.stopping = threading.Event()
        #: The watch while it is connected.
        self.watch: Watch | None = None
        #: A message was read and is being acted on.
        self.reading = False
        #: What a change of the policies does (the resolver's `heard`): given the
        #: version read after it (None: it could not be read).
        self.on_policies: Callable[[int | None], None] = _nothing
        #: The last publication of this process, failed or not (`publish`).
        self.last: Publication | None = None

    def ensure(self) -> None:
        """Listen in this process, if the engine's store can tell and no thread of this
        process listens to it yet. Never raises; returns at once."""
        try:
            engine = get_engine()
        except Exception:  # no engine yet: the request path says why
            return
        if self.pid == os.getpid() and self.engine is engine:
            return
        with self._lock:
            if self.pid == os.getpid() and self.engine is engine:
                return
            self._stop()
            self.pid, self.engine = os.getpid(), engine
            if not isinstance(engine, LocalFirst):
                return  # the in-process engine: a change is seen at once, in process
            self.stopping = stopping = threading.Event()
            engine.unheard = self.unheard
            threading.Thread(target=self._run, args=(engine, stopping), daemon=True,
                             name="ratelimits-changes").start()

    def unheard(self) -> bool:
        """Whether a change may have come that this process has not acted on yet."""
        if self.reading:
            return True
        watch = self.watch
        return watch is not None and watch.pending()

    def forked(self) -> None:
        """In a process just forked: a lock another thread held stays held in the child;
        the parent's thread did not come along (`ensure` sees the pid)."""
        self._lock = threading.Lock()
        self.reading = False
        self.watch = None  # the parent's connection: never read, nor closed, here

    def stop(self) -> None:
        """Stop listening (the thread ends by itself); the next `ensure()` starts again."""
        with self._lock:
            self._stop()

    def _stop(self) -> None:
        self.stopping.set()
        watch, self.watch = self.watch, None
        # a connection inherited from the parent of a fork is the parent's: not closed
        if watch is not None and self.pid == os.getpid():
            watch.close()
        self.pid = self.engine = None
        self.reading = False

    # -- the thread ---------------------------------------------------------------------

    def _run(self, engine: LocalFirst, stopping: threading.Event) -> None:
        # not before the store has answered this process once: a store out of reach is
        # left to the circuit breaker, not called once more by this thread
        while not engine.denied.answered.wait(FIRST_ANSWER_POLL):
            if stopping.is_set():
                return
        delay, lost = BACKOFF_FIRST, False
        while not stopping.is_set():
            watch = self._open(engine, stopping, lost)
            if watch is None:
                return
            if watch is False:
                lost = True
                stopping.wait(delay)
                delay = min(delay * 2, BACKOFF_MOST)
                continue
            if lost:
                logger.info("ratelimits: hearing changes from the store again")
                # what changed while nobody listened
                self._act(engine, [Change(POLICIES)], stopping)
            delay, lost = BACKOFF_FIRST, False
            try:
                self._listen(engine, watch, stopping)
            except Exception as exc:
                if not stopping.is_set():
                    logger.info("ratelimits: lost the connection that hears changes (%s: "
                                "%s); connecting again", type(exc).__name__, exc)
                    lost = True
            finally:
                with self._lock:
                    if self.watch is watch:
                        self.watch = None
                watch.close()

    def _open(self, engine: LocalFirst, stopping: threading.Event,
              lost: bool) -> Watch | Literal[False] | None:
        """The watch, connected and installed; False when it could not connect (to try
        again); None when there is nothing to hear, or this thread was stopped."""
        watch = None
        try:
            watch = engine.watch()
            if watch is None:
                return None
            watch.open()
        except redis.ResponseError as exc:  # no CLIENT TRACKING here: nothing to hear
            logger.info("ratelimits: the store cannot push changes (%s); each process "
                        "reads the policy version once a second instead", exc)
            if watch is not None:
                watch.close()
            return None
        except Exception as exc:  # meanwhile, remembered refusals are trusted for HOLD
            if watch is not None:
                watch.close()
            if not lost:
                logger.info("ratelimits: cannot hear changes from the store (%s: %s); "
                            "trying again, and reading the policy version once a "
                            "second meanwhile", type(exc).__name__, exc)
            return False
        with self._lock:
            if stopping.is_set():
                watch.close()
                return None
            self.watch = watch
        return watch

    def _listen(self, engine: LocalFirst, watch: Watch,
                stopping: threading.Event) -> None:
        asked = False
        while not stopping.is_set():
            if watch.wait(PING_EVERY):
                self._reading(stopping, True)
                try:
                    self._act(engine, watch.read(), stopping)
                finally:
                    self._reading(stopping, False)
                asked = False
            elif asked:
                raise ConnectionError(f"the store did not answer within {PING_EVERY:g} s")
            else:
                watch.ping()
                asked = True

    def _reading(self, stopping: threading.Event, value: bool) -> None:
        """Set `reading`, unless this thread was stopped (another may be starting)."""
        if not stopping.is_set():
            self.reading = value

    def _act(self, engine: LocalFirst, changes: list[Change],
             stopping: threading.Event) -> None:
        """Drop what the changes void: the remembered refusals (all, or a policy's),
        and the snapshot when the policies (or everything) changed."""
        if not changes or stopping.is_set():
            return
        kinds = {change.kind for change in changes}
        if kinds & {POLICIES, FLUSHED}:
            engine.forget_remembered()
            try:
                version: int | None = engine.read_version()
            except Exception:  # the next request's reply tells
                version = None
            if not stopping.is_set():
                self.on_policies(version)
        elif RESET in kinds:
            for change in changes:
                engine.forget_remembered(change.name)


def _nothing(version: int | None) -> None:
    return None


listener = Listener()
runtime.on_reset(listener.stop)
os.register_at_fork(after_in_child=listener.forked)


@receiver(setting_changed, dispatch_uid="ratelimits.changes.settings")
def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in ("CACHES", "RATELIMITS"):
        listener.stop()  # another store, perhaps: the next snapshot listens to it


def publish(into: Publication | None = None) -> Publication:
    """Tell every process that the policies changed: the store's version bumped, what
    this process remembers dropped at once. Never raises: a failure is logged and
    returned (`Publication.error`). Filled into `into` when given."""
    done = into if into is not None else Publication()
    done.done = True
    try:
        engine = get_engine()
        done.version = engine.bump_version()
    except Exception as exc:
        done.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        logger.error("ratelimits: could not publish the policy change (%s); other "
                     "processes pick it up when the store answers again", done.error)
    else:
        if isinstance(engine, LocalFirst):
            engine.forget_remembered()
    listener.last = done
    return done


def announce_reset(name: str) -> None:
    """Tell every process that clients of policy `name` were reset in the store, so none
    answers them from a refusal it remembers. Raises what the store raises."""
    engine = get_engine()
    if isinstance(engine, LocalFirst):
        engine.forget_remembered(name)
        engine.announce_reset(name)
