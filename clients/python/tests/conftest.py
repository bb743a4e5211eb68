"""Fixtures for the client's tests: a real `cellbox serve`, never a fake.

The binary comes from $CELLBOX_BIN (the Rust suite's runner sets it to the
built `cellbox`); without it the tests fail, they do not skip.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import tempfile
import time

import pytest


@pytest.fixture(scope="session")
def binary() -> str:
    path = os.environ.get("CELLBOX_BIN")
    if not path or not os.access(path, os.X_OK):
        pytest.fail("CELLBOX_BIN must name the built cellbox binary (tests/suite/pyclient.rs sets it)")
    return path


@pytest.fixture(scope="session")
def sandbox(binary):
    from cellbox import Sandbox

    with Sandbox(binary) as sbx:
        yield sbx


class HttpServer:
    def __init__(self, proc: subprocess.Popen, url: str, token: str, tmp: str):
        self.proc, self.url, self.token, self.tmp = proc, url, token, tmp


@pytest.fixture(scope="module")
def http_server(binary):
    """`cellbox serve --http 127.0.0.1:0` with a token file; its URL and token."""
    tmp = tempfile.mkdtemp(prefix="cellbox-pyclient-")
    token = secrets.token_hex(16)
    token_file = os.path.join(tmp, "token")
    with open(token_file, "w") as f:
        f.write(token)
    err_path = os.path.join(tmp, "stderr")
    err = open(err_path, "w+")
    proc = subprocess.Popen(
        [binary, "serve", "--http", "127.0.0.1:0", "--token-file", token_file, "--max-sessions", "4"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=err,
        env={**os.environ, "CELLBOX_LOG": "warn"},
    )
    url = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and url is None:
        if proc.poll() is not None:
            break
        with open(err_path) as f:
            m = re.search(r"(http://127\.0\.0\.1:\d+/)", f.read())
        if m:
            url = m.group(1)
        else:
            time.sleep(0.05)
    if url is None:
        proc.kill()
        with open(err_path) as f:
            pytest.fail(f"cellbox serve --http did not start: {f.read()}")
    yield HttpServer(proc, url, token, tmp)
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    err.close()



@pytest.fixture
def fake_model():
    """fake_model(reply) starts a cellbox.testing.FakeModel answering with
    reply(messages) (or a list of replies)."""
    from cellbox.testing import FakeModel

    started = []

    def start(reply):
        m = FakeModel(reply)
        started.append(m)
        return m

    yield start
    for m in started:
        m.close()
