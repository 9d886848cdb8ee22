"""Local data never switches the model hub off: with ``--train``/``--data-dir`` given, a hub model is still asked
for. The hub is a fake one on 127.0.0.1 that answers 404 to everything and records what it was asked (bounded: one
command, a 120 s limit, the server stops with the test)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class _Recorder(BaseHTTPRequestHandler):
    seen: list[str] = []

    def _answer(self):
        type(self).seen.append(self.path)
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Error-Code", "RepoNotFound")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(b'{"error": "Repository not found"}')

    do_GET = do_HEAD = _answer

    def log_message(self, *args):  # quiet
        pass


@pytest.fixture
def fake_hub():
    _Recorder.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", _Recorder.seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
def test_a_hub_model_is_requested_when_local_data_is_given(tmp_path, fake_hub):
    endpoint, seen = fake_hub
    rows = "text,label\n" + "".join(f"a fine film number {i},{i % 2}\n" for i in range(8))
    (tmp_path / "train.csv").write_text(rows)
    (tmp_path / "dev.csv").write_text(rows)
    env = {k: v for k, v in os.environ.items() if k not in {"HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"}}
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf"), HF_HUB_ETAG_TIMEOUT="5",
               HF_HUB_DOWNLOAD_TIMEOUT="5")
    command = [sys.executable, "-m", "papa_lib.cli", "probe", "--task", "custom", "--train",
               str(tmp_path / "train.csv"), "--validation", str(tmp_path / "dev.csv"), "--text-columns", "text",
               "--label-column", "label", "--model", "some-org/some-model", "--results-dir", str(tmp_path / "r")]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert any("some-org/some-model" in path for path in seen), (seen, done.stderr[-2000:])
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().startswith("papa: error:") and len(done.stderr.strip().splitlines()) == 1
