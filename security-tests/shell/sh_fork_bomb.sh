# attack: sh_fork_bomb
# category: resource
# attempts: start background sleeps until fork fails (bounded at 3000 processes, each lives 4 s)
# expect: fork fails at the cell's process limit well below 3000 (or the cell is killed)
# control: no
# canaries: none
# status: ok,error,limit_exceeded,killed
# timeout: 20
i=0
while [ $i -lt 3000 ]; do
    if ! sleep 4 2>/dev/null & then break; fi
    i=$((i+1))
done
running=$(jobs -p | wc -l)
if [ "$running" -ge 3000 ]; then
    echo "ATTACK-RESULT: escaped $running background processes"
else
    echo "ATTACK-RESULT: blocked only $running background processes"
fi
