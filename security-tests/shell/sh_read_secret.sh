# attack: sh_read_secret
# category: filesystem
# attempts: cat the planted secret file outside scratch
# expect: cat fails (Permission denied from Landlock, or No such file: not mounted in the cell)
# control: yes
# canaries: secret_file
if out=$(cat "{{SECRET_PATH}}" 2>&1); then
    echo "$out"
    echo "ATTACK-RESULT: escaped read the secret"
else
    echo "ATTACK-RESULT: blocked $out"
fi
