"""The viewer follows a job while it runs: a session held by the fake model shows as running, and
the open pages refresh by themselves when it finishes (polling; no fixed waits)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from tests.fake_upstream import FakeRequest, FakeUpstream, Reply
from tests.viewer.conftest import CHROMIUM, CHROMIUM_ARGS, Viewer, job_args, launch, need_chromium
from tests.viewer.toy_env import gateway_config, make_env, model_reply


async def until(pred: Any, what: str, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def test_pages_follow_a_running_job(tmp_path: Path) -> None:
    need_chromium()
    from playwright.async_api import async_playwright

    env_root = make_env(tmp_path / "envs")
    db = tmp_path / "live.db"
    release = asyncio.Event()
    answer = model_reply(diverge=False)
    held: list[FakeRequest] = []

    async def reply(req: FakeRequest) -> Reply:
        if "directly" in str(req.json):
            held.append(req)
            await release.wait()
        return answer(req)

    async with FakeUpstream() as up:
        up.script(None, [reply] * 50)
        cfg = gateway_config(tmp_path / "gw.yaml", up.base_url, db)
        job = asyncio.create_task(launch(*job_args(env_root, cfg, db, "live", 1, tmp_path), cwd=tmp_path))
        viewer: Viewer | None = None
        try:
            await until(lambda: held, "the held model call")
            viewer = await asyncio.to_thread(Viewer, db, env_root, tmp_path)
            async with async_playwright() as p:
                browser = await p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
                page = await browser.new_page()
                await page.goto(f"{viewer.url}/jobs/live")
                assert await page.locator("#job-state").inner_text() == "running"
                assert await page.locator("#live").is_visible()
                await page.screenshot(path=tmp_path / "running.png", full_page=True)
                session = await browser.new_page()
                await session.goto(f"{viewer.url}/jobs/live/sessions?case=direct")
                await session.click("#sessions tbody tr >> a >> nth=0")
                assert "running" in await session.locator("#verdict").inner_text()
                release.set()
                code, _, err = await job
                assert code == 0, err
                await page.wait_for_function(
                    "document.getElementById('job-state').textContent === 'finished'", timeout=120_000
                )
                assert "3/3" in await page.locator("#job-progress").inner_text()
                assert not await page.locator("#live").is_visible()
                await session.wait_for_function(
                    "document.querySelector('#verdict .score').textContent === '10.00'", timeout=120_000
                )
                await page.screenshot(path=tmp_path / "finished.png", full_page=True)
                await browser.close()
        finally:
            release.set()
            if not job.done():
                await job
            if viewer is not None:
                viewer.stop()
