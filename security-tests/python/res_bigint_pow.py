# attack: res_bigint_pow
# category: resource
# attempts: 10**10**8, a single C-level operation that holds the interpreter for minutes
# expect: the wall timeout kills the worker mid-operation (the supervisor does not wait for the bytecode loop)
# control: no
# canaries: none
# status: timeout,limit_exceeded,killed
# timeout: 2
x = 10**10**8
print("ATTACK-RESULT: escaped the computation finished", flush=True)
