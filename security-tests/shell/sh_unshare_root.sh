# attack: sh_unshare_root
# category: process
# attempts: unshare -Ur (a user namespace where the cell is root) and unshare -n
# expect: unshare fails (EPERM from seccomp) or cannot be executed
# control: yes
# canaries: none
PATH="$PATH:/usr/sbin:/sbin"
if unshare -Ur id -u 2>/dev/null | grep -qx 0; then
    echo "ATTACK-RESULT: escaped became root in a new user namespace"
elif unshare -n true 2>/dev/null; then
    echo "ATTACK-RESULT: escaped created a network namespace"
else
    echo "ATTACK-RESULT: blocked unshare failed"
fi
