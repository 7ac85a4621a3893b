"""What gateways sharing sessions build on, on both backends: the locked read-modify-write of a
session row, the one-statement reservation (PostgreSQL), and steps committed with their
``in_flight`` release (``after_close`` for a session closed meanwhile)."""

from __future__ import annotations

import asyncio

from gateway.sessions import SessionClosed
from gateway.shared_sessions import SharedSessionManager
from store import GatewaySession, JobEnvironment, SessionStep, Store


def _new(sid: str, max_steps: int = -1):  # type: ignore[no-untyped-def]
    return lambda ctx: GatewaySession(
        session_id=sid, max_steps=ctx.max_steps if ctx else max_steps, step_counts={}
    )


async def test_change_gateway_session_creates_from_the_launcher_row_and_serializes(store_url: str) -> None:
    a, b = Store(store_url), Store(store_url)
    await a.init()
    try:
        await a.add_job_sessions(
            [
                JobEnvironment(
                    session_id="s",
                    job_id="j",
                    env_name="e",
                    case_id="0",
                    llm_model="m",
                    group_id="g",
                    max_steps=7,
                )
            ]
        )

        def bump(st: GatewaySession) -> int:
            st.total_steps += 1
            return st.total_steps

        got = await asyncio.gather(
            *(store.change_gateway_session("s", bump, _new("s")) for store in (a, b) * 20)
        )
        assert sorted(got) == list(range(1, 41))  # 40 changes through two stores, none lost
        st = await a.load_gateway_session("s")
        assert st is not None and (st.total_steps, st.max_steps) == (40, 7)
    finally:
        await a.close()
        await b.close()


async def test_reservations_over_two_stores_are_exact(store_url: str) -> None:
    """40 parallel reservations of one session (budget 10) through two gateways' session
    managers on two stores: exactly 10 steps, seqs 1..10, step ids 1..10."""
    a, b = Store(store_url), Store(store_url)
    await a.init()
    try:
        managers = [SharedSessionManager(a, 10), SharedSessionManager(b, 10)]
        slots = await asyncio.gather(*(managers[i % 2].reserve("s", "m") for i in range(40)))
        taken = sorted(((s, "m") for s in slots if s is not None), key=lambda x: x[0].seq)
        assert [s.seq for s, _ in taken] == list(range(1, 11))
        assert [s.step_id for s, _ in taken] == list(range(1, 11))
        st = await a.load_gateway_session("s")
        assert st is not None and (st.total_steps, st.in_flight, st.status, st.route) == (
            10,
            10,
            "truncated",
            "m",
        )
        assert st.step_counts == {"m": 10}
        # steps committed with their release: in_flight back to 0
        rows = [
            SessionStep(session_id="s", seq=s.seq, step_id=s.step_id, llm_model=m, endpoint="e")
            for s, m in taken
        ]
        await b.write_batch(rows[:4], [], release_in_flight=True)
        await a.write_batch(rows[4:], [], release_in_flight=True)
        st = await a.load_gateway_session("s")
        assert st is not None and st.in_flight == 0
        assert [x.is_trainable for x in await a.trajectory("s")] == [True] * 10
    finally:
        await a.close()
        await b.close()


async def test_one_statement_reservation(store_url: str) -> None:
    store = Store(store_url)
    await store.init()
    try:
        assert await store.reserve_step("s", "m") is None  # no row yet
        await store.change_gateway_session("s", lambda st: None, _new("s", max_steps=3))
        got = [await store.reserve_step("s", model) for model in ("n.x", "n.x", "m", "n.x", "n.x")]
        # the first reservation binds the session to its route; another route gets no step
        assert got == [
            (1, 1, None, None, None),
            (2, 2, None, None, None),
            None,
            (3, 3, None, None, None),
            None,
        ]
        st = await store.load_gateway_session("s")
        assert st is not None and (st.step_counts, st.in_flight, st.status, st.route) == (
            {"n.x": 3},
            3,
            "active",
            "n.x",
        )
        assert st.updated_at is not None and st.updated_at.year >= 2024  # stored as the ORM stores times
        await store.change_gateway_session("q", lambda st: None, _new("q", max_steps=-1))
        quoted = await store.reserve_step("q", 'a"b')
        assert quoted == (
            None if store.kind == "sqlite" else (1, 1, None, None, None)
        )  # SQLite: general path
    finally:
        await store.close()


async def test_a_step_committed_after_its_session_closed_is_after_close(store_url: str) -> None:
    store = Store(store_url)
    await store.init()
    try:
        m = SharedSessionManager(store, -1)
        slot = await m.reserve("s", "m")
        assert slot is not None
        snap, truncated = await m.close("s", "done", None, grace_s=0.05)  # gives up waiting at once
        assert (snap.status, snap.in_flight, truncated) == ("closed", 1, False)
        try:
            await m.reserve("s", "m")
            raise AssertionError("a closed session took a call")
        except SessionClosed:
            pass
        await store.write_batch(
            [
                SessionStep(
                    session_id="s",
                    seq=slot.seq,
                    step_id=slot.step_id,
                    llm_model="m",
                    endpoint="e",
                    meta_json={"route": "m"},
                )
            ],
            [],
            release_in_flight=True,
        )
        (step,) = await store.trajectory("s")
        assert (step.is_trainable, step.meta_json) == (False, {"route": "m", "after_close": True})
        st = await store.load_gateway_session("s")
        assert st is not None and (st.status, st.in_flight, st.close_reason) == ("closed", 0, "done")
    finally:
        await store.close()
