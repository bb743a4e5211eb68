# attack: sh_read_shadow
# category: filesystem
# attempts: read /etc/shadow and print its digest
# expect: read fails (Permission denied / No such file)
# control: yes
# canaries: host_files
if err=$(cat /etc/shadow 2>&1 >/dev/null) && out=$(sha256sum < /etc/shadow); then
    echo "DIGEST:${out%% *}"
    echo "ATTACK-RESULT: escaped read /etc/shadow"
else
    echo "ATTACK-RESULT: blocked $err"
fi
