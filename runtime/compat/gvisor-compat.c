/*
 * Preloaded into every dynamically linked program of the runtime image (/etc/ld.so.preload).
 *
 * gVisor's kernel (runsc, Debian's 2022-12-19 release) answers EINVAL to statx and newfstatat
 * calls that carry AT_NO_AUTOMOUNT, which bookworm's coreutils pass on every call: `ls`, `stat`
 * and friends then fail on every path ("cannot access '.': Invalid argument"). The flag only
 * stops a stat from triggering an automount, and a container has no automount points, so it is
 * dropped here; every other flag and argument reaches the kernel unchanged. Under runc it changes
 * nothing. Built by airlockd/sandbox/compat.py with the host's C compiler.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

struct stat;
struct statx;

int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *buf) {
    return (int)syscall(SYS_statx, dirfd, path, flags & ~AT_NO_AUTOMOUNT, mask, buf);
}

int fstatat(int dirfd, const char *path, struct stat *buf, int flags) {
    return (int)syscall(SYS_newfstatat, dirfd, path, buf, flags & ~AT_NO_AUTOMOUNT);
}

int fstatat64(int dirfd, const char *path, struct stat *buf, int flags) __attribute__((alias("fstatat")));
