//! The attacks built into the binary, so `cellbox security-test` works outside
//! the repository. One line per file in `security-tests/`; the `security` cargo
//! test fails, naming the missing line, when this list and the directory differ.

use super::attack::{Attack, AttackError};

macro_rules! attacks {
    ($($path:literal),* $(,)?) => {
        /// `(path relative to security-tests/, source)` for every attack.
        pub const EMBEDDED: &[(&str, &str)] = &[
            $(($path, include_str!(concat!("../../security-tests/", $path))),)*
        ];
    };
}

attacks![
    "python/fs_dev_kmsg.py",
    "python/fs_dev_mem.py",
    "python/fs_dotdot_traversal.py",
    "python/fs_hardlink.py",
    "python/fs_list_root_home.py",
    "python/fs_mknod.py",
    "python/fs_open_by_handle.py",
    "python/fs_proc1_environ.py",
    "python/fs_proc_pid_root.py",
    "python/fs_proc_self_exe_write.py",
    "python/fs_proc_self_mem_write.py",
    "python/fs_proc_sys_write.py",
    "python/fs_read_etc_shadow.py",
    "python/fs_read_secret_file.py",
    "python/fs_rename_out.py",
    "python/fs_rename_swap_race.py",
    "python/fs_supervisor_cmdline.py",
    "python/fs_supervisor_environ.py",
    "python/fs_supervisor_fds.py",
    "python/fs_supervisor_mem.py",
    "python/fs_symlink_read.py",
    "python/fs_symlink_write.py",
    "python/fs_walk_root.py",
    "python/fs_write_host_tmp.py",
    "python/fs_write_outside.py",
    "python/leak_env_api_key.py",
    "python/leak_host_processes.py",
    "python/leak_hostname.py",
    "python/leak_inherited_fds.py",
    "python/leak_kernel_addresses.py",
    "python/leak_network_interfaces.py",
    "python/net_bind_listen.py",
    "python/net_dns_query.py",
    "python/net_io_uring_connect.py",
    "python/net_netlink_route.py",
    "python/net_packet_socket.py",
    "python/net_raw_socket.py",
    "python/net_tcp_loopback.py",
    "python/net_tcp_v4mapped.py",
    "python/net_udp_loopback.py",
    "python/net_unix_abstract.py",
    "python/net_unix_pathname.py",
    "python/net_vsock.py",
    "python/proc_bpf.py",
    "python/proc_capabilities.py",
    "python/proc_chroot.py",
    "python/proc_clone3.py",
    "python/proc_clone_ns_flags.py",
    "python/proc_ctypes_raw_syscall.py",
    "python/proc_ctypes_system.py",
    "python/proc_daemon_setsid.py",
    "python/proc_exec_setuid.py",
    "python/proc_exec_shell.py",
    "python/proc_init_module.py",
    "python/proc_int80_i386.py",
    "python/proc_kexec_load.py",
    "python/proc_keyctl.py",
    "python/proc_kill_all.py",
    "python/proc_kill_victim.py",
    "python/proc_memfd_exec.py",
    "python/proc_mount.py",
    "python/proc_perf_event_open.py",
    "python/proc_personality.py",
    "python/proc_pivot_root.py",
    "python/proc_ptrace_supervisor.py",
    "python/proc_raise_rlimits.py",
    "python/proc_setns.py",
    "python/proc_setuid_root.py",
    "python/proc_signal_parent.py",
    "python/proc_signal_supervisor.py",
    "python/proc_tiocsti.py",
    "python/proc_tiocsti_highbits.py",
    "python/proc_unshare.py",
    "python/proc_userfaultfd.py",
    "python/proc_vm_readv_supervisor.py",
    "python/proc_x32_syscall.py",
    "python/proto_call_flood.py",
    "python/proto_capability_spoof.py",
    "python/proto_forged_stdout.py",
    "python/proto_garbage_frames.py",
    "python/proto_oversize_body.py",
    "python/proto_oversize_length.py",
    "python/proto_raw_call_flood.py",
    "python/proto_run_cell_depth.py",
    "python/proto_run_cell_fanout.py",
    "python/proto_wrong_direction.py",
    "python/res_bigint_pow.py",
    "python/res_cpu_spin.py",
    "python/res_del_timebomb.py",
    "python/res_disk_fill.py",
    "python/res_disk_fill_many_files.py",
    "python/res_fd_exhaustion.py",
    "python/res_fork_bomb.py",
    "python/res_giant_line.py",
    "python/res_memory_bomb.py",
    "python/res_memory_fork_bomb.py",
    "python/res_output_flood.py",
    "python/res_thread_bomb.py",
    "rhai/rhai_call_flood.rhai",
    "rhai/rhai_deep_nesting.rhai",
    "rhai/rhai_deep_recursion.rhai",
    "rhai/rhai_denied_caps.rhai",
    "rhai/rhai_eval.rhai",
    "rhai/rhai_forged_print.rhai",
    "rhai/rhai_giant_array.rhai",
    "rhai/rhai_giant_map.rhai",
    "rhai/rhai_giant_string.rhai",
    "rhai/rhai_import_module.rhai",
    "rhai/rhai_infinite_loop.rhai",
    "rhai/rhai_run_cell_depth.rhai",
    "rhai/rhai_run_cell_fanout.rhai",
    "rhai/rhai_sleep_past_timeout.rhai",
    "rhai/rhai_string_pad_bomb.rhai",
    "rhai/rhai_unregistered_fns.rhai",
    "shell/sh_cgroup_move.sh",
    "shell/sh_chroot.sh",
    "shell/sh_daemon_setsid.sh",
    "shell/sh_dev_kmsg.sh",
    "shell/sh_disk_fill.sh",
    "shell/sh_disk_fill_many_files.sh",
    "shell/sh_env_leak.sh",
    "shell/sh_fork_bomb.sh",
    "shell/sh_host_identity.sh",
    "shell/sh_kill_victim.sh",
    "shell/sh_mknod.sh",
    "shell/sh_mount_tmpfs.sh",
    "shell/sh_nsenter_supervisor.sh",
    "shell/sh_proc_listing.sh",
    "shell/sh_proto_fd3.sh",
    "shell/sh_read_secret.sh",
    "shell/sh_read_shadow.sh",
    "shell/sh_setuid_su.sh",
    "shell/sh_supervisor_environ.sh",
    "shell/sh_symlink_escape.sh",
    "shell/sh_tcp_dev_tcp.sh",
    "shell/sh_unshare_root.sh",
    "shell/sh_write_outside.sh",
];

/// Parse every embedded attack.
pub fn load() -> Result<Vec<Attack>, AttackError> {
    EMBEDDED
        .iter()
        .map(|(path, src)| Attack::parse(path, src))
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_embedded_attack_parses() {
        let all = super::load().unwrap();
        assert_eq!(all.len(), super::EMBEDDED.len());
    }
}
