# attack: proto_call_flood
# category: protocol
# attempts: 100000 capability calls through the cell's own API (emit, then the generic call)
# expect: the call budget stops the flood long before 100000 (an exception in the cell or a limit status)
# control: no
# canaries: supervisor_rss
# status: ok,error,limit_exceeded,policy_denied
# timeout: 30
n = 0
try:
    while n < 100000:
        emit({"i": n})
        n += 1
    print("ATTACK-RESULT: escaped 100000 calls accepted", flush=True)
except Exception as e:
    print("ATTACK-RESULT: blocked %s after %d calls: %s" % (type(e).__name__, n, str(e)[:200]), flush=True)
