"""The horde paths proven with the AI Horde's own client library, horde-sdk, in strict mode.

horde-sdk reads ``TESTS_ONGOING`` when its models are defined (``extra="forbid"``
then: any key the horde does not send fails), and ``AI_HORDE_URL`` when its
endpoints module is imported; both are set here before its first import.
"""

from __future__ import annotations

import os
import socket
import sys
import threading

import pytest

if sys.version_info < (3, 12):  # pragma: no cover - horde-sdk needs 3.12
    pytest.skip("horde-sdk needs Python >= 3.12", allow_module_level=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PORT = _free_port()
os.environ["TESTS_ONGOING"] = "1"
os.environ.setdefault("LOGFIRE_IGNORE_NO_CONFIG", "1")
os.environ["AI_HORDE_URL"] = f"http://127.0.0.1:{PORT}/"

sdk = pytest.importorskip("horde_sdk.ai_horde_api.apimodels")
from horde_sdk.generic_api.apimodels import RequestErrorResponse  # noqa: E402

from vecsched.service.http import StatusService, create_app  # noqa: E402

IDS = {key: f"00000000-0000-4000-8000-{k:012d}" for k, key in enumerate(
    ("normal", "fallback", "inflight", "offline", "faulted", "done", "behind", "new", "gone"), start=1)}
PATHS = {
    "text": [("/v2/generate/text/status/", sdk.TextGenerateStatusResponse)],
    "image": [("/v2/generate/status/", sdk.ImageGenerateStatusResponse),
              ("/v2/generate/check/", sdk.ImageGenerateCheckResponse)],
}


def test_the_sdk_models_are_strict() -> None:
    for model in (sdk.TextGenerateStatusResponse, sdk.ImageGenerateStatusResponse, sdk.ImageGenerateCheckResponse,
                  RequestErrorResponse):
        assert model.model_config["extra"] == "forbid", model
    with pytest.raises(Exception):
        sdk.ImageGenerateCheckResponse.model_validate(
            {"waiting": 1, "processing": 0, "finished": 0, "restarted": 0, "done": False, "wait_time": 0,
             "queue_position": 0, "kudos": 0.0, "ahead_wait": 1.0})


@pytest.mark.parametrize("mode", ["cycle", "live"])
@pytest.mark.parametrize("key", list(IDS))
def test_every_200_answer_parses_strictly(key, mode, http_service, cycle_service) -> None:
    client = create_app(http_service if mode == "live" else cycle_service).test_client()
    gentype = "image" if key == "offline" else "text"
    for path, model in PATHS[gentype]:
        got = client.get(path + IDS[key])
        assert got.status_code == 200, (key, path)
        parsed = model.model_validate(got.get_json())
        assert parsed.kudos == got.get_json()["kudos"]
        # left out where not known (newer than the cycle): the SDK's default, True, stands
        assert parsed.is_possible is got.get_json().get("is_possible", True)
    if key == "faulted":
        assert parsed.faulted is True
    if key == "done":
        assert parsed.done is True and parsed.is_job_complete(0)  # no generations merged in here
    if key == "offline":
        assert parsed.wait_time == 0 and parsed.is_job_possible() is False


def test_404_and_503_bodies_parse_as_the_horde_error(published_horde, http_service) -> None:
    client = create_app(http_service).test_client()
    got = client.get("/v2/generate/text/status/00000000-0000-4000-8000-0000000000ff")
    err = RequestErrorResponse.model_validate(got.get_json())
    assert got.status_code == 404 and err.rc == "RequestNotFound"
    stale = StatusService(store=http_service.store, progress=http_service.progress,
                          clock=lambda: published_horde.now + 60.0)
    got = create_app(stale).test_client().get(f"/v2/generate/check/{IDS['offline']}")
    err = RequestErrorResponse.model_validate(got.get_json())
    assert got.status_code == 503 and err.rc == "EstimatesStale" and got.headers["Retry-After"]


@pytest.fixture
def live_server(http_service):
    """The app on 127.0.0.1:PORT (the address horde-sdk was pointed at)."""
    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", PORT, create_app(http_service), threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{PORT}/"
    server.shutdown()
    thread.join(timeout=10)


def test_the_sdk_client_polls_through_the_service(live_server) -> None:
    from horde_sdk.ai_horde_api.ai_horde_clients import AIHordeAPIManualClient

    client = AIHordeAPIManualClient()
    check = client.get_generate_check(gen_id=IDS["offline"])
    assert isinstance(check, sdk.ImageGenerateCheckResponse)
    assert check.is_possible is False and check.wait_time == 0 and check.kudos == 1.5
    status = client.get_generate_status(gen_id=IDS["offline"])
    assert isinstance(status, sdk.ImageGenerateStatusResponse) and status.generations == []
    request = sdk.TextGenerateStatusRequest(id=IDS["normal"])
    text = client.submit_request(request, request.get_default_success_response_type())
    assert isinstance(text, sdk.TextGenerateStatusResponse)
    assert text.kudos == 12.5 and text.eligible_workers == 1 and text.done is False
    missing = sdk.TextGenerateStatusRequest(id="00000000-0000-4000-8000-0000000000ff")
    got = client.submit_request(missing, missing.get_default_success_response_type())
    assert isinstance(got, RequestErrorResponse) and got.rc == "RequestNotFound"


@pytest.mark.parametrize("mode", ["cycle", "live"])
def test_a_faulted_request_is_complete_for_the_sdk(mode, published_horde, http_service, cycle_service) -> None:
    """The horde's is_completed() is true first thing for a faulted request, and the SDK's check stops
    polling on ``done``: a faulted request once answered done false, so a client polled it to its timeout."""
    import sqlalchemy as sa

    from vecsched.service.sql.schema import waiting_prompts

    with published_horde.engine.begin() as conn:  # the image request faults after the cycle
        conn.execute(sa.update(waiting_prompts).where(waiting_prompts.c.id == IDS["offline"]).values(faulted=True))
    service = http_service if mode == "live" else cycle_service
    client = create_app(service).test_client()
    text = sdk.TextGenerateStatusResponse.model_validate(
        client.get(f"/v2/generate/text/status/{IDS['faulted']}").get_json())
    assert text.faulted is True and text.done is True and text.is_possible is False
    if mode == "live":  # by default the cycle still holds the image request as waiting (its progress as of then)
        check = sdk.ImageGenerateCheckResponse.model_validate(
            client.get(f"/v2/generate/check/{IDS['offline']}").get_json())
        assert check.faulted is True and check.is_job_complete(1) is True


def test_a_stale_cycle_still_tells_the_sdk_what_has_ended(published_horde, http_service) -> None:
    """The job stopped publishing: a finished or faulted request needs no queue figure, so its client
    hears done from the database (horde-sdk polls until ``done``); a waiting one still hears 503."""
    stale = StatusService(store=http_service.store, progress=http_service.progress,
                          clock=lambda: published_horde.now + 3600.0)
    client = create_app(stale).test_client()
    for key in ("done", "faulted"):
        got = client.get(f"/v2/generate/text/status/{IDS[key]}")
        assert got.status_code == 200, key
        parsed = sdk.TextGenerateStatusResponse.model_validate(got.get_json())
        assert parsed.done is True and parsed.wait_time == 0 and parsed.queue_position == 0, key
        assert parsed.faulted is (key == "faulted") and parsed.is_job_complete(0)  # no generations merged here
    for key in ("normal", "new"):  # still waiting: only a fresh cycle can say where
        got = client.get(f"/v2/generate/text/status/{IDS[key]}")
        assert got.status_code == 503 and got.get_json()["rc"] == "EstimatesStale", key
    assert client.get(f"/v2/generate/check/{IDS['done']}").status_code == 404  # a text request on an image path


def test_any_spelling_of_a_uuid_names_the_same_request(http_service) -> None:
    """The horde parses the path's id as a UUID: upper case, no dashes, braces and a URN name one request."""
    client = create_app(http_service).test_client()
    canonical = IDS["normal"]
    want = client.get(f"/v2/generate/text/status/{canonical}")
    assert want.status_code == 200
    for spelling in (canonical.upper(), canonical.replace("-", ""), "{" + canonical + "}", "urn:uuid:" + canonical):
        got = client.get(f"/v2/generate/text/status/{spelling}")
        assert got.status_code == 200 and got.get_json() == want.get_json(), spelling
    assert client.get(f"/v2/generate/text/status/{canonical[:-1]}").status_code == 404


def test_a_cycle_stamped_ahead_of_the_clock_is_stale(published_horde, http_service) -> None:
    """After the clock went back, the job cannot publish until it passes the last cycle's time: that
    frozen cycle was served as fresh for as long as the clock had run ahead."""
    from vecsched.service.read import status

    ahead = StatusService(store=http_service.store, progress=http_service.progress,
                          clock=lambda: published_horde.now - 3600.0)
    got = create_app(ahead).test_client().get(f"/v2/generate/text/status/{IDS['normal']}")
    assert got.status_code == 503 and got.get_json()["rc"] == "EstimatesStale"
    assert status(IDS["normal"], store=http_service.store, now=published_horde.now - 3600.0)["stale"] is True
    assert status(IDS["normal"], store=http_service.store, now=published_horde.now)["stale"] is False
