"""The sync client against a real `cellbox serve` over stdio."""

from __future__ import annotations

import base64
import threading

import pytest

import cellbox
from cellbox import (
    CellTimeoutError,
    CodeError,
    ExecutionFailed,
    LimitExceededError,
    Sandbox,
    SandboxClosedError,
    SessionNotFoundError,
)


def test_value_output_and_state_carry_between_calls(sandbox):
    ex = sandbox.run_code("import sys\nx = 6 * 7\nprint('out')\nprint('err', file=sys.stderr)\nx")
    assert ex.status == "ok" and ex.ok
    assert ex.value == 42 and ex.text == "42"
    assert ex.stdout == "out\n" and ex.stderr == "err\n"
    assert ex.error is None
    assert ex.usage.wall_ms >= 0 and ex.usage.max_rss_kb > 0
    # The sandbox's default session keeps the namespace, as a notebook does.
    assert sandbox.run_code("x + 1").value == 43
    # A fresh throwaway session does not see it.
    ex = sandbox.run_code("x", session=None)
    assert ex.status == "error" and ex.error.type == "NameError"


def test_error_has_type_message_traceback_and_raises_on_demand(sandbox):
    ex = sandbox.run_code("def f():\n    return 1 / 0\nf()")
    assert ex.status == "error"
    assert ex.error.type == "ZeroDivisionError" and ex.error.name == "ZeroDivisionError"
    assert ex.error.message == "division by zero" == ex.error.value
    assert 'File "<cell>", line 2, in f' in ex.error.traceback
    assert ex.error.line == 2
    with pytest.raises(CodeError) as info:
        ex.raise_for_status()
    assert info.value.execution is ex


def test_live_output_reaches_the_callbacks_in_order(sandbox):
    seen = []
    code = "import sys, time\nfor i in range(3):\n    print('o', i, flush=True)\n    print('e', i, file=sys.stderr, flush=True)\n    time.sleep(0.05)\n"
    ex = sandbox.run_code(
        code,
        on_stdout=lambda m: seen.append(("out", m.line, m.error)),
        on_stderr=lambda m: seen.append(("err", m.line, m.error)),
    )
    assert ex.status == "ok"
    outs = [s for s in seen if s[0] == "out"]
    errs = [s for s in seen if s[0] == "err"]
    assert "".join(s[1] for s in outs) == "o 0\no 1\no 2\n" == ex.stdout
    assert "".join(s[1] for s in errs) == "e 0\ne 1\ne 2\n" == ex.stderr
    assert all(not s[2] for s in outs) and all(s[2] for s in errs)
    # Each chunk arrived as its own notification, before the result.
    assert len(ex.logs.stdout) >= 3


def test_timeout_raises_its_type_with_the_execution(sandbox):
    with pytest.raises(CellTimeoutError) as info:
        sandbox.run_code("print('started', flush=True)\nwhile True:\n    pass", timeout=1)
    e = info.value
    assert isinstance(e, TimeoutError) and isinstance(e, ExecutionFailed)
    assert e.execution.status == "timeout"
    assert "started" in e.execution.stdout


def test_memory_limit_raises_limit_exceeded(binary):
    with Sandbox(binary, args=["--memory", str(256 << 20)]) as sbx:
        with pytest.raises(LimitExceededError) as info:
            sbx.run_code("x = bytearray(1 << 30)")
        assert info.value.execution.status == "limit_exceeded"


def test_every_status_has_an_exception():
    statuses = ["error", "timeout", "killed", "limit_exceeded", "policy_denied", "protocol_error", "sandbox_error"]
    for status in statuses:
        cls = cellbox.STATUS_EXCEPTIONS[status]
        ex = cellbox.Execution(status=status)
        with pytest.raises(cls):
            ex.raise_for_status()
    assert cellbox.Execution(status="ok").raise_for_status().ok


def test_sessions_keep_objects_checkpoint_restore_reset(sandbox):
    with sandbox.session() as s:
        s.run_code("import re\npat = re.compile('a+')\nitems = [1, 2]\ngen = (i for i in range(10))")
        assert s.run_code("next(gen), pat.match('aaa').group(0)").value == [0, "aaa"]
        assert s.variables() == {"items": [1, 2]}
        assert s.get("items") == [1, 2]
        s.set("label", {"k": "v"})
        assert s.run_code("label['k']").value == "v"
        s.checkpoint("before")
        s.run_code("items.append(3)")
        assert s.get("items") == [1, 2, 3]
        s.restore("before")
        assert s.get("items") == [1, 2]
        s.reset()
        ex = s.run_code("items")
        assert ex.status == "error" and ex.error.type == "NameError"
        sid = s.id
        assert any(i["session_id"] == sid for i in sandbox.list_sessions())
    assert all(i["session_id"] != sid for i in sandbox.list_sessions())
    with pytest.raises(SessionNotFoundError):
        sandbox.run_code("1", session=sid)


def test_a_failed_cell_changes_nothing(sandbox):
    with sandbox.session() as s:
        s.run_code("n = 1")
        ex = s.run_code("n = 2\nraise ValueError('no')")
        assert ex.status == "error" and ex.error.type == "ValueError"
        assert s.get("n") == 1


def test_files_write_read_list(sandbox):
    with sandbox.session() as s:
        s.files.write("notes/a.txt", "hello")
        s.files.write("blob.bin", b"\x00\x01\xff")
        assert s.run_code("open('notes/a.txt').read()").value == "hello"
        assert s.run_code("list(open('blob.bin', 'rb').read())").value == [0, 1, 255]
        s.run_code("open('out.txt', 'w').write('from the cell')")
        assert s.files.read("out.txt") == "from the cell"
        assert s.files.read("blob.bin", format="bytes") == b"\x00\x01\xff"
        names = {e["name"] for e in s.files.list()}
        assert {"notes", "blob.bin", "out.txt"} <= names
        with pytest.raises(cellbox.ServerError):
            s.files.read("../etc/passwd")


def test_display_items(sandbox):
    code = "class H:\n    def _repr_html_(self):\n        return '<b>hi</b>'\nH()"
    ex = sandbox.run_code(code, session=None)
    assert [(d.mime, d.data) for d in ex.display] == [("text/html", "<b>hi</b>")]
    assert ex.results[0].html == "<b>hi</b>"


def test_closing_frees_every_session_so_the_cap_is_never_reached(binary):
    # serve allows 2 sessions here: each loop opens two and closes them.
    with Sandbox(binary, args=["--max-sessions", "2"]) as sbx:
        for i in range(6):
            with sbx.session() as a, sbx.session() as b:
                a.run_code(f"v = {i}")
                b.run_code(f"v = {i} * 2")
                assert (a.get("v"), b.get("v")) == (i, i * 2)
        assert sbx.list_sessions() == []
        # A sandbox's own default session counts too, and goes with it.
        sbx.run_code("z = 1")
        assert len(sbx.list_sessions()) == 1


def test_closed_sandbox_refuses_and_close_is_idempotent(binary):
    sbx = Sandbox(binary)
    with pytest.raises(SandboxClosedError):
        sbx.run_code("1")
    sbx.open()
    assert sbx.run_code("1 + 1").value == 2
    sbx.close()
    sbx.close()
    with pytest.raises(SandboxClosedError):
        sbx.run_code("1")


def test_sync_client_from_several_threads_of_a_plain_program(sandbox):
    sessions = [sandbox.session() for _ in range(3)]
    results, errors = {}, []

    def work(i, s):
        try:
            for j in range(4):
                s.run_code(f"acc = acc + {j} if 'acc' in globals() else {j}")
            results[i] = s.get("acc")
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i, s)) for i, s in enumerate(sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for s in sessions:
        s.close()
    assert not errors, errors
    assert results == {0: 6, 1: 6, 2: 6}


def test_binary_not_found_is_a_clear_error(tmp_path):
    with pytest.raises(cellbox.CellboxError, match="failed to find the cellbox binary"):
        Sandbox(str(tmp_path / "nope")).open()


def test_file_tools_and_aggregate_context(binary, tmp_path):
    root = tmp_path / "repo"
    (root / "src").mkdir(parents=True)
    (root / "src" / "lib.py").write_text("def alpha():\n    return 'alpha beta'\n")
    (root / "README").write_text("gamma\n")
    config = f'[files]\nroots = ["{root}"]\n[policy]\nallow = ["read_file"]\n'
    with Sandbox(binary, config_text=config) as sbx:
        assert {"read_file", "list_dir", "search_files", "aggregate_context"} <= set(sbx.tools())
        r = sbx.read_file("src/lib.py", 1, 1)
        assert "def alpha" in str(r)
        listing = sbx.list_dir(".")
        assert "src" in str(listing) and "README" in str(listing)
        found = sbx.search_files("alpha")
        assert "lib.py" in str(found)
        agg = sbx.aggregate_context([r, found], "alpha", 200)
        assert "alpha" in str(agg)
        # The same tool from a cell, where the policy allows it.
        ex = sbx.run_code("read_file('README')")
        assert "gamma" in str(ex.value), ex


def test_png_display_decodes(binary):
    code = (
        "import base64\n"
        "class P:\n"
        "    def _repr_png_(self):\n"
        "        return base64.b64decode('iVBORw0KGgo=')\n"
        "P()"
    )
    with Sandbox(binary) as sbx:
        ex = sbx.run_code(code)
        assert ex.display[0].mime == "image/png"
        assert ex.display[0].bytes() == base64.b64decode("iVBORw0KGgo=")
