"""The status route over HTTP: a Flask app factory, and the same routes as a blueprint.

Routes (``docs/http.md`` shows an answer of each):

- ``GET /v2/generate/text/status/<id>``, ``GET /v2/generate/status/<id>``,
  ``GET /v2/generate/check/<id>``: the AI Horde's paths and shapes;
- ``GET /vecsched/v1/status/<id>``: vecsched's own view, with its extras;
- ``POST /vecsched/v1/prospective``: eligibility, ``ahead_wait`` and allowance
  of a request not yet created;
- ``GET /vecsched/v1/health``: whether the published cycle is fresh.

Inside the horde's own Flask app::

    app.register_blueprint(status_blueprint(StatusService.from_environment()), url_prefix="/api")

Ids are data: they go to the store and the database as bound values, never
into a key pattern or query text, and are never logged.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Callable

from flask import Blueprint, Flask, Response, request
from sqlalchemy.exc import SQLAlchemyError
from werkzeug.exceptions import HTTPException
from werkzeug.routing import PathConverter

from vecsched.service.http.answers import (
    Answer,
    ended_answer,
    error,
    holds_figures,
    horde_answer,
    horde_id,
    is_stale,
    not_found,
    stale_answer,
    unavailable_answer,
    usable_id,
)
from vecsched.service.progress import DatabaseProgress, RequestProgress
from vecsched.service.read import ForecastPublication
from vecsched.service.store.base import Store
from vecsched.snapshot.snapshot import SnapshotError
from vecsched.snapshot.times import iso as _iso

log = logging.getLogger("vecsched.http")

_READ_ATTEMPTS = 3


@dataclass(frozen=True)
class StatusService:
    """What the routes read: the publication store and the horde database's live progress.

    Parameters
    ----------
    store : Store
        Where the job publishes cycles.
    progress : DatabaseProgress or None
        The database's progress and kudos; None serves the cycle's alone.
    live_progress : bool, default False
        Read the database on every horde-path poll. By default it is read only
        for a request the cycle does not hold (newer than the cycle, or ended):
        a request the cycle holds answers from the cycle alone, its progress and
        kudos as of the cycle (at most one refresh interval old, like its wait),
        which is one store read per poll and no query.
    max_age : float or None
        Seconds after which figures are stale; default three refresh intervals.
    clock : callable
        Epoch seconds now.
    publish : ForecastPublication or None
        ``--publish-forecast NAME``: while that estimator's promotion verdict is
        approved, the horde paths' ``wait_time`` is its completion p50 and
        vecsched's path shows it with the ADR wait beside it; None (default),
        or not approved: the answers are unchanged.

    Examples
    --------
    >>> from vecsched.service.store.sql import SQLStore
    >>> service = StatusService(store=SQLStore("sqlite://"))
    >>> service.horde("text_status", "r1").status
    503
    """

    store: Store
    progress: DatabaseProgress | None = None
    live_progress: bool = False
    max_age: float | None = None
    clock: Callable[[], float] = time.time
    publish: ForecastPublication | None = None

    @classmethod
    def from_environment(
        cls, *, database_url: str | None = None, redis_url: str | None = None, prefix: str | None = None,
        max_age: float | None = None, live_progress: bool = False, publish_forecast: str | None = None,
    ) -> "StatusService":
        """The job's own configuration (``VECSCHED_DATABASE_URL``, ``REDIS_URL``, ``VECSCHED_REDIS_PREFIX``).

        Returns
        -------
        StatusService
        """
        from vecsched.service.config import default_database_url, open_store

        url = database_url or default_database_url()
        store = open_store(redis_url=redis_url, database_url=url, prefix=prefix)
        publish = None if not publish_forecast else ForecastPublication.for_store(publish_forecast, store)
        return cls(store=store, progress=DatabaseProgress(url), max_age=max_age, live_progress=live_progress,
                   publish=publish)

    def _row(self, request_id: str) -> RequestProgress | None:
        return None if self.progress is None else self.progress.read(request_id)

    def horde(self, shape: str, request_id: str) -> Answer:
        """The answer of a horde path (``shape``: a key of :data:`answers.SHAPES`).

        The id is read as the horde reads it (:func:`answers.horde_id`). Under a
        stale cycle a request the database says has ended is still answered
        (done, or faulted); one that waits gets 503 ``EstimatesStale``.

        Returns
        -------
        Answer
        """
        if not usable_id(request_id):
            return not_found()
        request_id = horde_id(request_id)
        for _ in range(_READ_ATTEMPTS):
            reading = self.store.read_status(request_id)
            if is_stale(reading, self.clock(), self.max_age):
                ended = self._ended_while_stale(shape, request_id)
                return stale_answer(reading) if ended is None else ended
            needs_row = self.live_progress or not holds_figures(reading)
            answer = horde_answer(
                shape=shape, reading=reading, row=self._row(request_id) if needs_row else None,
                read_totals=self.store.read_meta,
            )
            if answer.status != 409:
                return self._with_forecast(answer, request_id, reading)
        # Cycles switched under every attempt: the job publishes faster than we read.
        return error(503, "EstimatesStale", "The estimates are being republished; retry.", {"Retry-After": "1"})

    def _ended_while_stale(self, shape: str, request_id: str) -> Answer | None:
        """The job has stopped publishing: what has ended is still told from the database.

        A database that cannot answer either leaves the stale cycle's 503 (retry
        later), not a failure: it was not needed for that answer before.
        """
        try:
            row = self._row(request_id)
        except SQLAlchemyError as exc:
            log.warning("status route: no progress for a poll under a stale cycle: %s", type(exc).__name__)
            return None
        return ended_answer(shape=shape, row=row)

    def _with_forecast(self, answer: Answer, request_id: str, reading: Any) -> Answer:
        """A held, waiting request's answer with the approved forecast's completion p50 as ``wait_time``."""
        body = answer.body
        if (self.publish is None or answer.status != 200 or not holds_figures(reading)
                or body.get("done") or body.get("faulted")):
            return answer
        forecast = self.publish.forecast(request_id, self.clock())
        if forecast is None or forecast["completion_p50"] is None:
            return answer
        headers = dict(answer.headers, **{"X-Vecsched-Wait": forecast["estimator"]})
        return Answer(answer.status, dict(body, wait_time=int(round(forecast["completion_p50"]))), headers)

    def own(self, request_id: str) -> Answer:
        """vecsched's view: :func:`vecsched.status` with the database's live progress and ``kudos``.

        Returns
        -------
        Answer
        """
        from vecsched.service.read import status

        if not usable_id(request_id):
            return not_found()
        row = self._row(request_id)
        progress = None
        if row is not None:
            progress = {
                "waiting": row.waiting, "processing": row.processing, "finished": row.finished,
                # vecsched.status's done is finished alone (faulted is its own flag), as for a request
                # the cycle saw end; the horde paths say done for a faulted one too, as the horde does.
                "restarted": row.restarted, "faulted": row.faulted, "done": row.finished_ok,
            }
        body = status(request_id, store=self.store, progress=progress, max_age=self.max_age, now=self.clock(),
                      publish=self.publish)
        if body.get("unknown") and row is None:
            return not_found()
        if row is not None:
            body["kudos"] = float(row.kudos)
            body["gentype"] = row.gentype
        return Answer(200, body)

    def prospective(self, payload: Any) -> Answer:
        """The allowance answer of :func:`vecsched.prospective` for a JSON object.

        Returns
        -------
        Answer
        """
        from vecsched.service.read import prospective

        if not isinstance(payload, dict):
            return error(400, "BadRequest", "The body must be a JSON object of snapshot request keys.")
        try:
            body = prospective(payload, store=self.store, max_age=self.max_age, now=self.clock())
        except SnapshotError as exc:  # names the key and what it must be; never an id
            return error(400, "BadRequest", f"Bad {exc}.")
        except (KeyError, TypeError, ValueError) as exc:
            return error(400, "BadRequest", f"Bad prospective request: {type(exc).__name__}.")
        return Answer(200, body)

    def health(self) -> Answer:
        """200 when the published cycle is fresh, else 503 (for load balancers and alerts).

        Returns
        -------
        Answer
        """
        now = self.clock()
        reading = self.store.read_current()
        if reading is None:
            return Answer(503, {"fresh": False, "cycle_time": None, "age": None}, {"Retry-After": "5"})
        fresh = not is_stale(reading, now, self.max_age)
        body = {"fresh": fresh, "cycle_time": _iso(reading.time), "age": round(now - reading.time, 3),
                "interval": reading.interval}
        if fresh:
            return Answer(200, body)
        return Answer(503, body, {"Retry-After": str(max(1, round(reading.interval)))})


HORDE_PATHS: dict[str, str] = {
    # path prefix (the id follows) -> answers.SHAPES key
    "/v2/generate/text/status/": "text_status",
    "/v2/generate/status/": "image_status",
    "/v2/generate/check/": "image_check",
}


class _IdConverter(PathConverter):
    """Any non-empty id, newlines and slashes included: ids are data, the route decides."""

    regex = "(?s:.+)"


def _respond(answer: Answer) -> Response:
    return Response(json.dumps(answer.body), status=answer.status, headers=answer.headers,
                    mimetype="application/json")


def status_blueprint(service: StatusService, *, name: str = "vecsched") -> Blueprint:
    """The routes over ``service``, to register in any Flask app.

    Parameters
    ----------
    service : StatusService
    name : str
        The blueprint's name (unique per app).

    Returns
    -------
    Blueprint

    Examples
    --------
    >>> from vecsched.service.store.sql import SQLStore
    >>> app = Flask("horde")
    >>> app.register_blueprint(status_blueprint(StatusService(store=SQLStore("sqlite://"))), url_prefix="/api")
    >>> app.test_client().get("/api/vecsched/v1/health").status_code
    503
    """
    bp = Blueprint(name, __name__)
    # Recorded first, so the app knows the converter before the rules below.
    bp.record_once(lambda state: state.app.url_map.converters.setdefault("request_id", _IdConverter))

    def horde_route(shape: str) -> Callable[[str], Response]:
        def view(request_id: str) -> Response:
            return _respond(service.horde(shape, request_id))

        view.__name__ = shape
        return view

    for prefix, shape in HORDE_PATHS.items():
        bp.add_url_rule(f"{prefix}<request_id:request_id>", view_func=horde_route(shape))
    bp.add_url_rule("/vecsched/v1/status/<request_id:request_id>", "own_status",
                    lambda request_id: _respond(service.own(request_id)))
    bp.add_url_rule("/vecsched/v1/prospective", "prospective",
                    lambda: _respond(service.prospective(_json_body())), methods=["POST"])
    bp.add_url_rule("/vecsched/v1/health", "health", lambda: _respond(service.health()))
    bp.register_error_handler(Exception, _on_error)
    return bp


MAX_BODY_BYTES = 64 * 1024
"""The largest prospective body read (a request's keys fit in a few hundred bytes); larger is 413."""


def _json_body() -> Any:
    """The request's JSON body, or None when it is not JSON (too deep to parse included: a 400, not a failure)."""
    request.max_content_length = MAX_BODY_BYTES  # werkzeug answers 413 before reading more
    try:
        return request.get_json(silent=True)
    except RecursionError:
        return None


def _on_error(exc: Exception) -> Response:
    """Errors as the horde's JSON body; the path (which holds the id) is never logged."""
    if isinstance(exc, HTTPException):
        code = exc.code or 500
        return _respond(error(code, "NotFound" if code == 404 else "BadRequest", exc.name))
    return _respond(_failed(exc))


def _failed(exc: Exception) -> Answer:
    """The failure answer, logged by exception type only: the id is never logged.

    Redis refusing or not answering is an outage, not a fault of the service:
    503 with ``Retry-After``, as for a stale cycle, which load balancers and
    clients take as "retry later"; anything else is a 500.
    """
    if _unreachable(exc):
        log.warning("status route: the publication store is unreachable: %s", type(exc).__name__)
        return unavailable_answer()
    log.error("status route failed: %s", type(exc).__name__)
    return error(500, "InternalServerError", "The status service failed; try again.")


def _unreachable(exc: Exception) -> bool:
    """Whether ``exc`` is Redis refusing a connection or not answering in time."""
    try:
        from redis.exceptions import ConnectionError as RedisConnectionError, TimeoutError as RedisTimeoutError
    except ImportError:  # pragma: no cover - redis is only needed with a Redis store
        return False
    return isinstance(exc, (RedisConnectionError, RedisTimeoutError))


class _HordePolls:
    """WSGI middleware answering the horde paths' GETs without Flask's request machinery.

    Polls are nearly all of the traffic, and Flask's per-request work (context,
    routing, response object) costs about as much CPU as the answer itself
    (``docs/http.md``, "Under load"). Everything else, and any id that is not
    plain ASCII, goes on to the Flask app, which answers the same (tested).
    """

    def __init__(self, app: Callable[..., Any], service: StatusService):
        self.app = app
        self.service = service

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        path = environ.get("PATH_INFO", "")
        if environ.get("REQUEST_METHOD") == "GET" and path.isascii():
            for prefix, shape in HORDE_PATHS.items():
                if path.startswith(prefix) and len(path) > len(prefix):
                    return self._answer(shape, path[len(prefix):], start_response)
        return self.app(environ, start_response)

    def _answer(self, shape: str, request_id: str, start_response: Callable[..., Any]) -> list[bytes]:
        try:
            answer = self.service.horde(shape, request_id)
        except Exception as exc:  # noqa: BLE001 - answered as every route's failure
            answer = _failed(exc)
        body = json.dumps(answer.body).encode()
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body))),
                   *answer.headers.items()]
        start_response(f"{answer.status} {HTTPStatus(answer.status).phrase}", headers)
        return [body]


def create_app(service: StatusService | None = None) -> Flask:
    """A Flask app serving :func:`status_blueprint` at the root, horde-path polls on a fast path.

    Parameters
    ----------
    service : StatusService, optional
        Default: :meth:`StatusService.from_environment`.

    Returns
    -------
    Flask

    Examples
    --------
    >>> from vecsched.service.store.sql import SQLStore
    >>> client = create_app(StatusService(store=SQLStore("sqlite://"))).test_client()
    >>> client.get("/v2/generate/check/r1").get_json()["rc"]
    'EstimatesStale'
    >>> client.get("/nowhere").status_code
    404
    """
    service = service or StatusService.from_environment()
    app = Flask("vecsched")
    app.register_blueprint(status_blueprint(service))
    app.register_error_handler(HTTPException, _on_error)
    app.wsgi_app = _HordePolls(app.wsgi_app, service)  # type: ignore[method-assign]
    return app
