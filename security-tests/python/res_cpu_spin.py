# attack: res_cpu_spin
# category: resource
# attempts: spin the CPU forever in pure Python
# expect: the wall timeout (or RLIMIT_CPU) ends the cell
# control: no
# canaries: none
# status: timeout,limit_exceeded,killed
# timeout: 2
while True:
    pass
