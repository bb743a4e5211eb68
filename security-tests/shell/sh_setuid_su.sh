# attack: sh_setuid_su
# category: process
# attempts: run setuid-root su with a held-open stdin and read its effective uid from /proc while it waits
# expect: exec fails, or no_new_privs keeps its euid that of the cell (never 0)
# control: yes
# canaries: none
PATH="$PATH:/usr/sbin:/sbin"
if [ "$(id -u)" = 0 ]; then
    echo "ATTACK-RESULT: escaped the cell itself runs as uid 0"
    exit 0
fi
sleep 3 | su >/dev/null 2>&1 &
sleep 0.5
euid=""
for p in $(pgrep -x su 2>/dev/null); do
    euid=$(awk '/^Uid:/ {print $3}' /proc/$p/status 2>/dev/null)
done
kill %1 2>/dev/null
if [ "$euid" = 0 ]; then
    echo "ATTACK-RESULT: escaped su ran with euid 0"
else
    echo "ATTACK-RESULT: blocked su euid is '${euid:-none}'"
fi
