"""The exit codes and messages of the launcher's server commands (viewer, feed, serve)."""

from __future__ import annotations

import pytest

from rollout.local_server import listen, run_command


class Broken(Exception):
    pass


def test_run_command_exit_codes_and_messages(capsys: pytest.CaptureFixture[str]) -> None:
    busy = listen("127.0.0.1", 0, exposes="nothing")
    port = busy.getsockname()[1]
    try:
        async def serve_on_busy_port() -> None:
            listen("127.0.0.1", port, exposes="nothing")

        assert run_command(serve_on_busy_port, "127.0.0.1", port, (Broken,)) == 1
        assert f"error: cannot listen on 127.0.0.1:{port}: " in capsys.readouterr().err
    finally:
        busy.close()

    def bad_setup() -> None:
        raise Broken("no such env 'x'")  # raised while the command's coroutine is being built

    assert run_command(bad_setup, "h", 1, (Broken,)) == 1  # type: ignore[arg-type]
    assert capsys.readouterr().err == "error: no such env 'x'\n"

    async def interrupted() -> None:
        raise KeyboardInterrupt

    async def stopped() -> None:
        return None

    assert run_command(interrupted, "h", 1, (Broken,)) == 0
    assert run_command(stopped, "h", 1, (Broken,)) == 0
    assert capsys.readouterr().err == ""
    with pytest.raises(ValueError, match="not a setup error"):  # anything else is not swallowed
        async def other() -> None:
            raise ValueError("not a setup error")

        run_command(other, "h", 1, (Broken,))
