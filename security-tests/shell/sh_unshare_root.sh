# attack: sh_unshare_root
# category: process
# attempts: unshare -Ur (a user namespace where the cell is root) and unshare -n
# expect: unshare fails (EPERM from seccomp) or cannot be executed
# control: yes
# canaries: none
PATH="$PATH:/usr/sbin:/sbin"
if out=$(unshare -Ur id -u 2>&1) && [ "$out" = 0 ]; then
    echo "ATTACK-RESULT: escaped became root in a new user namespace"
elif e=$(unshare -n true 2>&1); then
    echo "ATTACK-RESULT: escaped created a network namespace"
else
    echo "ATTACK-RESULT: blocked $out | $e"
fi
