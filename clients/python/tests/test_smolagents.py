"""The smolagents executor: a real CodeAgent, a local fake model behind
smolagents' own OpenAI client, a tool called from the cell."""

from __future__ import annotations

from smolagents import CodeAgent, OpenAIServerModel, tool

from cellbox.integrations.smolagents import CellboxExecutor

calls = []


@tool
def get_weather(city: str) -> str:
    """The weather in a city.

    Args:
        city: the city's name.
    """
    calls.append(city)
    return f"sunny in {city}"


def test_code_agent_calls_a_tool_from_the_cell(fake_model):
    replies = [
        "Thought: ask the tool.\n<code>\nw = get_weather(city='Paris')\nimport os\nprint(w, os.getpid() > 0)\n</code>",
        "Thought: done.\n<code>\nfinal_answer(w.upper())\n</code>",
    ]
    model_server = fake_model(lambda messages: replies.pop(0))
    model = OpenAIServerModel(model_id="fake", api_base=model_server.url, api_key="k")
    executor = CellboxExecutor()
    agent = CodeAgent(tools=[get_weather], model=model, executor=executor, max_steps=4)
    try:
        out = agent.run("What is the weather in Paris?")
    finally:
        agent.cleanup()
    assert out == "SUNNY IN PARIS"
    assert calls == ["Paris"]
    # The observation the model saw came from the cell's output.
    second = model_server.seen[1]["body"]["messages"]
    assert "sunny in Paris True" in str(second)
    assert executor.sandbox.closed


def test_errors_come_back_to_the_agent_and_state_carries(fake_model):
    replies = [
        "<code>\ntotal = 40\n</code>",
        "<code>\n1 / 0\n</code>",
        "<code>\nfinal_answer(total + 2)\n</code>",
    ]
    model_server = fake_model(lambda messages: replies.pop(0))
    model = OpenAIServerModel(model_id="fake", api_base=model_server.url, api_key="k")
    with CodeAgent(tools=[], model=model, executor=CellboxExecutor(), max_steps=5) as agent:
        assert agent.run("Add two.") == 42
    third = str(model_server.seen[2]["body"]["messages"])
    assert "ZeroDivisionError" in third
