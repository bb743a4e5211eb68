"""Checks tool definitions against a model API's own Python types.

Usage: tool_types.py openai|anthropic < definitions.json

The definitions (`cellbox tools --format ...`) must validate as that
package's tool parameter type and come back unchanged from it (so no key is
unknown to the type and none was dropped). Prints `ok N` on success.
"""

import json
import re
import sys

from pydantic import TypeAdapter

api = sys.argv[1]
tools = json.load(sys.stdin)
assert isinstance(tools, list) and tools, "expected a non-empty list of tools"

if api == "openai":
    from openai.types.chat import ChatCompletionFunctionToolParam as Param
    from openai.types.shared_params import FunctionDefinition

    names = [t["function"]["name"] for t in tools]
    adapter_fn = TypeAdapter(FunctionDefinition)
    for t in tools:
        adapter_fn.validate_python(t["function"])
elif api == "anthropic":
    from anthropic.types import ToolParam as Param

    names = [t["name"] for t in tools]
else:
    sys.exit(f"unknown api {api!r}")

adapter = TypeAdapter(Param)
for t in tools:
    back = adapter.dump_python(adapter.validate_python(t), exclude_unset=True)
    assert back == t, f"{api}: changed by its type:\n{t}\n{back}"
# Both APIs take an object's schema only.
for t in tools:
    schema = t["function"]["parameters"] if api == "openai" else t["input_schema"]
    assert schema.get("type") == "object", f"{api}: not an object's schema: {t}"
# Both APIs take names of 1 to 64 of these characters.
for n in names:
    assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", n), f"{api}: bad tool name {n!r}"
assert len(set(names)) == len(names), f"{api}: repeated names {names}"
print(f"ok {len(tools)}")
