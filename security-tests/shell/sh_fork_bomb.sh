# attack: sh_fork_bomb
# category: resource
# attempts: start background sleeps until fork fails (bounded at 3000 processes, each lives 4 s)
# expect: fork fails at the cell's process limit well below 3000 (or the cell is killed)
# control: no
# canaries: none
# status: ok,error,limit_exceeded,killed
# timeout: 20
# dash exits when a fork fails, so the bomb runs in a subshell that records
# its progress in a file; the parent reads it back with builtins only.
(
    i=0
    while [ $i -lt 3000 ]; do
        sleep 4 &
        i=$((i+1))
        echo $i > count
    done
) 2>/dev/null
n=0
read n < count
if [ "$n" -ge 3000 ]; then
    echo "ATTACK-RESULT: escaped started $n background processes"
else
    echo "ATTACK-RESULT: blocked fork failed after $n background processes"
fi
