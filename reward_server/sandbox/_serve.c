/*
 * The native runner: PID 1 of an item's sandbox whose programs are executables (compiled
 * programs, node, java; Python programs have the warm Python runner, _runner.py). It does
 * without an interpreter's start, which would be most of such an item's start-up:
 *
 *   launch serve MODE ROOT CONTROL_FD WORKDIR_BYTES INODES -- FILE...
 *
 * MODE "bwrap" (PID 1 of the sandbox's PID namespace) or "none" (a plain process, a
 * subreaper); ROOT holds prog/ (the item's FILEs) and work/; CONTROL_FD is its end of the
 * server's SOCK_SEQPACKET socket (_message.c: the messages and reports).
 *
 * At start, in bwrap mode, it enters a user and mount namespace of its own: the work
 * directory becomes a tmpfs with a size and an inode cap (bwrap cannot cap inodes), and
 * prog/ is remounted read-only once built ("seal"). Each job is a fork of this small
 * program that calls start_program() (_launch.c) in a fresh directory work/tN holding links
 * to the item's files (the build runs in prog/). The runner kills a job at its wall-clock
 * deadline (its process group, then whatever escaped it: orphans come back to PID 1, and a
 * scan kills them five times a second) and reports its wait status, CPU and wall time.
 * When the socket closes, it kills everything and exits.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "_launch.h"

#define MAX_JOBS 256
#define MAX_CHILDREN 8192
#define SCAN_S 0.2   /* seconds between scans for processes that escaped their job */
#define SETTLE_S 0.25 /* at most this long killing a finished job's leftovers at once */
#define RMTREE_DEPTH 200

extern char **environ;

struct job {
  long id;
  pid_t pid; /* 0: a free slot */
  int err_r;
  int seal, timed_out, killed;
  double started, deadline;
  unsigned test; /* its directory work/tN; 0: none (the build runs in prog/) */
};

struct ended {
  struct job job;
  int status;
  struct rusage usage;
  double at;
};

static struct {
  int bwrap, ctl;
  const char *root;
  char prog[1024], work[1024]; /* ROOT is short: /sandbox, or a temporary folder */
  char **files;
  int nfiles;
  struct job jobs[MAX_JOBS];
  unsigned counter;
  double next_scan;
} R;

static char message[MAX_MESSAGE];

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void replyf(long id, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void replyf(long id, const char *fmt, ...) {
  char text[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  reply(R.ctl, id, text);
}

/* -- the item's folders ------------------------------------------------------------------ */
static int make_dirs(char *path) { /* mkdir -p, in place */
  for (char *slash = strchr(path + 1, '/'); slash != NULL; slash = strchr(slash + 1, '/')) {
    *slash = '\0';
    int made = mkdir(path, 0700);
    *slash = '/';
    if (made != 0 && errno != EEXIST) return -1;
  }
  return mkdir(path, 0700) != 0 && errno != EEXIST ? -1 : 0;
}

/* A fresh directory holding links to the program's files (read-only). */
static int make_test_dir(const char *tdir) {
  char link[PATH_MAX], target[PATH_MAX];
  if (mkdir(tdir, 0700) != 0) return -1;
  for (int i = 0; i < R.nfiles; i++) {
    if (snprintf(link, sizeof link, "%s/%s", tdir, R.files[i]) >= (int)sizeof link ||
        snprintf(target, sizeof target, "%s/%s", R.prog, R.files[i]) >= (int)sizeof target) {
      errno = ENAMETOOLONG;
      return -1;
    }
    char *parent = strrchr(link, '/');
    if (parent - link > (ptrdiff_t)strlen(tdir)) { /* a file in a subfolder */
      *parent = '\0';
      int made = make_dirs(link);
      *parent = '/';
      if (made != 0) return -1;
    }
    if (symlink(target, link) != 0) return -1;
  }
  return 0;
}

/* Remove `name` under `parent` whatever the program did to it (modes, links); 0 if gone. */
static int remove_tree(int parent, const char *name, int depth) {
  if (unlinkat(parent, name, 0) == 0) return 0;
  if (errno != EISDIR && errno != EPERM) return errno == ENOENT ? 0 : -1;
  (void)!fchmodat(parent, name, 0700, 0); /* best effort: unlinkat below says if it went */
  int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) {
    DIR *dir = depth < RMTREE_DEPTH ? fdopendir(fd) : NULL;
    if (dir == NULL) {
      close(fd);
    } else {
      /* Entries removed while reading may hide others: read again until a pass is empty. */
      for (int pass = 0, removed = 1; removed && pass < 4; pass++) {
        removed = 0;
        rewinddir(dir);
        for (struct dirent *e; (e = readdir(dir)) != NULL;) {
          if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            removed += remove_tree(dirfd(dir), e->d_name, depth + 1) == 0;
        }
      }
      closedir(dir);
    }
  }
  return unlinkat(parent, name, AT_REMOVEDIR);
}

static void test_dir(char *out, size_t size, unsigned test) {
  snprintf(out, size, "%s/t%u", R.work, test);
}

/* The program's folder read-only, its build included (the whole tmpfs holding it; the work
 * directory is a mount of its own and stays writable). */
static int seal(void) {
  if (!R.bwrap) return 0;
  return mount(NULL, R.root, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV,
               NULL);
}

/* -- processes --------------------------------------------------------------------------- */
static struct job *job_by_pid(pid_t pid) {
  for (int i = 0; i < MAX_JOBS; i++)
    if (R.jobs[i].pid == pid && pid != 0) return &R.jobs[i];
  return NULL;
}

static struct job *job_by_id(long id) {
  for (int i = 0; i < MAX_JOBS; i++)
    if (R.jobs[i].pid != 0 && R.jobs[i].id == id) return &R.jobs[i];
  return NULL;
}

static int active_jobs(void) {
  int count = 0;
  for (int i = 0; i < MAX_JOBS; i++) count += R.jobs[i].pid != 0;
  return count;
}

static void kill_job(const struct job *job) {
  kill(-job->pid, SIGKILL);
  kill(job->pid, SIGKILL);
}

/* The runner's children, from /proc (orphans are re-parented to it). */
static int children(pid_t *out, int max) {
  static char text[MAX_CHILDREN * 8];
  char path[64];
  pid_t self = getpid();
  snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)self, (int)self);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  size_t len = 0;
  for (ssize_t n; len < sizeof text - 1 && (n = read(fd, text + len, sizeof text - 1 - len));) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    len += (size_t)n;
  }
  close(fd);
  text[len] = '\0';
  int count = 0;
  for (char *p = text, *end; count < max; p = end) {
    long pid = strtol(p, &end, 10);
    if (end == p) break;
    out[count++] = (pid_t)pid;
  }
  return count;
}

/* Kill every child that is not a job (it outlived the job that started it); any found. */
static int kill_orphans(int reap) {
  static pid_t kids[MAX_CHILDREN];
  int count = children(kids, MAX_CHILDREN), found = 0;
  for (int i = 0; i < count; i++) {
    if (job_by_pid(kids[i]) != NULL) continue;
    found = 1;
    kill(kids[i], SIGKILL);
    if (reap) waitpid(kids[i], NULL, WNOHANG);
  }
  return found;
}

/* Kill and reap the children that are not jobs until there are none (their parents just
 * died, so they are still being re-parented here), for at most SETTLE_S; the periodic scan
 * gets any that come later. */
static void settle(void) {
  double deadline = now() + SETTLE_S;
  while (kill_orphans(1) && now() <= deadline) {
    struct timespec pause = {0, 2000000};
    nanosleep(&pause, NULL);
  }
}

/* -- jobs -------------------------------------------------------------------------------- */
/* The job's environment: the runner's (the sandbox's), with the message's entries over it;
 * static, in the forked job only (the runner's own was counted at start: at most MAX_ENV). */
static char **job_environment(char **entries, int count) {
  static char *env[2 * MAX_ENV + 1];
  int n = 0;
  for (char **base = environ; *base != NULL; base++) {
    size_t key = strcspn(*base, "=");
    int replaced = 0;
    for (int j = 0; j < count && !replaced; j++)
      replaced = strncmp(entries[j], *base, key + 1) == 0;
    if (!replaced) env[n++] = *base;
  }
  for (int j = 0; j < count; j++) env[n++] = entries[j];
  env[n] = NULL;
  return env;
}

/* The forked job: the run's pipes as 0-2 and the report pipe as 3 (moved above 9 first so
 * that no move overwrites a later one's source), then the launcher's steps. */
static _Noreturn void job_child(const int fds[3], int err_w, struct run *run) {
  int moved[4], sources[4] = {fds[0], fds[1], fds[2], err_w};
  for (int i = 0; i < 4; i++)
    if ((moved[i] = fcntl(sources[i], F_DUPFD_CLOEXEC, 10)) < 0) _exit(127);
  for (int i = 0; i < 4; i++)
    if (dup2(moved[i], i) != i) _exit(127);
  start_program(run);
}

/* The job's directory in `cwd`: work/tN (*test N), or prog/ for a build (*test 0); 0, or -1
 * when it could not be made (answered). */
static int job_dir(const struct job_message *msg, char cwd[PATH_MAX], unsigned *test) {
  *test = 0;
  if (!msg->in_test) {
    snprintf(cwd, PATH_MAX, "%s", R.prog);
    return 0;
  }
  *test = ++R.counter;
  test_dir(cwd, PATH_MAX, *test);
  if (make_test_dir(cwd) == 0) return 0;
  replyf(msg->id, "work dir: %s", strerror(errno));
  remove_tree(AT_FDCWD, cwd, 0);
  return -1;
}

/* Start a job from its message; whether it took the descriptors. */
static int start_job(const struct job_message *msg, const int fds[3], int nfds) {
  if (nfds != 3) {
    reply(R.ctl, msg->id, "expected 3 pipes");
    return 0;
  }
  struct job *job = NULL;
  for (int i = 0; i < MAX_JOBS && job == NULL; i++)
    if (R.jobs[i].pid == 0) job = &R.jobs[i];
  if (job == NULL) {
    reply(R.ctl, msg->id, "too many jobs at once");
    return 0;
  }
  char cwd[PATH_MAX];
  unsigned test;
  if (job_dir(msg, cwd, &test) != 0) return 0;
  int err[2];
  if (pipe2(err, O_CLOEXEC) != 0) {
    replyf(msg->id, "pipe: %s", strerror(errno));
    if (test) remove_tree(AT_FDCWD, cwd, 0);
    return 0;
  }
  /* RLIMIT_CPU's whole seconds: the limit rounded up (start_program makes it at least 1). */
  rlim_t cpu = (rlim_t)msg->cpu_s;
  if ((double)cpu < msg->cpu_s) cpu++;
  struct run run = {
      .mode = R.bwrap ? "u" : "p",
      .cwd = cwd,
      .cpu = cpu,
      .as = msg->as,
      .fsize = msg->fsize,
      .nofile = msg->nofile,
      .stack = msg->stack,
      .nproc = msg->nproc,
      .argv = msg->argv,
  };
  pid_t pid = fork();
  if (pid == 0) {
    run.envp = job_environment(msg->env, msg->nenv);
    job_child(fds, err[1], &run);
  }
  int saved = errno;
  close(err[1]);
  if (pid < 0) {
    close(err[0]);
    replyf(msg->id, "fork: %s", strerror(saved));
    if (test) remove_tree(AT_FDCWD, cwd, 0);
    return 0;
  }
  for (int i = 0; i < 3; i++) close(fds[i]);
  double started = now();
  *job = (struct job){
      .id = msg->id,
      .pid = pid,
      .err_r = err[0],
      .seal = msg->seal,
      .started = started,
      .deadline = started + msg->timeout_s,
      .test = test,
  };
  return 1;
}

static void finish(struct ended *e) {
  char failure[4096 + 1], error[4200], tdir[PATH_MAX];
  const char *why = NULL;
  fcntl(e->job.err_r, F_SETFL, O_NONBLOCK);
  ssize_t got = read(e->job.err_r, failure, sizeof failure - 1);
  close(e->job.err_r);
  if (got > 0) {
    failure[got] = '\0';
    snprintf(error, sizeof error, "job setup: %s", failure);
    why = error;
  }
  if (e->job.seal && seal() != 0) {
    snprintf(error, sizeof error, "seal: %s", strerror(errno));
    why = error;
  }
  if (e->job.test) {
    test_dir(tdir, sizeof tdir, e->job.test);
    remove_tree(AT_FDCWD, tdir, 0);
  }
  struct report r = {.len = 0};
  const struct rusage *u = &e->usage;
  double cpu = (double)u->ru_utime.tv_sec + (double)u->ru_utime.tv_usec / 1e6 +
               (double)u->ru_stime.tv_sec + (double)u->ru_stime.tv_usec / 1e6;
  put(&r, "{\"op\":\"done\",\"id\":%ld,\"status\":%d,\"timed_out\":%s,\"killed\":%s,", e->job.id,
      e->status, e->job.timed_out ? "true" : "false", e->job.killed ? "true" : "false");
  put(&r, "\"cpu_s\":%.6f,\"maxrss_kb\":%ld,\"wall_s\":%.6f,\"error\":", cpu, u->ru_maxrss,
      e->at - e->job.started);
  put_string(&r, why);
  put(&r, "}");
  send_report(R.ctl, &r, e->job.id);
}

/* Collect every child that exited; report the jobs among them once whatever they left
 * behind is dead. */
static void reap(void) {
  static struct ended ended[MAX_JOBS];
  int count = 0;
  for (;;) {
    int status;
    struct rusage usage;
    pid_t pid = wait4(-1, &status, WNOHANG, &usage);
    if (pid < 0 && errno == EINTR) continue;
    if (pid <= 0) break;
    struct job *job = job_by_pid(pid);
    if (job == NULL) continue; /* an orphan killed, or one that ended on its own */
    ended[count] = (struct ended){*job, status, usage, now()};
    job->pid = 0;
    count++;
  }
  if (count == 0) return;
  for (int i = 0; i < count; i++) kill(-ended[i].job.pid, SIGKILL); /* its group goes too */
  settle();
  for (int i = 0; i < count; i++) finish(&ended[i]);
}

static void check_deadlines(void) {
  double t = now();
  for (int i = 0; i < MAX_JOBS; i++) {
    struct job *job = &R.jobs[i];
    if (job->pid != 0 && !job->timed_out && t >= job->deadline) {
      job->timed_out = 1;
      kill_job(job);
    }
  }
}

/* Milliseconds until the loop must look again: the nearest deadline, or the next scan for
 * escaped processes (five a second while anything runs); -1 when idle. */
static int next_timeout_ms(int orphans) {
  if (!active_jobs() && !orphans) return -1;
  double wake = R.next_scan;
  for (int i = 0; i < MAX_JOBS; i++)
    if (R.jobs[i].pid != 0 && !R.jobs[i].timed_out && R.jobs[i].deadline < wake)
      wake = R.jobs[i].deadline;
  double left = wake - now();
  return left <= 0 ? 0 : left >= SCAN_S ? (int)(SCAN_S * 1000) + 1 : (int)(left * 1000) + 1;
}

/* -- messages ---------------------------------------------------------------------------- */
static void handle(ssize_t len, int fds[3], int nfds) {
  static char *f[MAX_FIELDS + 1];
  int n = len < MAX_MESSAGE ? split_fields(message, (size_t)len, f) : -1;
  long id = 0;
  int taken = 0;
  if (n < 2 || parse_id(f[1], &id) != 0) {
    /* A bad message must not end the item's sandbox. */
    fprintf(stderr, "runner: bad message of %zd bytes\n", len);
  } else if (strcmp(f[0], "job") == 0) {
    struct job_message msg;
    const char *bad = parse_job(f, n, &msg);
    if (bad != NULL)
      reply(R.ctl, id, bad);
    else
      taken = start_job(&msg, fds, nfds);
  } else if (strcmp(f[0], "seal") == 0 && n == 2) {
    if (seal() != 0)
      replyf(id, "seal: %s", strerror(errno));
    else
      reply(R.ctl, id, NULL);
  } else if (strcmp(f[0], "kill") == 0 && n == 2) {
    struct job *job = job_by_id(id);
    if (job != NULL) {
      job->killed = 1;
      kill_job(job);
    }
  } else {
    reply(R.ctl, id, "bad message");
  }
  if (!taken)
    for (int i = 0; i < nfds; i++) close(fds[i]);
}

/* -- start and loop ---------------------------------------------------------------------- */
static _Noreturn void fatal(const char *what) {
  struct report r = {.len = 0};
  char text[1024];
  snprintf(text, sizeof text, "%s: %s", what, strerror(errno));
  put(&r, "{\"op\":\"fatal\",\"error\":");
  put_string(&r, text);
  put(&r, "}");
  send_report(R.ctl, &r, 0);
  fprintf(stderr, "runner: %s\n", text);
  exit(1);
}

static void setup(rlim_t workdir_bytes, rlim_t inodes) {
  char path[PATH_MAX + 8];
  int entries = 0;
  while (environ[entries] != NULL) entries++;
  errno = E2BIG;
  if (entries > MAX_ENV) fatal("the runner's environment");
  put_file("/proc/self/oom_score_adj", "1000"); /* taken before the server */
  signal(SIGINT, SIG_IGN);
  signal(SIGPIPE, SIG_IGN);
  if (R.bwrap) {
    const char *what;
    if (own_user_namespace(CLONE_NEWNS, &what) != 0) fatal(what);
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) fatal("mount /");
    char options[128];
    snprintf(options, sizeof options, "size=%llu,nr_inodes=%llu,mode=0700",
             (unsigned long long)workdir_bytes, (unsigned long long)inodes);
    if (mount("tmpfs", R.work, "tmpfs", MS_NOSUID | MS_NODEV, options) != 0)
      fatal("mount work");
  } else {
    /* Orphans of the programs come back to the runner, which kills them. */
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) fatal("prctl SUBREAPER");
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) fatal("prctl PDEATHSIG");
    if (mkdir(R.work, 0700) != 0 && errno != EEXIST) fatal(R.work);
  }
  snprintf(path, sizeof path, "%s/tmp", R.work);
  if (mkdir(path, 0700) != 0 && errno != EEXIST) fatal(path);
  /* Programs must not touch the runner: no ptrace, no /proc/1/mem, no core dumps. */
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) fatal("prctl DUMPABLE");
}

/* The server gone: every job and whatever escaped killed; PID 1's exit kills the rest. */
static void shutdown_jobs(const int fds[3], int nfds) {
  for (int i = 0; i < nfds; i++) close(fds[i]);
  for (int i = 0; i < MAX_JOBS; i++)
    if (R.jobs[i].pid != 0) kill_job(&R.jobs[i]);
  kill_orphans(0);
}

static int loop(void) {
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, NULL);
  int sfd = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC);
  if (sfd < 0) fatal("signalfd");
  struct report ready = {.len = 0};
  put(&ready, "{\"op\":\"ready\",\"pid\":%d,\"runner\":\"native\"}", (int)getpid());
  send_report(R.ctl, &ready, 0);
  int orphans = 0;
  for (;;) {
    struct pollfd polled[2] = {{R.ctl, POLLIN, 0}, {sfd, POLLIN, 0}};
    int ready_fds = poll(polled, 2, next_timeout_ms(orphans));
    if (ready_fds < 0 && errno != EINTR) fatal("poll");
    if (ready_fds > 0 && polled[1].revents) {
      struct signalfd_siginfo info;
      while (read(sfd, &info, sizeof info) > 0) {
      }
    }
    if (ready_fds > 0 && polled[0].revents) {
      int fds[3], nfds;
      ssize_t len = receive_message(R.ctl, message, fds, &nfds);
      if (len == 0 || (len < 0 && errno != EINTR && errno != EAGAIN)) {
        shutdown_jobs(fds, nfds);
        return 0;
      }
      if (len > 0) handle(len, fds, nfds);
    }
    reap();
    check_deadlines();
    if (now() >= R.next_scan) {
      orphans = kill_orphans(0);
      R.next_scan = now() + SCAN_S;
    }
  }
}

int main(int argc, char **argv) {
  /* launch serve MODE ROOT CONTROL_FD WORKDIR_BYTES INODES -- FILE... */
  unsigned long long ctl, workdir_bytes, inodes;
  if (argc < 8 || strcmp(argv[1], "serve") != 0 || strcmp(argv[7], "--") != 0 ||
      (strcmp(argv[2], "bwrap") != 0 && strcmp(argv[2], "none") != 0) ||
      strlen(argv[3]) + sizeof "/prog" > sizeof R.prog ||
      parse_count(argv[4], INT_MAX, &ctl) != 0 ||
      parse_count(argv[5], MAX_LIMIT, &workdir_bytes) != 0 ||
      parse_count(argv[6], MAX_LIMIT, &inodes) != 0) {
    fprintf(stderr, "usage: launch serve bwrap|none ROOT CONTROL_FD WORKDIR_BYTES INODES -- "
                    "FILE...\n");
    return 2;
  }
  R.bwrap = strcmp(argv[2], "bwrap") == 0;
  R.root = argv[3];
  R.ctl = (int)ctl;
  R.files = argv + 8;
  R.nfiles = argc - 8;
  snprintf(R.prog, sizeof R.prog, "%s/prog", R.root);
  snprintf(R.work, sizeof R.work, "%s/work", R.root);
  /* Every descriptor of the runner is close-on-exec; jobs get only their own. */
  fcntl(R.ctl, F_SETFD, FD_CLOEXEC);
  setup((rlim_t)workdir_bytes, (rlim_t)inodes);
  return loop();
}
