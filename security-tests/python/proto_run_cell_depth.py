# attack: proto_run_cell_depth
# category: protocol
# attempts: a run_cell that calls itself recursively, aiming for 40 levels of nested workers
# expect: the depth limit refuses the nesting after max_depth levels (an error/denial at that depth), long before 40
# control: no
# canaries: none
# status: ok,error,limit_exceeded,policy_denied
# timeout: 60
tpl = 'n = {n}\ntpl = {tpl!r}\nif n >= 40:\n    r = "DEPTH-REACHED-40"\nelse:\n    r = run_cell("python", tpl.format(n=n + 1, tpl=tpl))\nr\n'
try:
    r = run_cell("python", tpl.format(n=1, tpl=tpl))
    text = repr(r)
    print(text[:3000])
    if "DEPTH-REACHED-40" in text:
        print("ATTACK-RESULT: escaped nested run_cell reached depth 40", flush=True)
    else:
        print("ATTACK-RESULT: blocked nesting stopped before depth 40", flush=True)
except Exception as e:
    print("ATTACK-RESULT: blocked %s: %s" % (type(e).__name__, str(e)[:300]), flush=True)
