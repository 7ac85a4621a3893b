import subprocess
from pathlib import Path


def test_greeting_is_what_the_tool_prints():
    want = subprocess.run(["greet", "world"], capture_output=True, text=True, check=True).stdout
    assert want == "hello, world\n"
    assert Path("/app/greeting.txt").read_text() == want
