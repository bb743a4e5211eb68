# attack: proto_capability_spoof
# category: protocol
# attempts: rebind every capability name in the cell's globals, then call capabilities under spoofed names (case, NUL, zero-width, path, 1 MiB name) and denied ones (model_query, tool_call, read_file)
# expect: every spoofed or denied call fails (PermissionError / unknown capability); nothing outside the policy runs
# control: no
# canaries: none
# status: ok,error,policy_denied,protocol_error
raw_call = call
names = ("answer", "emit", "run_cell", "model_query", "tool_call", "read_file", "list_dir", "search_files", "call")
for name in names:
    globals()[name] = lambda *a, **k: "rebound"
attempts = [
    ("model_query", {"prompt": "hi"}),
    ("tool_call", {"name": "anything", "args": {}}),
    ("read_file", {"path": "{{SECRET_PATH}}"}),
    ("list_dir", {"path": "/"}),
    ("Run_Cell", {"language": "python", "code": "1"}),
    ("emit\x00model_query", {"event": {}}),
    ("model_query\u200b", {"prompt": "hi"}),
    ("../model_query", {"prompt": "hi"}),
    (" emit", {"event": {}}),
    ("x" * (1 << 20), {}),
]
granted = []
denied = []
for name, args in attempts:
    try:
        r = raw_call(name, **args)
        granted.append("%r->%r" % (name[:20], str(r)[:60]))
    except Exception as e:
        denied.append(type(e).__name__)
if granted:
    print("ATTACK-RESULT: escaped spoofed/denied calls returned:", "; ".join(granted), flush=True)
else:
    print("ATTACK-RESULT: blocked all %d calls refused (%s)" % (len(denied), ",".join(sorted(set(denied)))), flush=True)
