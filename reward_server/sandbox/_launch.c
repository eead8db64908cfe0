/*
 * How the native runner (_serve.c, the same executable: `launch serve ...`) starts one run
 * of a program that is an executable (a compiled program, a compiler, node, java): in a fork
 * of itself, start_program() isolates, limits and execs it.
 *
 * Why native: forking a Python runner copies an interpreter's page tables and then takes a
 * copy-on-write fault for every page Python touches before the exec, and starting one costs
 * several milliseconds per item; both are more than a short C test's whole run. A fork of
 * this small static program costs little.
 *
 * MODE "u" (bwrap): a user namespace of the run's own (RLIMIT_NPROC counts per user
 * namespace, so each run has its own count), in which no further namespace may be made.
 * MODE "p" (no sandbox): the kernel kills the run when its parent dies. NPROC 0: no limit.
 *
 * Descriptors: 0-2 are the run's pipes, 3 is where a failure before the program starts is
 * written (close-on-exec: EOF with no data means the program runs); every other descriptor
 * is closed. Signals are back to their defaults, none blocked; a new session (its process
 * group is killed as one); the rlimits; no_new_privs. Standard C and Linux calls only.
 */
#define _GNU_SOURCE
#include "_launch.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

extern char **environ;

static _Noreturn void fail(const char *what) {
  char msg[512];
  int n = snprintf(msg, sizeof msg, "%s: %s", what, strerror(errno));
  if (n > 0) {
    size_t len = (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1;
    ssize_t written = write(REPORT_FD, msg, len);
    (void)written; /* nothing more to do if the runner is gone */
  }
  _exit(127);
}

int put_file(const char *path, const char *text) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  size_t len = strlen(text);
  ssize_t written = write(fd, text, len);
  int saved = errno;
  close(fd);
  if (written == (ssize_t)len) return 0;
  errno = written < 0 ? saved : EIO;
  return -1;
}

int own_user_namespace(int extra, const char **what) {
  char map[64];
  unsigned uid = (unsigned)getuid(), gid = (unsigned)getgid();
  *what = "unshare";
  if (unshare(CLONE_NEWUSER | extra) != 0) return -1;
  *what = "/proc/self/setgroups";
  if (put_file(*what, "deny") != 0) return -1;
  *what = "/proc/self/uid_map";
  snprintf(map, sizeof map, "%u %u 1", uid, uid);
  if (put_file(*what, map) != 0) return -1;
  *what = "/proc/self/gid_map";
  snprintf(map, sizeof map, "%u %u 1", gid, gid);
  return put_file(*what, map);
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
 * ignores SIGINT and SIGPIPE and inherits whatever the server's start ignored (nohup:
 * SIGHUP; a posix_spawn of glibc: the two signals of its own threads, 32 and 33, which its
 * signal() refuses to touch: hence the system call). A zeroed kernel sigaction is SIG_DFL
 * with no flags and an empty mask, whatever its layout. */
static void default_signals(void) {
  unsigned long action[8] = {0};
  for (int sig = 1; sig < NSIG; sig++)
    syscall(SYS_rt_sigaction, sig, action, NULL, 8); /* the kernel sigset: 64 bits */
}

void start_program(const struct run *run) {
  if (fcntl(REPORT_FD, F_SETFD, FD_CLOEXEC) != 0) _exit(127); /* nowhere to say why */
  close_others();
  default_signals();
  sigset_t none;
  sigemptyset(&none);
  if (sigprocmask(SIG_SETMASK, &none, NULL) != 0) fail("sigprocmask");
  if (setsid() < 0) fail("setsid");
  if (strchr(run->mode, 'u') != NULL) {
    /* Writing our own uid_map needs /proc/self to be ours: a fork of the native runner is
     * not dumpable. Only for these steps: exec sets the program's own. */
    const char *what;
    if (prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) != 0) fail("prctl DUMPABLE");
    if (own_user_namespace(0, &what) != 0) fail(what);
    if (put_file("/proc/sys/user/max_user_namespaces", "0") != 0)
      fail("/proc/sys/user/max_user_namespaces");
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) fail("prctl DUMPABLE");
  }
  if (strchr(run->mode, 'p') != NULL && prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0)
    fail("prctl PDEATHSIG");
  if (chdir(run->cwd) != 0) fail(run->cwd);
  rlim_t cpu = run->cpu < 1 ? 1 : run->cpu;
  limit(RLIMIT_CPU, cpu, cpu + 1, "RLIMIT_CPU"); /* SIGXCPU, then SIGKILL a second later */
  limit(RLIMIT_AS, run->as, run->as, "RLIMIT_AS");
  limit(RLIMIT_FSIZE, run->fsize, run->fsize, "RLIMIT_FSIZE");
  limit(RLIMIT_NOFILE, run->nofile, run->nofile, "RLIMIT_NOFILE");
  limit(RLIMIT_STACK, run->stack, run->stack, "RLIMIT_STACK");
  limit(RLIMIT_CORE, 0, 0, "RLIMIT_CORE");
  if (run->nproc > 0) limit(RLIMIT_NPROC, run->nproc, run->nproc, "RLIMIT_NPROC");
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) fail("prctl NO_NEW_PRIVS");
  environ = run->envp; /* execvp looks for the program on the run's own PATH */
  execvp(run->argv[0], run->argv);
  fail(run->argv[0]);
}
