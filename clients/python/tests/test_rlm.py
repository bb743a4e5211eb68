"""The rlms environment against the real rlms package and a local fake
model: a scripted RLM task, with rlms' LM handler bridged into the cell and
with cellbox's own model client; rlms' REPL names; no leaked sessions."""

from __future__ import annotations

import gc

import pytest

from cellbox import Sandbox
from cellbox.integrations import rlm as cellbox_rlm
from cellbox.integrations.rlm import CellboxREPL, models_from_backend


from rlm import RLM  # noqa: E402

CONTEXT = "The launch code is 7351. " + "filler text. " * 200

ROOT_REPLIES = [
    "Let me look at the context.\n```repl\nhead = context[:40]\nfound = llm_query('FIND THE CODE: ' + head)\nprint(found)\n```",
    "```repl\nanswer['content'] = 'code ' + found.strip()\nanswer['ready'] = True\n```",
]


def scripted(replies):
    """Root turns in order; a sub-call (llm_query) is answered from its prompt."""
    turns = list(replies)

    def reply(messages):
        last = messages[-1]["content"] if messages else ""
        if isinstance(last, str) and last.startswith("FIND THE CODE: "):
            return last.split("is ")[1].split(".")[0]
        return turns.pop(0) if turns else "```repl\nanswer['content'] = 'out of script'\nanswer['ready'] = True\n```"

    return reply


def backend(model):
    return {"base_url": model.url, "api_key": "sk-test-secret-key", "model_name": "fake-model"}


def test_the_same_task_gives_the_same_answer_locally_and_in_cellbox(fake_model):
    cellbox_rlm.register()
    results = {}
    for env in ("local", "cellbox"):
        model = fake_model(scripted(ROOT_REPLIES))
        r = RLM(backend="openai", backend_kwargs=backend(model), environment=env, max_iterations=5)
        out = r.completion(CONTEXT, root_prompt="What is the launch code?")
        roots = [s for s in model.seen if not str(s["body"]["messages"][-1]["content"]).startswith("FIND THE CODE")]
        results[env] = (out.response, len(roots), len(model.seen) - len(roots))
    # Two root turns and one sub-call each way.
    assert results["cellbox"] == results["local"] == ("code 7351", 2, 1), results


def test_llm_query_answered_by_cellbox_models(fake_model):
    model = fake_model(scripted([]))
    models = models_from_backend("openai", backend(model))
    with CellboxREPL(context_payload=CONTEXT, llm="cellbox", models=models) as env:
        r = env.execute_code("found = llm_query('FIND THE CODE: ' + context[:40])\nprint(found)")
        assert r.stdout.strip() == "7351", r
        # The supervisor made the request with the key; the cell never had it.
        assert model.seen[-1]["authorization"] == "Bearer sk-test-secret-key"
        r = env.execute_code("import os\nprint(sorted(os.environ))\nprint([k for k in globals() if 'key' in k.lower()])")
        assert "sk-test-secret-key" not in r.stdout


def test_rlm_run_with_cellbox_models_configured_from_the_rlm(fake_model):
    model = fake_model(scripted(ROOT_REPLIES))
    cellbox_rlm.register()
    r = RLM(
        backend="openai",
        backend_kwargs=backend(model),
        environment="cellbox",
        environment_kwargs={"llm": "cellbox", "models": models_from_backend("openai", backend(model))},
        max_iterations=5,
    )
    assert r.completion(CONTEXT, root_prompt="What is the launch code?").response == "code 7351"


def test_repl_names_behave_as_in_rlms():
    with CellboxREPL(context_payload={"k": [1, 2]}) as env:
        assert env.locals["answer"] == {"content": "", "ready": False}
        assert env.locals["context"] == {"k": [1, 2]}
        env.execute_code("def helper(x):\n    return x * 2\nllm_query = lambda p: 'hijacked'\ncontext = 'gone'")
        r = env.execute_code("print(helper(21), llm_query('p'), context)")
        # The model's own function stays; rlms' names are put back.
        assert r.stdout.strip() == "42 Error: No LM handler configured {'k': [1, 2]}", r
        r = env.execute_code("print(SHOW_VARS())")
        assert "'helper': 'function'" in r.stdout and "llm_query" not in r.stdout
        r = env.execute_code("1 / 0")
        assert "ZeroDivisionError" in r.stderr and r.final_answer is None
        r = env.execute_code("answer = {'content': 42, 'ready': True}")
        assert r.final_answer == "42"


def test_large_context_arrives_whole():
    big = "x" * (5 << 20) + "END"
    with CellboxREPL(context_payload=big) as env:
        r = env.execute_code("print(len(context), context[-3:])")
        assert r.stdout.strip() == f"{len(big)} END", r
        assert "context" in env.locals and env.locals["context"] == big


def test_environments_never_leak_sessions(binary):
    # One server for every environment of the process; each has a session,
    # which cleanup() (or the garbage collector) closes.
    for i in range(30):
        env = CellboxREPL()
        env.execute_code(f"v = {i}")
        if i % 2:
            env.cleanup()
        del env
    gc.collect()
    (sbx,) = [s for key, s in cellbox_rlm._shared.items() if key[1] == "{}"]
    assert sbx.list_sessions() == []
