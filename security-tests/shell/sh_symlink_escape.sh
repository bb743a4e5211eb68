# attack: sh_symlink_escape
# category: filesystem
# attempts: symlinks in scratch to the outside dir and to the secret; write and read through them
# expect: access through the links fails like direct access
# control: yes
# canaries: scratch_escape, secret_file
ln -s "{{OUTSIDE_DIR}}" outdir
ln -s "{{SECRET_PATH}}" secret
n=0
echo x > outdir/sh-via-link 2>/dev/null && n=$((n+1))
cat secret 2>/dev/null && n=$((n+1))
if [ "$n" -gt 0 ]; then
    echo "ATTACK-RESULT: escaped $n accesses through symlinks"
else
    echo "ATTACK-RESULT: blocked symlinked accesses failed"
fi
