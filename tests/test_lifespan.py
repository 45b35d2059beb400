"""The worker inside an application: `FastAPI(lifespan=queue.lifespan)` and
`async with queue.running():` run it in a watched task, report a crash through the
health check and stop it within `shutdown_grace`."""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from uuid import UUID

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from axa_queue import AxaQueueError, Health, JobState, Queue, QueueOptions
from axa_queue.worker.exchange import Exchange
from conftest import FAST, eventually, status_of


def fastapi_app(queue: Queue) -> FastAPI:
    """A small app as a user would write it: queue a report, wait for its result,
    and a health route."""
    app = FastAPI(lifespan=queue.lifespan)

    @app.post("/reports/{n}")
    async def queue_report(n: int) -> dict[str, str]:
        return {"id": str(await queue.enqueue("Report", {"n": n}))}

    @app.get("/reports/{job_id}")
    async def report(job_id: UUID) -> dict[str, Any]:
        info = await queue.wait(job_id, timeout=30)
        return {"state": info.state.value, "result": await queue.result(job_id)}

    @app.get("/health")
    async def health() -> PlainTextResponse:
        ok, why = await queue.health()
        return PlainTextResponse(why, status_code=200 if ok else 503)

    return app


def client_of(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app")


async def test_a_fastapi_app_with_the_queues_lifespan_runs_its_jobs_and_is_healthy(
    dsn: str,
) -> None:
    queue = Queue(dsn, QueueOptions(**FAST))

    @queue.handler("Report")
    async def report(args: dict[str, int]) -> dict[str, int]:
        return {"rows": args["n"] * 10}

    app = fastapi_app(queue)
    assert not queue.is_open
    async with LifespanManager(app, startup_timeout=30, shutdown_timeout=30) as manager:
        assert queue.is_open
        async with client_of(manager.app) as client:
            job_id = (await client.post("/reports/4")).json()["id"]
            answer = await client.get(f"/reports/{job_id}")
            assert answer.json() == {"state": "completed", "result": {"rows": 40}}
            health = await client.get("/health")
            assert (health.status_code, health.text) == (200, "ok")
    assert not queue.is_open  # it opened the queue, so it closed it


async def test_a_crashed_worker_is_logged_and_fails_the_health_check_while_the_app_serves(
    dsn: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="axa_queue")
    crashed = asyncio.Event()

    async def broken(self: Exchange, *args: Any) -> Any:
        crashed.set()
        raise RuntimeError("a bug in the exchange\nwith a second line")

    monkeypatch.setattr(Exchange, "send", broken)
    queue = Queue(dsn, QueueOptions(**FAST))
    queue.handle("Report", lambda args: None)
    app = fastapi_app(queue)
    manager = LifespanManager(app, startup_timeout=30, shutdown_timeout=30)
    async with manager, client_of(manager.app) as client:
        await queue.enqueue("Report", {"n": 1})
        await asyncio.wait_for(crashed.wait(), 30)

        async def unhealthy() -> bool:
            return (await client.get("/health")).status_code == 503

        await eventually(unhealthy)
        health = await client.get("/health")
        assert health.text == "the worker crashed: RuntimeError: a bug in the exchange"
        assert (await client.post("/reports/2")).status_code == 200  # the app still serves
    crashes = [r for r in caplog.records if r.getMessage().startswith("the worker crashed")]
    assert len(crashes) == 1 and crashes[0].levelno == logging.ERROR
    assert crashes[0].__dict__["error"] == "RuntimeError: a bug in the exchange"


async def test_leaving_the_lifespan_lets_a_job_in_progress_finish_and_writes_its_ending(
    dsn: str, admin
) -> None:
    queue = Queue(dsn, QueueOptions(**FAST, shutdown_grace=30))
    started = asyncio.Event()
    release = asyncio.Event()

    @queue.handler("Slow")
    async def slow(args: Any) -> str:
        started.set()
        await release.wait()
        return "finished"

    manager = LifespanManager(fastapi_app(queue), startup_timeout=30, shutdown_timeout=60)
    await manager.__aenter__()
    job_id = await queue.enqueue("Slow", {})
    await asyncio.wait_for(started.wait(), 30)
    leaving = asyncio.create_task(manager.__aexit__(None, None, None))
    await eventually(lambda: queue._hosted is not None and queue._hosted.stop.is_set())
    assert not leaving.done()  # waits for the job in progress
    release.set()
    await leaving
    assert status_of(admin, job_id)[0] == "completed"
    row = admin.execute("SELECT result FROM axa_queue WHERE id = %s", (job_id,)).fetchone()
    assert row == ("finished",)


async def test_leaving_the_lifespan_aborts_a_job_still_running_after_the_grace(
    dsn: str, admin, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="axa_queue")
    queue = Queue(dsn, QueueOptions(**FAST, shutdown_grace=0.3))
    started = asyncio.Event()

    @queue.handler("Stuck")
    async def stuck(args: Any) -> None:
        started.set()
        await asyncio.Event().wait()  # never returns

    async with LifespanManager(fastapi_app(queue), startup_timeout=30, shutdown_timeout=60):
        job_id = await queue.enqueue("Stuck", {})
        await asyncio.wait_for(started.wait(), 30)
    assert status_of(admin, job_id)[0] == "running"  # left for stale recovery
    assert any("aborting jobs still running" in r.getMessage() for r in caplog.records)
    assert not queue.is_open


async def test_running_serves_other_code_and_reports_a_crash_through_health(
    make_queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = await make_queue()
    queue.handle("Double", lambda args: args["n"] * 2)
    async with queue.running() as same:
        assert same is queue
        job_id = await queue.enqueue("Double", {"n": 21})
        assert (await queue.wait(job_id, timeout=30)).state is JobState.COMPLETED
        assert await queue.result(job_id) == 42
        assert await queue.health() == Health(True, "ok")
        with pytest.raises(AxaQueueError, match="already running its worker"):
            async with queue.running():
                pass
    assert queue.is_open  # it was open before: it stays open

    async def broken(self: Exchange, *args: Any) -> Any:
        raise KeyError("gone")

    monkeypatch.setattr(Exchange, "send", broken)
    async with queue.running():
        await queue.enqueue("Double", {"n": 1})

        async def crashed() -> bool:
            return not (await queue.health()).ok

        await eventually(crashed)
        ok, why = await queue.health()
        assert (ok, why) == (False, "the worker crashed: KeyError: 'gone'")
    assert await queue.health() == Health(True, "ok")  # no worker now, nothing crashed


async def test_health_says_the_queue_is_not_open(dsn: str) -> None:
    ok, why = await Queue(dsn).health()
    assert not ok and "not running" in why


def test_a_starlette_app_run_by_its_test_client_runs_the_worker_in_its_lifespan(
    dsn: str, admin
) -> None:
    queue = Queue(dsn, QueueOptions(**FAST))
    queue.handle("Echo", lambda args: args)

    async def echo(request: Request) -> JSONResponse:
        job_id = await queue.enqueue("Echo", {"said": request.path_params["word"]})
        await queue.wait(job_id, timeout=30)
        return JSONResponse(await queue.result(job_id))

    app = Starlette(routes=[Route("/echo/{word}", echo)], lifespan=queue.lifespan)
    with TestClient(app) as client:
        assert client.get("/echo/hello").json() == {"said": "hello"}
    assert not queue.is_open
