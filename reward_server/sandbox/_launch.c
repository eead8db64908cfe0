/*
 * The sandbox's native launcher: how the runner (_runner.py) starts a program that is an
 * executable (a compiled program, a compiler, node, java), in place of a fork of itself.
 *
 * Why: forking the runner copies a Python interpreter's page tables and then takes a
 * copy-on-write fault for every page Python touches before the exec; that costs more than a
 * short C test's whole run. The runner posix_spawn()s this launcher instead (glibc does a
 * vfork: nothing is copied), and the launcher does what the forked runner did, then execs
 * the program:
 *
 *   launch MODE CWD CPU_S AS_BYTES FSIZE_BYTES NOFILE STACK_BYTES NPROC -- PROGRAM ARGS...
 *
 * MODE "u" (bwrap): a user namespace of the run's own (RLIMIT_NPROC counts per user
 * namespace, so each run has its own count), in which no further namespace may be made.
 * MODE "p" (no sandbox): the kernel kills the run when the runner dies. NPROC 0: no limit.
 *
 * Descriptors: 0-2 are the run's pipes, 3 is where a failure before the program starts is
 * written (close-on-exec: EOF with no data means the program runs); every other descriptor
 * is closed. Signals are back to their defaults, none blocked; a new session (its process
 * group is killed as one); the rlimits; no_new_privs. Standard C and Linux calls only.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#define REPORT_FD 3
#define ARGS 9 /* MODE .. NPROC, then "--" */

static void fail(const char *what) {
  char msg[512];
  int n = snprintf(msg, sizeof msg, "%s: %s", what, strerror(errno));
  if (n > 0) {
    size_t len = (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1;
    ssize_t written = write(REPORT_FD, msg, len);
    (void)written; /* nothing more to do if the runner is gone */
  }
  _exit(127);
}

static void write_file(const char *path, const char *text) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) fail(path);
  size_t len = strlen(text);
  if (write(fd, text, len) != (ssize_t)len) fail(path);
  close(fd);
}

static rlim_t number(const char *text, const char *what) {
  char *end;
  errno = 0;
  unsigned long long value = strtoull(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0') {
    errno = EINVAL;
    fail(what);
  }
  return (rlim_t)value;
}

/* soft/hard, never above the hard limit the runner already has (only root could raise it). */
static void limit(int which, rlim_t soft, rlim_t hard, const char *what) {
  struct rlimit now;
  if (getrlimit(which, &now) != 0) fail(what);
  if (now.rlim_max != RLIM_INFINITY && hard > now.rlim_max) hard = now.rlim_max;
  if (soft > hard) soft = hard;
  struct rlimit lim = {soft, hard};
  if (setrlimit(which, &lim) != 0) fail(what);
}

static void own_user_namespace(void) {
  char map[64];
  unsigned uid = (unsigned)getuid(), gid = (unsigned)getgid();
  if (unshare(CLONE_NEWUSER) != 0) fail("unshare");
  write_file("/proc/self/setgroups", "deny");
  snprintf(map, sizeof map, "%u %u 1", uid, uid);
  write_file("/proc/self/uid_map", map);
  snprintf(map, sizeof map, "%u %u 1", gid, gid);
  write_file("/proc/self/gid_map", map);
  write_file("/proc/sys/user/max_user_namespaces", "0");
}

/* Every descriptor above REPORT_FD closed (close_range, else one by one from /proc). */
static void close_others(void) {
#ifdef SYS_close_range
  if (syscall(SYS_close_range, REPORT_FD + 1, ~0U, 0) == 0) return;
#endif
  DIR *dir = opendir("/proc/self/fd");
  if (dir == NULL) fail("/proc/self/fd");
  int own = dirfd(dir);
  int fds[1024], count = 0;
  struct dirent *entry;
  while ((entry = readdir(dir)) != NULL && count < 1024) {
    int fd = atoi(entry->d_name);
    if (fd > REPORT_FD && fd != own) fds[count++] = fd;
  }
  closedir(dir);
  for (int i = 0; i < count; i++) close(fds[i]);
}

/* Every signal's action back to the default: an exec keeps ignored ones, and the runner
 * ignores SIGINT, Python SIGPIPE and SIGXFSZ, and glibc's posix_spawn the two signals of its
 * own threads (32, 33), which its signal() refuses to touch: hence the system call. A zeroed
 * kernel sigaction is SIG_DFL with no flags and an empty mask, whatever its layout. */
static void default_signals(void) {
  unsigned long action[8] = {0};
  for (int sig = 1; sig < NSIG; sig++)
    syscall(SYS_rt_sigaction, sig, action, NULL, 8); /* the kernel sigset: 64 bits */
}

int main(int argc, char **argv) {
  if (argc < ARGS + 2 || strcmp(argv[ARGS], "--") != 0) {
    errno = EINVAL;
    fail("launch: MODE CWD CPU_S AS FSIZE NOFILE STACK NPROC -- PROGRAM ARGS...");
  }
  if (fcntl(REPORT_FD, F_SETFD, FD_CLOEXEC) != 0) _exit(127); /* nowhere to say why */
  close_others();
  default_signals();
  sigset_t none;
  sigemptyset(&none);
  if (sigprocmask(SIG_SETMASK, &none, NULL) != 0) fail("sigprocmask");
  if (setsid() < 0) fail("setsid");
  const char *mode = argv[1];
  if (strchr(mode, 'u') != NULL) own_user_namespace();
  if (strchr(mode, 'p') != NULL && prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0)
    fail("prctl PDEATHSIG");
  if (chdir(argv[2]) != 0) fail(argv[2]);
  rlim_t cpu = number(argv[3], "cpu");
  if (cpu < 1) cpu = 1;
  limit(RLIMIT_CPU, cpu, cpu + 1, "RLIMIT_CPU"); /* SIGXCPU, then SIGKILL a second later */
  rlim_t as = number(argv[4], "as"), fsize = number(argv[5], "fsize");
  rlim_t nofile = number(argv[6], "nofile"), stack = number(argv[7], "stack");
  rlim_t nproc = number(argv[8], "nproc");
  limit(RLIMIT_AS, as, as, "RLIMIT_AS");
  limit(RLIMIT_FSIZE, fsize, fsize, "RLIMIT_FSIZE");
  limit(RLIMIT_NOFILE, nofile, nofile, "RLIMIT_NOFILE");
  limit(RLIMIT_STACK, stack, stack, "RLIMIT_STACK");
  limit(RLIMIT_CORE, 0, 0, "RLIMIT_CORE");
  if (nproc > 0) limit(RLIMIT_NPROC, nproc, nproc, "RLIMIT_NPROC");
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) fail("prctl NO_NEW_PRIVS");
  execvp(argv[ARGS + 1], argv + ARGS + 1);
  fail(argv[ARGS + 1]);
  return 127;
}
