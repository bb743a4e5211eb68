# attack: sh_symlink_escape
# category: filesystem
# attempts: symlinks in scratch to the outside dir and to the secret; write and read through them
# expect: access through the links fails like direct access
# control: yes
# canaries: scratch_escape, secret_file
ln -s "{{OUTSIDE_DIR}}" outdir
ln -s "{{SECRET_PATH}}" secret
n=0
if e1=$(sh -c 'echo x > outdir/sh-via-link' 2>&1); then n=$((n+1)); fi
if out=$(cat secret 2>&1); then echo "$out"; n=$((n+1)); else e2="$out"; fi
if [ "$n" -gt 0 ]; then
    echo "ATTACK-RESULT: escaped $n accesses through symlinks"
else
    echo "ATTACK-RESULT: blocked $e1 | $e2"
fi
